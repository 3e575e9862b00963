package web

import (
	"bufio"
	"context"
	"html"
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
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The bare address sends a browser to the console; only GET and HEAD of
// exactly /, and the client routes and the API answer as before.
func TestRootRedirectsToTheConsole(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	client := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Client: client})
	for _, c := range []struct {
		method, path string
		status       int
		location     string
	}{
		{http.MethodGet, "/", http.StatusFound, "/admin/"},
		{http.MethodHead, "/", http.StatusFound, "/admin/"},
		{http.MethodGet, "/?from=bookmark", http.StatusFound, "/admin/"},
		{http.MethodPost, "/", http.StatusNotFound, ""},
		{http.MethodDelete, "/", http.StatusNotFound, ""},
		{http.MethodGet, "/index.html", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/models", http.StatusTeapot, ""},
		{http.MethodGet, "/backend-api/codex/models", http.StatusTeapot, ""},
		{http.MethodGet, "/api/v1/accounts", http.StatusUnauthorized, ""},
		{http.MethodGet, "/admin/", http.StatusSeeOther, "/admin/login?next=%2Fadmin%2F"},
	} {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		assert.Equal(t, c.status, rec.Code, "%s %s", c.method, c.path)
		assert.Equal(t, c.location, rec.Header().Get("Location"), "%s %s", c.method, c.path)
		if c.status == http.StatusNotFound && c.method != http.MethodHead {
			assert.Contains(t, rec.Header().Get("Content-Type"), "application/json", "%s %s is the API's 404, as before", c.method, c.path)
		}
	}
}

// The request page shows one request whole: what the client got, its ids
// linked to their pages, its usage and cost (marked unpriced when its row
// says so), and its attempts in order; an unknown id is a 404 page.
func TestConsoleRequestPage(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s)
		key, _, err := s.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
		require.NoError(t, err)
		now := time.Now()
		require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ID: "req_detail", ClientKeyID: key.ID, ThreadID: "t1", SessionID: "s1",
			AccountID: f.a.ID, Transport: "ws", Path: "/backend-api/codex/responses", Model: "gpt-9-codex", ModelServed: "gpt-9-codex",
			Status: 200, Recovery: "failover", StartedAt: now.Add(-time.Minute), FirstEvent: 300 * time.Millisecond, Duration: 2 * time.Second,
			InputTokens: 12000, CachedTokens: 3000, OutputTokens: 800, ReasoningTokens: 200, TotalTokens: 12800,
			CostNanos: 4_200_000, Charged: true, Unpriced: true}, []store.Attempt{
			{RequestID: "req_detail", Seq: 2, AccountID: f.a.ID, FromAccountID: f.b.ID, Class: "ok", Recovery: "failover", Action: "done", Status: 200,
				StartedAt: now.Add(-time.Minute + 50*time.Millisecond), EndedAt: now.Add(-time.Minute + 2*time.Second)},
			{RequestID: "req_detail", Seq: 1, AccountID: f.b.ID, Class: "usage_limit", Action: "next_account", Status: 429, ErrorCode: "usage_limit_reached",
				Detail: "the account is limited until its reset", StartedAt: now.Add(-time.Minute), EndedAt: now.Add(-time.Minute + 50*time.Millisecond)},
		}))
		require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ID: "req_failed", Transport: "http", Path: "/v1/responses", Model: "gpt-5.5",
			Status: 429, ErrorCode: "usage_limit_reached", StartedAt: now, Duration: time.Second}, []store.Attempt{
			{RequestID: "req_failed", Seq: 1, AccountID: f.b.ID, Class: "usage_limit", Action: "terminal", Status: 429,
				ErrorCode: "usage_limit_reached", Detail: "every account is limited", StartedAt: now, EndedAt: now},
		}))
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rec := b.get("/admin/requests/req_detail")
		require.Equal(t, http.StatusOK, rec.Code)
		page := body(rec)
		for _, want := range []string{"Request req_detail", "answered in full", "One request whole",
			`href="/admin/bindings?thread=t1"`, `href="/admin/requests?thread=t1"`, `href="/admin/bindings?session=s1"`,
			`href="/admin/keys/` + key.ID + `"`, ">laptop<", `href="/admin/accounts/` + f.a.ID + `"`,
			`href="/admin/diagnostics?request=req_detail"`,
			"12,800 in all", "input 12,000 (cached 3,000)", "output 800 (reasoning 200)", "$0.0042", "unpriced",
			"the price table has no price for this model", "Counts toward the key's budgets", "300 ms", "2.0 s in all",
			"usage_limit_reached", "the account is limited until its reset", "next account", "beta → "} {
			assert.Contains(t, page, want)
		}
		assert.Less(t, strings.Index(page, "usage_limit</span>"), strings.Index(page, ">ok</span>"), "attempts first to last")

		page = body(b.get("/admin/requests/req_failed"))
		assert.Contains(t, page, "Too Many Requests")
		assert.Contains(t, page, `class="error-code">usage_limit_reached`)
		assert.Contains(t, page, "every account is limited", "the cause the client's error came from")
		assert.Contains(t, page, "keyless")
		assert.Contains(t, page, "Not charged")
		assert.NotContains(t, page, ">unpriced<")

		rec = b.get("/admin/requests/req_nope")
		assert.Equal(t, http.StatusNotFound, rec.Code)
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/html", "a console page, not JSON")
		assert.Contains(t, body(rec), "No request req_nope in the request log")

		page = body(b.get("/admin/requests"))
		assert.Contains(t, page, `href="/admin/requests/req_detail"`, "the log links each request's page")
		page = body(b.get("/admin/diagnostics"))
		assert.Contains(t, page, `href="/admin/requests/req_detail"`, "so do the diagnostics")
	})
}

// Every page says under its title what it shows, and defines the words it
// uses where they appear; the Bindings page says what a pin and a reset do
// to the next turn.
func TestConsoleExplainsEachPage(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	f := seedBindings(t, s)
	require.NoError(t, s.Place(context.Background(), store.Placement{ThreadKey: "v1:t:t-new", ThreadID: "t-new", AccountID: f.a.ID,
		Source: "admission:balancer", TTL: time.Hour}))
	srv, fr := consoleServer(t, s)
	fr.lanes = []relay.LaneInfo{{Kind: "bridge_fork", AccountID: "acc_x", ThreadID: "t1", OpenedAt: time.Now()}}
	b := newBrowser(t, srv)
	b.login()
	for _, p := range []struct {
		path string
		want []string
	}{
		{"/admin/", []string{`<p class="lead">The pool at a glance`, "<dfn>Switch</dfn>", "<dfn>Thread</dfn>"}},
		{"/admin/accounts", []string{`<p class="lead">The upstream credentials`, "<dfn>Organisation</dfn>: the ChatGPT workspace an encrypted reasoning item belongs to"}},
		{"/admin/bindings", []string{`<p class="lead">Which account each thread is placed on, and why`, "<dfn>binding</dfn>", "<dfn>Thread</dfn>",
			"<dfn>Session</dfn>", "<strong>raw session</strong>", "<dfn>Hard</dfn>", `id="reset-explained"`, "previous_response_not_found",
			`id="pin-explained"`, "A thread's pin wins over its session's", "placed by its first request: the account with the most usage headroom"}},
		{"/admin/lanes", []string{`<p class="lead">The live upstream WebSockets`, "never evidence", "<dfn>direct</dfn>", "<dfn>bridge</dfn>",
			"<dfn>bridge_fork</dfn>", "one request&#39;s lane while the thread&#39;s bridge lane was busy"}},
		{"/admin/diagnostics", []string{`<p class="lead">What happened to each request`, "<dfn>Attempt</dfn>"}},
		{"/admin/requests", []string{`<p class="lead">The request log`, "<dfn>Session</dfn>"}},
		{"/admin/usage", []string{`<p class="lead">What the request log used`}},
		{"/admin/keys", []string{`<p class="lead">The client keys Codex sends`}},
		{"/admin/settings", []string{`<p class="lead">How this relay runs`}},
		{"/admin/audit", []string{`<p class="lead">Every admin action`}},
	} {
		rec := b.get(p.path)
		require.Equal(t, http.StatusOK, rec.Code, p.path)
		for _, w := range p.want {
			assert.Contains(t, body(rec), w, p.path)
		}
	}
}

func TestBindingWhyAndLaneKinds(t *testing.T) {
	for source, want := range map[string]string{
		"pin":                          "an operator's pin",
		"admission:balancer":           "placed by its first request: the account with the most usage headroom",
		"admission:session":            "placed by its first request: its session's binding named this account",
		"move:lane":                    "moved by a later request: its live lane was on this account",
		"move:previous_response":       "moved by a later request: only this account could continue its previous response",
		"admission:raw_session":        "placed by its first request: a pin of its session",
		"admission":                    "",
		"admission:something-new":      "",
		"imported from an older relay": "",
	} {
		assert.Equal(t, want, bindingWhy(source), source)
	}
	for kind, want := range map[string]string{"direct": "a client WebSocket's own lane", "bridge": "the thread's lane for its HTTP requests",
		"bridge_fork": "one request's lane while the thread's bridge lane was busy", "other": ""} {
		assert.Equal(t, want, laneKindNote(kind), kind)
	}
}

// The checklist's steps follow the store: each done when its state says
// so, and no checklist once all three are.
func TestSetupChecklistStates(t *testing.T) {
	done := func(s *ui.Setup) []bool {
		var out []bool
		for _, st := range s.Steps {
			out = append(out, st.Done)
		}
		return out
	}
	for _, c := range []struct {
		name  string
		state setupState
		want  []bool // nil: no checklist
		count int
	}{
		{"a fresh install", setupState{}, []bool{false, false, false}, 0},
		{"an account", setupState{Accounts: 2}, []bool{true, false, false}, 1},
		{"an account and a key", setupState{Accounts: 1, Keys: 1}, []bool{true, true, false}, 2},
		{"a keyless loopback request, no key", setupState{Accounts: 1, Served: true}, []bool{true, false, true}, 2},
		{"a request but no account left", setupState{Keys: 1, Served: true}, []bool{false, true, true}, 2},
		{"all three", setupState{Accounts: 1, Keys: 3, Served: true}, nil, 0},
	} {
		s := setupChecklist(c.state, "the block")
		if c.want == nil {
			assert.Nil(t, s, c.name)
			continue
		}
		require.NotNil(t, s, c.name)
		assert.Equal(t, c.want, done(s), c.name)
		assert.Equal(t, c.count, s.Done, c.name)
		assert.Equal(t, "the block", s.Config, c.name)
		assert.Equal(t, []string{"/admin/accounts", "/admin/keys", "#codex-config"},
			[]string{s.Steps[0].Link, s.Steps[1].Link, s.Steps[2].Link}, c.name)
	}
}

// The overview's checklist as the store moves through the steps: a fresh
// store shows all three to do (and no dead-end "no accounts"), an account
// and a usable key tick theirs (a revoked key does not), a request log row
// the last, and then the checklist is gone; its live region follows.
func TestOverviewChecklist(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	steps := func() map[string]string {
		page := body(b.get("/admin/"))
		out := map[string]string{}
		for _, id := range []string{"account", "key", "config"} {
			out[id] = regexpFind(`id="setup-`+id+`" class="[^"]*" data-done="([a-z]+)"`, page)
		}
		return out
	}
	page := body(b.get("/admin/"))
	assert.Contains(t, page, `data-live="/admin/live/setup"`)
	assert.Contains(t, page, "0 of 3 done")
	assert.Contains(t, page, html.EscapeString(CodexConfig("http://example.com")), "the config block for the address the browser reached")
	assert.Contains(t, page, `Add one on the Accounts page`)
	assert.NotContains(t, page, "No accounts yet.", "no dead end on a fresh install")
	assert.Equal(t, map[string]string{"account": "false", "key": "false", "config": "false"}, steps())

	_, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"account": "true", "key": "false", "config": "false"}, steps())

	old, _, err := s.CreateClientKey(ctx, store.ClientKey{Name: "old"})
	require.NoError(t, err)
	_, err = s.RevokeClientKey(ctx, old.ID)
	require.NoError(t, err)
	assert.Equal(t, "false", steps()["key"], "a revoked key serves no client")
	_, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"account": "true", "key": "true", "config": "false"}, steps())

	ts := httptest.NewServer(srv)
	defer ts.Close()
	live, stop := openLive(t, ts, b, "/admin/live/setup")
	defer stop()
	assert.Contains(t, nextEvent(t, live), "2 of 3 done")

	require.NoError(t, s.LogRequest(ctx, store.RequestRecord{Transport: "http", Path: "/backend-api/codex/responses", Status: 200, StartedAt: time.Now()}))
	assert.NotContains(t, nextEvent(t, live), "setup-step", "the live checklist empties once Codex was served")
	page = body(b.get("/admin/"))
	assert.NotContains(t, page, "live-setup", "all done: no checklist")
	assert.NotContains(t, page, "Set up the relay")
}

// openLive opens a live region's event stream with b's session.
func openLive(t *testing.T, ts *httptest.Server, b *browser, path string) (*bufio.Reader, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+path, nil)
	require.NoError(t, err)
	req.AddCookie(b.cookies[sessionCookie])
	resp, err := ts.Client().Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return bufio.NewReader(resp.Body), func() { cancel(); resp.Body.Close() }
}

// nextEvent reads the data of the stream's next event.
func nextEvent(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var data []string
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimRight(line, "\n")
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
		}
		if line == "" && len(data) > 0 {
			return strings.Join(data, "\n")
		}
	}
}

// Creating a key in the console shows its secret once with a copy button,
// and the Codex config block for the relay's address as the browser reached
// it, as `keys create` prints it; before the first key, the form warns that
// it ends keyless mode.
func TestConsoleCreatedKeyBox(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()

	page := body(b.get("/admin/keys"))
	assert.Contains(t, page, `id="first-key-warning"`)
	assert.Contains(t, page, "creating it ends keyless mode for good")

	form := url.Values{"name": {"laptop"}, "_csrf": {b.csrf}}
	req := httptest.NewRequest(http.MethodPost, "/admin/keys", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Host = "relay.internal:2455"
	rec := b.do(req)
	require.Equal(t, http.StatusOK, rec.Code, body(rec))
	page = body(rec)
	secret := regexpFind(`id="new-key" readonly value="(crk_[^"]+)"`, page)
	require.NotEmpty(t, secret, page)
	_, err := s.AuthenticateClientKey(ctx, secret)
	require.NoError(t, err, "the key shown is the key made")
	assert.Contains(t, page, `data-copy="new-key"`, "the secret has its copy button")
	assert.Contains(t, page, `<pre id="new-key-config" class="codex-config">`+html.EscapeString(CodexConfig("http://relay.internal:2455"))+`</pre>`,
		"the config block for the address the browser reached")
	assert.Contains(t, page, `data-copy="new-key-config"`, "the config block has its copy button")
	assert.NotContains(t, page, `id="first-key-warning"`, "the answer to the first key's creation no longer warns")

	page = body(b.get("/admin/keys"))
	assert.NotContains(t, page, secret, "shown once")
	assert.NotContains(t, page, `id="first-key-warning"`, "keyless mode is over: no warning")
}
