package relay_test

import (
	"context"
	"encoding/base64"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	socks5 "github.com/armon/go-socks5"
	"github.com/elazarl/goproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// hops records the destinations one proxy carried for clients that
// authenticated: CONNECT targets, forwarded requests' hosts, SOCKS5
// connects. Safe for concurrent use.
type hops struct {
	name   string
	mu     sync.Mutex
	dests  []string // guarded by mu
	denied int      // guarded by mu: requests with wrong or missing credentials
}

func (h *hops) add(dest string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dests = append(h.dests, dest)
}

func (h *hops) deny() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.denied++
}

// take returns what passed since the last take, and forgets it.
func (h *hops) take() (dests []string, denied int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	dests, denied = h.dests, h.denied
	h.dests, h.denied = nil, 0
	return dests, denied
}

// startConnectProxy runs goproxy on loopback: CONNECT tunnels (https and
// wss upstreams) and forwarded requests (http and ws upstreams), only for
// clients that send user:pass (none when user is ""). It returns the
// proxy's URL, credentials included.
func startConnectProxy(t *testing.T, name, user, pass string) (string, *hops) {
	t.Helper()
	rec := &hops{name: name}
	want := ""
	if user != "" {
		want = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.Tr = &http.Transport{Proxy: nil} // never the environment's proxy
	gp.ConnectDial = nil
	gp.OnRequest().HandleConnectFunc(func(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		if ctx.Req.Header.Get("Proxy-Authorization") != want {
			rec.deny()
			return goproxy.RejectConnect, host
		}
		rec.add(host)
		return goproxy.OkConnect, host
	})
	gp.OnRequest().DoFunc(func(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
		if r.Header.Get("Proxy-Authorization") != want {
			rec.deny()
			return r, goproxy.NewResponse(r, "text/plain", http.StatusProxyAuthRequired, "proxy credentials required")
		}
		rec.add(r.URL.Host)
		return r, nil
	})
	srv := httptest.NewServer(gp)
	t.Cleanup(func() {
		srv.Close()
		gp.Tr.CloseIdleConnections()
	})
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	return u.String(), rec
}

// socksRecorder is the SOCKS5 server's rule set: it records each connect
// and allows it.
type socksRecorder struct{ rec *hops }

func (s socksRecorder) Allow(ctx context.Context, req *socks5.Request) (context.Context, bool) {
	host := req.DestAddr.FQDN
	if host == "" {
		host = req.DestAddr.IP.String()
	}
	s.rec.add(net.JoinHostPort(host, strconv.Itoa(req.DestAddr.Port)))
	return ctx, true
}

// socksCredentials accepts one user and counts the refusals.
type socksCredentials struct {
	user, pass string
	rec        *hops
}

func (c socksCredentials) Valid(user, pass string) bool {
	if user == c.user && pass == c.pass {
		return true
	}
	c.rec.deny()
	return false
}

// startSOCKS5Proxy runs github.com/armon/go-socks5 on loopback with
// username/password authentication and returns its socks5:// URL.
func startSOCKS5Proxy(t *testing.T, name, user, pass string) (string, *hops) {
	t.Helper()
	rec := &hops{name: name}
	srv, err := socks5.New(&socks5.Config{
		Credentials: socksCredentials{user: user, pass: pass, rec: rec},
		Rules:       socksRecorder{rec: rec},
		Logger:      log.New(io.Discard, "", 0),
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); <-done })
	return (&url.URL{Scheme: "socks5", User: url.UserPassword(user, pass), Host: ln.Addr().String()}).String(), rec
}

// egressHarness is a relay in front of the sim, optionally over TLS, whose
// accounts name proxies, with the token refresher and usage poller wired to
// the relay's upstream client as serve wires them.
type egressHarness struct {
	*harness
	upstream *relay.Upstream
	tokens   *oauth.Refresher
	poller   *oauth.UsagePoller
	simHost  string // host:port every proxy should carry traffic to
}

func newEgressHarness(t *testing.T, useTLS bool, proxies map[string]string, envProxy func(*http.Request) (*url.URL, error), accounts ...sim.Account) *egressHarness {
	t.Helper()
	up, err := sim.New(sim.Config{Accounts: accounts, Logger: testLogger(t)})
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(up)
	if useTLS {
		ts.StartTLS()
	} else {
		ts.Start()
	}
	up.URL = ts.URL
	t.Cleanup(func() { up.Close(); ts.Close() })
	opts := relay.UpstreamOptions{EnvProxy: envProxy}
	if useTLS {
		opts.TLS = ts.Client().Transport.(*http.Transport).TLSClientConfig // trusts the test server's certificate
	}
	upstream := relay.NewUpstreamWith(opts)

	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	h := &harness{t: t, sim: up, store: st, ids: map[string]string{}}
	for _, a := range accounts {
		p, err := store.ParseProxy(proxies[a.ID])
		require.NoError(t, err)
		created, err := st.CreateAccount(context.Background(), store.Account{Label: a.ID, Organization: a.Organization,
			Kind: store.KindChatGPT, BaseURL: up.CodexBaseURL(), ChatGPTAccountID: a.ID, Proxy: p},
			store.Credentials{AccessToken: a.AccessToken, RefreshToken: a.RefreshToken})
		require.NoError(t, err)
		h.ids[a.ID] = created.ID
	}
	tokens := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: upstream.HTTP, ClientFor: upstream.Client,
		TokenURL: up.TokenURL(), Logger: testLogger(t)})
	poller := oauth.NewUsagePoller(oauth.UsagePollerConfig{Store: st, Tokens: tokens, HTTPClient: upstream.HTTP,
		ClientFor: upstream.Client, Logger: testLogger(t)})
	h.relay = relay.New(relay.Config{Store: st, Logger: testLogger(t), Upstream: upstream, Tokens: tokens,
		StreamIdleTimeout: 20 * time.Second, DisableBridge: true})
	h.srv = httptest.NewServer(h.relay)
	t.Cleanup(func() {
		h.relay.Close()
		h.srv.Close()
		tokens.Close()
		upstream.CloseIdleConnections()
	})
	u, err := url.Parse(ts.URL)
	require.NoError(t, err)
	return &egressHarness{harness: h, upstream: upstream, tokens: tokens, poller: poller, simHost: u.Host}
}

// TestEgressPerAccount: two accounts each name their own proxy, a real
// CONNECT proxy (goproxy) and a real SOCKS5 server (go-socks5), and a third
// names none. Each account's Responses traffic over HTTP and over a
// WebSocket lane, its token refresh and its usage poll pass through its own
// proxy and no other; the third account's through none of them (through the
// environment's proxy when there is one). The sim listens on loopback: an
// account's proxy applies there too. A changed proxy retires the lanes
// dialed through the old one.
func TestEgressPerAccount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		tls      bool
		envProxy bool
	}{
		{"https upstream: CONNECT tunnels, an environment proxy for the rest", true, true},
		{"http upstream: forwarded requests, no environment proxy", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testEgressPerAccount(t, tc.tls, tc.envProxy)
		})
	}
}

func testEgressPerAccount(t *testing.T, useTLS, withEnvProxy bool) {
	ctx := context.Background()
	connectURL, viaConnect := startConnectProxy(t, "connect proxy", "alice", "connect-pw-s3cret")
	socksURL, viaSOCKS := startSOCKS5Proxy(t, "socks5 proxy", "bob", "socks-pw-s3cret")
	all := []*hops{viaConnect, viaSOCKS}
	var envProxy func(*http.Request) (*url.URL, error)
	var viaEnv *hops
	if withEnvProxy {
		var envURL string
		envURL, viaEnv = startConnectProxy(t, "environment proxy", "", "")
		all = append(all, viaEnv)
		u, err := url.Parse(envURL)
		require.NoError(t, err)
		// As HTTPS_PROXY would say for a host that is not loopback
		// (http.ProxyFromEnvironment never proxies loopback).
		envProxy = http.ProxyURL(u)
	}
	e := newEgressHarness(t, useTLS, map[string]string{"a": connectURL, "b": socksURL}, envProxy,
		simAccount("a", "org-a"), simAccount("b", "org-b"), simAccount("c", "org-c"))

	// through runs do on fresh connections and checks that want, and no
	// other proxy, carried it (want nil: none did).
	through := func(what string, want *hops, do func()) {
		t.Helper()
		e.upstream.CloseIdleConnections()
		for _, p := range all {
			p.take()
		}
		do()
		for _, p := range all {
			dests, denied := p.take()
			assert.Zero(t, denied, "%s: refused credentials at the %s", what, p.name)
			if p == want {
				require.NotEmpty(t, dests, "%s: through the %s", what, p.name)
				for _, d := range dests {
					assert.Equal(t, e.simHost, d, "%s: the %s carried it to the upstream", what, p.name)
				}
			} else {
				assert.Empty(t, dests, "%s: not through the %s", what, p.name)
			}
		}
	}
	lanes := map[string]*wsClient{}
	for _, acc := range []struct {
		id  string
		via *hops
	}{{"a", viaConnect}, {"b", viaSOCKS}, {"c", viaEnv}} {
		id := acc.id
		session := "019a5e55-0000-7000-8000-00000000000" + id
		httpThread, wsThread := "019a7e11-0000-7000-8000-00000000000"+id, "019a7e22-0000-7000-8000-00000000000"+id
		for _, th := range []string{httpThread, wsThread} {
			_, err := e.store.Pin(ctx, store.BindRawThread, th, e.ids[id], "pin")
			require.NoError(t, err)
		}
		before := len(e.sim.Records(sim.RecordFilter{}))
		newRecords := func(kind sim.RecordKind, route sim.Route) []sim.Record {
			var out []sim.Record
			for _, r := range e.sim.Records(sim.RecordFilter{})[before:] {
				if r.Kind == kind && r.Route == route {
					out = append(out, r)
				}
			}
			before = len(e.sim.Records(sim.RecordFilter{}))
			return out
		}

		through(id+" over HTTP", acc.via, func() {
			resp, body := e.post(session, httpThread, responseRequest("hello over http"), nil)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			completedID(t, body)
		})
		recs := newRecords(sim.RecordHTTP, sim.RouteResponses)
		require.Len(t, recs, 1, "%s: one HTTP request upstream", id)
		assert.Equal(t, id, recs[0].Account)

		through(id+" over a WebSocket lane", acc.via, func() {
			lanes[id] = e.dialWS(session, wsThread)
			typ, _ := lastEvent(lanes[id].turn(responseRequest("hello over a websocket")))
			require.Equal(t, "response.completed", typ)
		})
		recs = newRecords(sim.RecordHandshake, sim.RouteResponses)
		require.Len(t, recs, 1, "%s: one upstream WebSocket", id)
		assert.Equal(t, id, recs[0].Account)

		a, err := e.store.Account(ctx, e.ids[id])
		require.NoError(t, err)
		through(id+"'s token refresh", acc.via, func() {
			_, err := e.tokens.AfterUnauthorized(ctx, a, "at-"+id)
			require.NoError(t, err)
		})
		assert.Equal(t, 1, e.sim.RefreshCount(id))
		newRecords("", "")

		through(id+"'s usage poll", acc.via, func() {
			_, err := e.poller.PollOnce(ctx, a)
			require.NoError(t, err)
		})
		recs = newRecords(sim.RecordHTTP, sim.RouteUsage)
		require.Len(t, recs, 1, "%s: one usage request", id)
		assert.Equal(t, id, recs[0].Account)
	}

	// a now names the SOCKS5 proxy: its next turn, on the same client
	// connection, goes out on a new lane through it.
	p, err := store.ParseProxy(socksURL)
	require.NoError(t, err)
	_, err = e.store.UpdateAccount(ctx, e.ids["a"], store.AccountPatch{Proxy: &p})
	require.NoError(t, err)
	handshakes := func() int {
		n := 0
		for _, r := range e.sim.Records(sim.RecordFilter{}) {
			if r.Kind == sim.RecordHandshake && r.Account == "a" {
				n++
			}
		}
		return n
	}
	was := handshakes()
	through("a's next turn after its proxy changed", viaSOCKS, func() {
		typ, _ := lastEvent(lanes["a"].turn(responseRequest("hello again")))
		require.Equal(t, "response.completed", typ)
	})
	assert.Equal(t, was+1, handshakes(), "a new upstream WebSocket")
	assert.True(t, slices.ContainsFunc(e.sim.Records(sim.RecordFilter{}), func(r sim.Record) bool {
		return r.Kind == sim.RecordMessage && r.Account == "a"
	}))
}

// An account's proxy must be usable, or nothing is sent for the account:
// a proxy whose sealed URL does not open (another secret key) is an error,
// never a direct connection. Accounts naming one proxy share one client.
func TestUpstreamClientPerProxy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := storetest.SQLiteURL(t)
	st := storetest.Open(t, dbURL, store.Options{})
	mk := func(label, proxy string) store.Account {
		p, err := store.ParseProxy(proxy)
		require.NoError(t, err)
		a, err := st.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: label, Proxy: p}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		return a
	}
	a1, a2 := mk("a1", "http://u:p@127.0.0.1:3128"), mk("a2", "http://u:p@127.0.0.1:3128")
	b, other, none := mk("b", "socks5://127.0.0.1:1080"), mk("other", "http://u:q@127.0.0.1:3128"), mk("none", "")

	up := relay.NewUpstreamWith(relay.UpstreamOptions{})
	t.Cleanup(up.CloseIdleConnections)
	client := func(a store.Account) *http.Client {
		hc, err := up.Client(a)
		require.NoError(t, err)
		return hc
	}
	assert.Same(t, client(a1), client(a2), "one proxy, one client: its pool is shared")
	assert.NotSame(t, client(a1), client(b))
	assert.NotSame(t, client(a1), client(other), "another password is another client")
	assert.Same(t, up.HTTP, client(none))
	assert.NotSame(t, up.HTTP, client(b))

	wrong := storetest.Open(t, dbURL, store.Options{SecretKey: []byte("another secret key entirely....")})
	unreadable, err := wrong.Account(ctx, a1.ID)
	require.NoError(t, err)
	_, err = up.Client(unreadable)
	require.ErrorIs(t, err, store.ErrUnseal)
	assert.NotContains(t, err.Error(), ":p@")
}
