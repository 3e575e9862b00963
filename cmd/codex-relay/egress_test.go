package main

import (
	"context"
	"encoding/base64"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// proxyLog records what a loopback forward proxy carried: "METHOD /path"
// of each request (the upstreams here are plain http, so requests are
// forwarded, not tunnelled). Safe for concurrent use.
type proxyLog struct {
	mu   sync.Mutex
	seen []string // guarded by mu
}

func (p *proxyLog) add(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, s)
}

func (p *proxyLog) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// startRecordingProxy runs goproxy on loopback for clients sending
// user:pass, and returns its URL with the credentials.
func startRecordingProxy(t *testing.T, user, pass string) (string, *proxyLog) {
	t.Helper()
	rec := &proxyLog{}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.Tr = &http.Transport{Proxy: nil}
	gp.ConnectDial = nil
	gp.OnRequest().DoFunc(func(r *http.Request, _ *goproxy.ProxyCtx) (*http.Request, *http.Response) {
		if r.Header.Get("Proxy-Authorization") != want {
			return r, goproxy.NewResponse(r, "text/plain", http.StatusProxyAuthRequired, "proxy credentials required")
		}
		rec.add(r.Method + " " + r.URL.Path)
		return r, nil
	})
	gp.OnRequest().HandleConnectFunc(func(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		rec.add("CONNECT " + host)
		return goproxy.RejectConnect, host // the upstreams here are plain http
	})
	srv := httptest.NewServer(gp)
	t.Cleanup(func() { srv.Close(); gp.Tr.CloseIdleConnections() })
	u, _ := url.Parse(srv.URL)
	u.User = url.UserPassword(user, pass)
	return u.String(), rec
}

// The proxy of accounts that name none: the environment's (as
// http.ProxyFromEnvironment reads it, loopback never proxied) with -env-proxy
// use, none with ignore.
func TestEnvironmentProxy(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HTTPS_PROXY": "http://envproxy.example:3128", "no_proxy": "internal.example"}
	c := cli{getenv: func(k string) string { return env[k] }}
	req := func(u string) *http.Request { r, _ := http.NewRequest(http.MethodGet, u, nil); return r }

	pick, err := environmentProxy(c, "use")
	require.NoError(t, err)
	require.NotNil(t, pick)
	got, err := pick(req("https://chatgpt.com/backend-api/codex/responses"))
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Equal(t, "envproxy.example:3128", got.Host)
	for _, direct := range []string{"https://127.0.0.1:9/v1", "https://localhost:9/v1", "https://api.internal.example/v1", "http://chatgpt.com/"} {
		got, err := pick(req(direct))
		require.NoError(t, err)
		assert.Nil(t, got, "%s goes direct", direct)
	}

	pick, err = environmentProxy(c, "ignore")
	require.NoError(t, err)
	assert.Nil(t, pick, "ignore: direct")
	pick, err = environmentProxy(cli{getenv: func(string) string { return "" }}, "use")
	require.NoError(t, err)
	assert.Nil(t, pick, "no variables: direct")
	_, err = environmentProxy(c, "sometimes")
	require.ErrorContains(t, err, "CODEX_RELAY_ENV_PROXY")

	var out, errOut logbuf.Buffer
	err = run(context.Background(), []string{"serve", "-env-proxy", "maybe"}, cli{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
	require.ErrorContains(t, err, "-env-proxy")
}

// serve wires the account's proxy into everything it sends for it: the
// usage poll and the token refresh it needs (the stored access token is
// stale) at start, and the Responses traffic of a request. Nothing for the
// account reaches the upstream except through the proxy.
func TestServeSendsAccountTrafficThroughItsProxy(t *testing.T) {
	proxyURL, via := startRecordingProxy(t, "relay", "serve-pw-s3cret")
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "alice", Kind: sim.KindChatGPT, AccessToken: "at-alice", RefreshToken: "rt-alice", ChatGPTAccountID: "cg-alice", Organization: "org-a"},
	}})
	defer upstream.Close()

	dbURL := storetest.SQLiteURL(t)
	secret := "a-secret-key-for-the-egress-test"
	st := storetest.Open(t, dbURL, store.Options{SecretKey: []byte(secret)})
	p, err := store.ParseProxy(proxyURL)
	require.NoError(t, err)
	_, err = st.CreateAccount(context.Background(), store.Account{Kind: store.KindChatGPT, Label: "alice", BaseURL: upstream.CodexBaseURL(),
		ChatGPTAccountID: "cg-alice", Organization: "org-a", Proxy: p}, store.Credentials{AccessToken: "stale", RefreshToken: "rt-alice"})
	require.NoError(t, err)
	st.Close()

	r := start(t, map[string]string{"CODEX_RELAY_DATABASE_URL": dbURL, "CODEX_RELAY_SECRET_KEY": secret,
		"CODEX_RELAY_ADMIN_TOKEN": "an-admin-token-for-egress", "CODEX_RELAY_TOKEN_URL": upstream.TokenURL(), "CODEX_RELAY_LOG_FORMAT": "text"})
	require.Eventually(t, func() bool {
		return strings.Contains(strings.Join(via.all(), "\n"), "GET /backend-api/wham/usage") && upstream.RefreshCount("alice") == 1
	}, time.Minute, 20*time.Millisecond, "the usage poll at start: %v", via.all())

	code, _, raw := request(t, http.MethodPost, r.url+"/backend-api/codex/responses", "", map[string]any{
		"model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "hi"}}}},
	})
	require.Equal(t, http.StatusOK, code, raw)
	require.Contains(t, raw, "response.completed")
	require.NoError(t, r.stop())

	seen := strings.Join(via.all(), "\n")
	assert.Contains(t, seen, "POST /oauth/token", "the token refresh")
	assert.Contains(t, seen, "GET /backend-api/wham/usage", "the usage poll")
	assert.Regexp(t, regexp.MustCompile(`(GET|POST) /backend-api/codex/responses`), seen, "the Responses request (a WebSocket lane or a POST)")
	upstreamCalls := 0
	for _, rec := range upstream.Records(sim.RecordFilter{}) {
		if rec.Kind != sim.RecordMessage {
			upstreamCalls++
		}
	}
	assert.Equal(t, upstreamCalls, len(via.all()), "every request the upstream got came through the proxy: %s", seen)
	assert.NotContains(t, r.stderr.String()+r.stdout.String(), "serve-pw-s3cret")
}

// accounts add, import and login take -proxy-url; list shows it without
// its password; login signs in through the proxy.
func TestAccountsProxyURL(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	apiURL := adminAPI(t, s)
	ctx := context.Background()
	proxyURL, via := startRecordingProxy(t, "cli", "cli-pw-s3cret")
	display := strings.Replace(proxyURL, "cli-pw-s3cret", "***", 1)

	env := adminEnv("CODEX_RELAY_URL", apiURL, "CODEX_RELAY_ACCOUNT_API_KEY", "sk-proxied")
	_, _, err := runCLI(t, env, "accounts", "add", "-label", "proxied", "-proxy-url", proxyURL)
	require.NoError(t, err)
	_, _, err = runCLI(t, env, "accounts", "add", "-label", "bad", "-proxy-url", "ftp://u:cli-pw-s3cret@h:1")
	require.ErrorContains(t, err, "proxy_url")
	assert.NotContains(t, err.Error(), "cli-pw-s3cret")

	// From the environment, to keep the password off the command line;
	// -help shows the variable, not its value.
	dir := t.TempDir()
	path, _ := writeAuthJSON(t, dir, "dev@example.com", "ws-proxy", "pro", "rt-proxy")
	envProxy := adminEnv("CODEX_RELAY_URL", apiURL, "CODEX_RELAY_ACCOUNT_PROXY_URL", proxyURL)
	_, help, _ := runCLI(t, envProxy, "accounts", "import", "-help")
	assert.Contains(t, help, "$CODEX_RELAY_ACCOUNT_PROXY_URL")
	assert.NotContains(t, help, "cli-pw-s3cret")
	_, _, err = runCLI(t, envProxy, "accounts", "import", path)
	require.NoError(t, err)

	out, _, err := runCLI(t, env, "accounts", "list")
	require.NoError(t, err)
	assert.Contains(t, out, "PROXY")
	assert.Equal(t, 2, strings.Count(out, display), out)
	assert.NotContains(t, out, "cli-pw-s3cret")
	accts, err := s.Accounts(ctx)
	require.NoError(t, err)
	require.Len(t, accts, 2)
	for _, a := range accts {
		u, err := a.Proxy.URL()
		require.NoError(t, err)
		assert.Equal(t, proxyURL, u.String(), a.Label)
	}
	assert.Empty(t, via.all(), "adding accounts sends nothing upstream")

	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "carol", Kind: sim.KindChatGPT, AccessToken: "at-carol", RefreshToken: "rt-carol", ChatGPTAccountID: "cg-carol", Email: "carol@example.com", Organization: "org-c"},
	}})
	defer upstream.Close()
	require.NoError(t, upstream.SetDeviceLogin(0, 0))
	env = adminEnv("CODEX_RELAY_URL", apiURL, "CODEX_RELAY_AUTH_URL", upstream.URL)
	var cout, cerr logbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"accounts", "login", "-base-url", upstream.CodexBaseURL(), "-proxy-url", proxyURL},
			cli{stdout: &cout, stderr: &cerr, getenv: func(k string) string { return env[k] }})
	}()
	codeRE := regexp.MustCompile(`Enter the code ([A-Z0-9]{4}-[A-Z0-9]{4})`)
	var code string
	require.Eventually(t, func() bool {
		if m := codeRE.FindStringSubmatch(cout.String()); m != nil {
			code = m[1]
			return true
		}
		return false
	}, time.Minute, 10*time.Millisecond, "the command shows a code: %s %s", cout.String(), cerr.String())
	resp, err := http.Post(upstream.ControlURL()+"/deviceauth/approve", "application/json",
		strings.NewReader(`{"user_code":"`+code+`","account":"carol"}`))
	require.NoError(t, err)
	resp.Body.Close()
	select {
	case err := <-done:
		require.NoError(t, err, cerr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("login did not finish after the approval")
	}
	seen := strings.Join(via.all(), "\n")
	assert.Contains(t, seen, "POST /api/accounts/deviceauth/usercode")
	assert.Contains(t, seen, "POST /api/accounts/deviceauth/token")
	assert.Contains(t, seen, "POST /oauth/token", "the code exchange")
	accts, err = s.Accounts(ctx)
	require.NoError(t, err)
	require.Len(t, accts, 3)
	for _, a := range accts {
		if a.ChatGPTAccountID == "cg-carol" {
			assert.Equal(t, display, a.Proxy.String(), "the signed-in account keeps the proxy")
		}
	}
	http.DefaultClient.CloseIdleConnections()

	_, _, err = runCLI(t, env, "accounts", "login", "-proxy-url", "socks5://u:cli-pw-s3cret@h")
	require.ErrorContains(t, err, "-proxy-url")
	assert.NotContains(t, err.Error(), "cli-pw-s3cret")
}
