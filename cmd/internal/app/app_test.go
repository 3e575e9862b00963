package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web"
)

// openTestStore opens a migrated SQLite store in a temp folder.
func openTestStore(t *testing.T) *store.Store {
	t.Helper()
	loc, err := store.ParseLocation("sqlite:" + filepath.Join(t.TempDir(), "relay.db"))
	require.NoError(t, err)
	st, err := OpenStore(context.Background(), loc, []byte("a-secret-key-for-this-test"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// The relay New assembles answers behind the web front: the operations
// endpoints and the admin API (with the admin token given), the client
// routes (the relay's own answer to a client without a key), the metrics
// of the process and of the HTTP layer. Serve ends with its context,
// after the drain, and closes the listener.
func TestNewServesTheRelayBehindItsWebFront(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var logs logbuf.Buffer
	r, err := New(ln, Options{Store: openTestStore(t), Secret: []byte("a-secret-key-for-this-test"), AdminTokenHash: web.HashAdminToken("an-admin-token-for-tests"),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), ReadHeaderTimeout: 3 * time.Second})
	require.NoError(t, err)
	assert.Contains(t, logs.String(), "codex-relay listening")
	assert.Contains(t, logs.String(), ln.Addr().String())
	assert.Equal(t, 3*time.Second, r.hs.ReadHeaderTimeout, "the header deadline given")
	assert.Equal(t, MaxHeaderBytes, r.hs.MaxHeaderBytes)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx, 5*time.Second) }()

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func(method, path, token string) (int, string) {
		req, err := http.NewRequest(method, "http://"+r.Addr().String()+path, strings.NewReader("{}"))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, _ := get(http.MethodGet, "/healthz", "")
	assert.Equal(t, http.StatusOK, status)
	status, _ = get(http.MethodGet, "/readyz", "")
	assert.Equal(t, http.StatusOK, status)
	status, _ = get(http.MethodGet, "/api/v1/accounts", "")
	assert.Equal(t, http.StatusUnauthorized, status, "the admin API needs the token")
	status, _ = get(http.MethodGet, "/api/v1/accounts", "an-admin-token-for-tests")
	assert.Equal(t, http.StatusOK, status, "the admin token's hash was given")
	advertised := `"address":"http://` + ln.Addr().String() + `"`
	assert.Eventually(t, func() bool {
		_, body := get(http.MethodGet, "/api/v1/replicas", "an-admin-token-for-tests")
		return strings.Contains(body, advertised)
	}, 10*time.Second, 50*time.Millisecond, "the replica registers at the listener's address (its heartbeat runs)")
	status, body := get(http.MethodPost, "/backend-api/codex/responses", "")
	assert.Equal(t, http.StatusServiceUnavailable, status, body)
	assert.Contains(t, body, `"code":"no_accounts"`, "the relay answers the client routes (its pool is empty)")
	big, err := http.NewRequest(http.MethodPost, "http://"+r.Addr().String()+"/v1/responses", strings.NewReader("{}"))
	require.NoError(t, err)
	big.Header.Set("X-Codex-Padding", strings.Repeat("a", MaxHeaderBytes+8192))
	resp, err := client.Do(big)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode, "headers over MaxHeaderBytes are refused, never forwarded")
	status, body = get(http.MethodGet, "/metrics", "")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, "go_goroutines", "the Go collector is registered")
	assert.Contains(t, body, `route="/backend-api/*"`, "the web layer's middleware counted the client route")

	cancel()
	select {
	case err := <-served:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	assert.Contains(t, logs.String(), "shutting down")
	_, err = net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	assert.Error(t, err, "the listener is closed")
}

func TestNewNeedsAListenerAndAStore(t *testing.T) {
	t.Parallel()
	_, err := New(nil, Options{Store: openTestStore(t)})
	assert.Error(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = New(ln, Options{})
	assert.Error(t, err)
}

// A secret derives one key per purpose, the same on every replica; no
// secret, no key.
func TestDerivedKey(t *testing.T) {
	t.Parallel()
	secret := []byte("a-secret-key-for-this-test")
	assert.Len(t, derivedKey(secret, hopKeyPurpose), 32)
	assert.Equal(t, derivedKey(secret, hopKeyPurpose), derivedKey([]byte("a-secret-key-for-this-test"), hopKeyPurpose))
	assert.NotEqual(t, derivedKey(secret, hopKeyPurpose), derivedKey(secret, sessionKeyPurpose))
	assert.Nil(t, derivedKey(nil, hopKeyPurpose))
}

func TestAdvertiseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr *net.TCPAddr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2455}, "http://127.0.0.1:2455"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 5}, "http://[::1]:5"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 2455}, ""},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 2455}, ""},
		{&net.TCPAddr{Port: 2455}, ""},
	} {
		assert.Equal(t, tc.want, advertiseURL(tc.addr), "%v", tc.addr)
	}
}

// The console's Sign in with ChatGPT goes to Options.AuthURL (here the
// sim's auth server), and a sign-in still waiting for its approval when
// Serve's context ends is ended with it: Serve returns only after its
// goroutine, which records why in the audit log.
func TestServeEndsTheConsoleSignIns(t *testing.T) {
	t.Parallel()
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{{ID: "alice", Kind: sim.KindChatGPT, AccessToken: "at", RefreshToken: "rt", ChatGPTAccountID: "cg-alice"}}})
	defer upstream.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	st := openTestStore(t)
	r, err := New(ln, Options{Store: st, Secret: []byte("a-secret-key-for-this-test"), AdminTokenHash: web.HashAdminToken("an-admin-token-for-tests"),
		AuthURL: upstream.URL})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx, 5*time.Second) }()

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	base := "http://" + r.Addr().String()
	csrf := regexp.MustCompile(`name="_csrf" value="([^"]+)"`)
	page := func(path string) string {
		resp, err := client.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	post := func(path string, form url.Values, from string) string {
		form.Set("_csrf", csrf.FindStringSubmatch(page(from))[1])
		resp, err := client.PostForm(base+path, form)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		return string(b)
	}
	post("/admin/login", url.Values{"token": {"an-admin-token-for-tests"}, "next": {"/admin/accounts"}}, "/admin/login")
	signIn := post("/admin/accounts/signin", url.Values{}, "/admin/accounts")
	assert.Contains(t, signIn, upstream.URL+"/codex/device", "the sign-in is the sim's")
	require.Len(t, upstream.DeviceLogins(), 1, "a code was asked of the sim")

	cancel()
	select {
	case err := <-served:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	entries, _, err := st.AuditLog(context.Background(), store.AuditFilter{Action: "account.signin"})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, "failed: the relay stopped before the sign-in was approved; start again", entries[0].Detail)
}
