package web

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// testBodyReadTimeout is the body read deadline of TestBodyReadDeadline's
// server: short, so a cut comes quickly, and long enough for the in-time
// cases on a loaded machine.
const testBodyReadTimeout = time.Second

// rawRequest writes head and then part of a body on a new connection to
// addr and stops sending, as a client trickling its body does; it returns
// the answer and whether the server then closed the connection.
func rawRequest(t *testing.T, addr, head, part string) (*http.Response, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	// Far past the server's deadline: only a server that never cuts the
	// body runs into it.
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*testBodyReadTimeout)))
	_, err = io.WriteString(conn, head+part)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "the server answers within its body deadline")
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	_, err = br.ReadByte()
	var ne net.Error
	timedOut := errors.As(err, &ne) && ne.Timeout()
	return resp, err != nil && !timedOut
}

// A client sending a body slower than the body deadline is cut: answered
// 408 (or the answer it had coming before its body mattered) and
// disconnected. Normal and slow-but-in-time bodies are served, the client
// routes are left to bound their own reads, and a handler that runs on past
// the deadline, after reading its body or with none, keeps its context.
func TestBodyReadDeadline(t *testing.T) {
	t.Parallel()
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	fr := &fakeRelay{inflight: map[string]int{}}
	// probed reports, per account probed, whether its request's context
	// outlived the body deadline. Read-only after construction.
	probed := map[string]chan error{"acc_form": make(chan error, 1), "acc_bodiless": make(chan error, 1)}
	// The client routes read their bodies under their own rules.
	client := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: fr, SessionKey: []byte("test session key"),
		BodyReadTimeout: testBodyReadTimeout, Client: client,
		// The probe outlives the body deadline, and reports whether the
		// request's context survived it.
		Probe: func(ctx context.Context, id string) (store.Account, error) {
			select {
			case <-time.After(2 * testBodyReadTimeout):
				probed[id] <- nil
				return store.Account{ID: id, Label: "probed", Status: store.StatusActive}, nil
			case <-ctx.Done():
				probed[id] <- ctx.Err()
				return store.Account{}, ctx.Err()
			}
		}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close) // after the parallel subtests
	addr := ts.Listener.Addr().String()

	t.Run("slow bodies are cut", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name, head, part string
			status           int
		}{
			{"console login", "POST /admin/login HTTP/1.1\r\nHost: relay\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 64\r\n\r\n",
				"token=cra_", http.StatusRequestTimeout},
			{"admin api, chunked", "POST /api/v1/accounts HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + testAdminToken +
				"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", "6\r\n{\"api_\r\n", http.StatusRequestTimeout},
			{"admin api without token", "POST /api/v1/accounts HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n",
				`{"api_`, http.StatusUnauthorized},
			{"unknown route", "POST /nowhere HTTP/1.1\r\nHost: relay\r\nContent-Length: 64\r\n\r\n", "abc", http.StatusNotFound},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				resp, closed := rawRequest(t, addr, tc.head, tc.part)
				assert.Equal(t, tc.status, resp.StatusCode)
				assert.True(t, closed, "the connection is closed after the answer")
			})
		}
	})

	t.Run("a normal body is served", func(t *testing.T) {
		t.Parallel()
		code, body, raw := callURL(t, ts.URL+"/api/v1/keys", `{"name":"normal"}`)
		require.Equal(t, http.StatusCreated, code, raw)
		assert.NotEmpty(t, body["key"])
	})

	t.Run("a slow body within the deadline is served", func(t *testing.T) {
		t.Parallel()
		pr, pw := io.Pipe()
		go func() {
			// Three pieces, a twentieth of the deadline apart: slow, but in time.
			for _, p := range []string{`{"na`, `me":"sl`, `ow"}`} {
				_, _ = io.WriteString(pw, p)
				time.Sleep(testBodyReadTimeout / 20)
			}
			pw.Close()
		}()
		code, _, raw := callURL(t, ts.URL+"/api/v1/keys", pr)
		assert.Equal(t, http.StatusCreated, code, raw)
	})

	t.Run("client routes have no body deadline", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*testBodyReadTimeout)))
		_, err = io.WriteString(conn, "POST /v1/responses HTTP/1.1\r\nHost: relay\r\nContent-Length: 6\r\n\r\nabc")
		require.NoError(t, err)
		<-time.After(testBodyReadTimeout * 3 / 2) // past the deadline the other routes have
		_, err = io.WriteString(conn, "def")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})

	t.Run("handlers outliving the deadline keep their context", func(t *testing.T) {
		t.Parallel()
		b := newBrowser(t, srv)
		b.login()
		form := func() *http.Request {
			req, err := http.NewRequest(http.MethodPost, ts.URL+"/admin/accounts/acc_form/probe", strings.NewReader(url.Values{"_csrf": {b.csrf}}.Encode()))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for _, c := range b.cookies {
				req.AddCookie(c)
			}
			return req
		}
		bodiless := func() *http.Request {
			req, err := http.NewRequest(http.MethodPost, ts.URL+"/api/v1/accounts/acc_bodiless/probe", nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			return req
		}
		cases := []struct {
			name, account string
			req           func() *http.Request
			status        int
		}{
			{"console form, body read first", "acc_form", form, http.StatusSeeOther},
			{"admin api, no body", "acc_bodiless", bodiless, http.StatusOK},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
				defer client.CloseIdleConnections()
				resp, err := client.Do(tc.req())
				require.NoError(t, err)
				resp.Body.Close()
				require.NoError(t, <-probed[tc.account], "the request's context outlives the body deadline")
				assert.Equal(t, tc.status, resp.StatusCode)
			})
		}
	})
}

// callURL posts a JSON body to a live server with the admin token.
func callURL(t *testing.T, u string, body any) (int, map[string]any, string) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case io.Reader:
		r = b
	}
	req, err := http.NewRequest(http.MethodPost, u, r)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, string(raw)
}

// oversized is a request with a body over the limit, its length declared
// or not (chunked).
func oversized(method, path, contentType, body string, chunked bool) *http.Request {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	if chunked {
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	return req
}

// Every body over the limit is answered 413, whether its length is declared
// or it comes chunked: in the API's error shape on /api/v1, as an error page
// on the console.
func TestOversizedBodiesAre413(t *testing.T) {
	t.Parallel()
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	big := strings.Repeat("a", maxAPIBody+1)
	form := func() string { return url.Values{"_csrf": {b.csrf}, "label": {big}}.Encode() }
	for _, chunked := range []bool{false, true} {
		name := map[bool]string{false: "content-length", true: "chunked"}[chunked]
		t.Run("api "+name, func(t *testing.T) {
			req := oversized(http.MethodPost, "/api/v1/accounts", "application/json", `{"label":"`+big+`"}`, chunked)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
			var out map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
			code, _ := errorOf(t, out)
			assert.Equal(t, "request_too_large", code)
		})
		t.Run("console login "+name, func(t *testing.T) {
			rec := b.do(oversized(http.MethodPost, "/admin/login", "application/x-www-form-urlencoded", "token="+big, chunked))
			assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
			assert.Contains(t, rec.Body.String(), "too large")
		})
		t.Run("console form "+name, func(t *testing.T) {
			rec := b.do(oversized(http.MethodPost, "/admin/keys", "application/x-www-form-urlencoded", form(), chunked))
			assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
			assert.Contains(t, rec.Body.String(), "too large")
		})
		t.Run("console multipart "+name, func(t *testing.T) {
			body := "--X\r\nContent-Disposition: form-data; name=\"_csrf\"\r\n\r\n" + b.csrf + "\r\n--X\r\n" +
				"Content-Disposition: form-data; name=\"auth_json\"; filename=\"auth.json\"\r\n\r\n" + big + "\r\n--X--\r\n"
			rec := b.do(oversized(http.MethodPost, "/admin/accounts/import", "multipart/form-data; boundary=X", body, chunked))
			assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
			assert.Contains(t, rec.Body.String(), "too large")
		})
	}
	keys, err := s.ClientKeys(context.Background())
	require.NoError(t, err)
	assert.Empty(t, keys, "no oversized form created anything")
}
