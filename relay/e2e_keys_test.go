package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// A key is checked before every request of an open WebSocket, not only at
// its handshake: a revoked or expired key's next turn gets an error event
// Codex shows, and the socket closes. Each turn counts in the key's use.
func TestKeyIsCheckedOnEveryWebSocketTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
	require.NoError(t, err)
	c := h.dialWSWith(sessionS, rootT, http.Header{"Authorization": {"Bearer " + secret}})
	for range 2 {
		typ, _ := lastEvent(c.turn(responseRequest("hello")))
		require.Equal(t, "response.completed", typ)
	}
	assert.Eventually(t, func() bool {
		counted, err := h.store.ClientKey(ctx, k.ID)
		return err == nil && counted.RequestCount == 2
	}, time.Minute, 10*time.Millisecond, "each turn counts, as its request log row does; the handshake is no request")

	before := len(h.responseRecords(rootT))
	_, err = h.store.RevokeClientKey(ctx, k.ID)
	require.NoError(t, err)
	events := c.turn(responseRequest("still allowed?"))
	ev := events[len(events)-1]
	assert.Equal(t, "error", ev["type"])
	assert.EqualValues(t, 401, ev["status"])
	assert.Equal(t, "invalid_api_key", ev["error"].(map[string]any)["code"])
	assert.Len(t, h.responseRecords(rootT), before, "nothing went upstream")
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, _, err = c.conn.Read(rctx)
	assert.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "the socket closes: %v", err)
}

// An expired key stops at its next turn too, without any write to the key.
func TestExpiredKeyStopsAnOpenWebSocket(t *testing.T) {
	t.Parallel()
	clk := newTestClock(time.Now())
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now = clk.Now }, simAccount("a1", "org-a"))
	ctx := context.Background()
	_, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "short", ExpiresAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	c := h.dialWSWith(sessionS, rootT, http.Header{"Authorization": {"Bearer " + secret}})
	typ, _ := lastEvent(c.turn(responseRequest("hello")))
	require.Equal(t, "response.completed", typ)
	clk.Add(2 * time.Hour)
	events := c.turn(responseRequest("later"))
	assert.Equal(t, "error", events[len(events)-1]["type"])
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, _, err = c.conn.Read(rctx)
	assert.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err))
}

// Keyless mode is a choice made once, by creating no key: a keyless socket
// opened before the first key is refused at its next turn, and revoking
// every key never re-opens the relay.
func TestKeylessModeEndsForGood(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	c := h.dialWS(sessionS, rootT)
	typ, _ := lastEvent(c.turn(responseRequest("hello")))
	require.Equal(t, "response.completed", typ, "keyless loopback is served")

	k, _, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "first"})
	require.NoError(t, err)
	events := c.turn(responseRequest("still keyless?"))
	assert.Equal(t, "error", events[len(events)-1]["type"], "the open keyless socket is refused once a key exists")
	_, err = h.store.RevokeClientKey(ctx, k.ID)
	require.NoError(t, err)

	b, _ := json.Marshal(responseRequest("hi"))
	code, _, body := h.raw("POST", "/backend-api/codex/responses", http.Header{"Content-Type": {"application/json"}}, b)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, resp, err := websocket.Dial(dctx, "ws"+h.srv.URL[len("http"):]+"/backend-api/codex/responses", nil)
	require.Error(t, err)
	if resp != nil {
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	}
}

// In keyless mode a web page on the operator's machine cannot spend the
// pool or read answers: requests a browser made (a foreign Origin, a
// cross-site fetch, a Host that is no loopback name, as DNS rebinding
// gives) are refused; Codex's own requests are not.
func TestKeylessRefusesWebPages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	b, _ := json.Marshal(responseRequest("hi"))
	for _, tc := range []struct {
		name string
		hdr  http.Header
		host string
		want int
	}{
		{"codex", nil, "", http.StatusOK},
		{"a loopback page", http.Header{"Origin": {"http://localhost:3000"}}, "", http.StatusOK},
		{"a foreign page", http.Header{"Origin": {"https://evil.example"}}, "", http.StatusForbidden},
		{"an opaque origin", http.Header{"Origin": {"null"}}, "", http.StatusForbidden},
		{"a cross-site fetch", http.Header{"Sec-Fetch-Site": {"cross-site"}}, "", http.StatusForbidden},
		{"DNS rebinding", nil, "evil.example:2455", http.StatusForbidden},
		{"localhost by name", nil, "localhost", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Thread-Id", rootT)
			for k, v := range tc.hdr {
				req.Header[k] = v
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body := readAllString(t, resp)
			assert.Equal(t, tc.want, resp.StatusCode, body)
			if tc.want == http.StatusForbidden {
				assert.Contains(t, body, "browser_request_refused")
			}
		})
	}

	// The WebSocket handshake too. A page whose host name resolves to this
	// machine (DNS rebinding) sends an Origin that matches its Host, which
	// passes the WebSocket library's own origin check; the relay refuses it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, strings.TrimPrefix(h.srv.URL, "http://"))
	}}}
	_, resp, err := websocket.Dial(ctx, "ws://evil.example:2455/backend-api/codex/responses",
		&websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"Origin": {"http://evil.example:2455"}}})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	c := h.dialWS(sessionS, rootT) // Codex's own handshake is served
	typ, _ := lastEvent(c.turn(responseRequest("hello")))
	assert.Equal(t, "response.completed", typ)
}

// Issue 36's probe: a request refused on its headers (no key, a wrong key,
// no route), whose client declares a body and sends one byte of it, is
// answered at once and its connection closed; before, net/http waited for
// the rest of the body before answering, and 300 such connections held a
// goroutine and a file descriptor each, forever. A keyed request that
// sends its body whole keeps its connection for the next one.
func TestRefusedOnItsHeadersWithABodyStillComing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	_, secret, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "k"})
	require.NoError(t, err)
	addr := strings.TrimPrefix(h.srv.URL, "http://")
	for _, c := range []struct {
		name, path, auth string
		status           int
	}{
		{"no key", "/v1/responses", "", http.StatusUnauthorized},
		{"a wrong key", "/backend-api/codex/responses", "Authorization: Bearer crk_wrong\r\n", http.StatusUnauthorized},
		{"no route", "/v1/nowhere", "Authorization: Bearer " + secret + "\r\n", http.StatusNotFound},
		{"no route, no key", "/backend-api/codex/elsewhere", "", http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
			_, err = conn.Write([]byte("POST " + c.path + " HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n" + c.auth +
				"Content-Length: 1000\r\n\r\n{"))
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err, "answered without the rest of the body")
			assert.Equal(t, c.status, resp.StatusCode)
			assert.True(t, resp.Close, "the connection is closed after the answer")
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
			_, err = conn.Read(make([]byte, 1))
			assert.ErrorIs(t, err, io.EOF, "the relay closed the connection")
		})
	}

	// A keyed request sent whole keeps its connection alive.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	var conns []string
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/responses", strings.NewReader(`{"model":"gpt-5.4","input":"hi"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Conn.LocalAddr().String()) },
		}))
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.False(t, resp.Close, "a request whose body was read keeps its connection")
	}
	require.Len(t, conns, 2)
	assert.Equal(t, conns[0], conns[1], "the second request reused the first's connection")
}

// Wrong client keys are limited per client address: the first few are
// answered 401, the rest 429 with Retry-After (still invalid_api_key), on
// /v1 and /backend-api alike, until the address's next attempt is due. A
// valid key is never slowed or refused, from that address either; another
// address, and requests without a key, are not affected.
func TestWrongClientKeysAreLimitedPerAddress(t *testing.T) {
	t.Parallel()
	clk := newTestClock(time.Now())
	reg := prometheus.NewRegistry()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now, c.Registry = clk.Now, reg }, simAccount("a1", "org-a"))
	_, secret, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "laptop"})
	require.NoError(t, err)
	body, err := json.Marshal(responseRequest("hello"))
	require.NoError(t, err)
	send := func(addr, path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.RemoteAddr = addr
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		h.relay.ServeHTTP(rec, req)
		return rec
	}
	const flooder = "192.0.2.10:40000"
	paths := []string{"/v1/responses", "/backend-api/codex/responses"}
	codes := map[int]int{}
	for i := range 1000 {
		rec := send(flooder, paths[i%2], "crk_guess"+strings.Repeat("x", i%7)+string(rune('a'+i%26)))
		codes[rec.Code]++
		if i == 5 {
			require.Equal(t, http.StatusTooManyRequests, rec.Code)
			assert.Equal(t, "30", rec.Header().Get("Retry-After"))
			assert.Contains(t, rec.Body.String(), `"code":"invalid_api_key"`)
			assert.Contains(t, rec.Body.String(), "too many wrong client keys came from your address: try again in 30 s")
		}
	}
	assert.Equal(t, map[int]int{http.StatusUnauthorized: 5, http.StatusTooManyRequests: 995}, codes)
	assert.Equal(t, 5.0, metricValue(t, reg, "codex_relay_client_key_rejections_total", map[string]string{"answer": "unauthorized"}))
	assert.Equal(t, 995.0, metricValue(t, reg, "codex_relay_client_key_rejections_total", map[string]string{"answer": "limited"}))

	for _, p := range paths {
		rec := send(flooder, p, secret)
		require.Equal(t, http.StatusOK, rec.Code, "a valid key from the flooding address is served: %s", rec.Body.String())
		assert.Contains(t, rec.Body.String(), "response.completed")
	}
	assert.Equal(t, http.StatusUnauthorized, send("192.0.2.11:1", paths[0], "crk_wrong").Code, "another address has its own budget")
	rec := send(flooder, paths[0], "")
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "no key: told to send one, uncounted")
	assert.Contains(t, rec.Body.String(), "send a relay client key")
	for range 10 {
		require.Equal(t, http.StatusUnauthorized, send("192.0.2.12:1", paths[0], "").Code)
	}
	assert.Equal(t, http.StatusUnauthorized, send("192.0.2.12:1", paths[0], "crk_wrong").Code, "requests without a key are no attempts")

	clk.Add(30 * time.Second)
	assert.Equal(t, http.StatusUnauthorized, send(flooder, paths[1], "crk_wrong").Code, "one attempt more after the refill period")
	assert.Equal(t, http.StatusTooManyRequests, send(flooder, paths[1], "crk_wrong").Code)

	// The WebSocket handshake is limited the same way (here from loopback).
	for range 5 {
		code, _, _ := h.raw(http.MethodPost, "/v1/responses", http.Header{"Authorization": {"Bearer crk_wrong"}}, body)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.codexBaseURL(), "http")+"/responses",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer crk_wrong"}}})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "30", resp.Header.Get("Retry-After"))
	c := h.dialWSWith(sessionS, rootT, http.Header{"Authorization": {"Bearer " + secret}})
	typ, _ := lastEvent(c.turn(responseRequest("hello")))
	assert.Equal(t, "response.completed", typ, "a valid key opens its socket from loopback too")
}
