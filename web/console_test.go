package web

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"mime/multipart"
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
)

// Every console page renders for a logged-in operator, with the data it is
// about and the console's security headers.
func TestConsolePagesRender(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s)
		srv, fr := consoleServer(t, s)
		now := time.Now()
		require.NoError(t, s.UpdateUsage(ctx, f.a.ID, store.Window{UsedPercent: 42, WindowMinutes: 300, ResetAt: now.Add(time.Hour), Known: true},
			store.Window{UsedPercent: 93, WindowMinutes: 10080, ResetAt: now.Add(72 * time.Hour), Known: true}))
		_, err := s.SetAccountStatus(ctx, f.b.ID, store.StatusRateLimited, "usage_limit_reached", now.Add(30*time.Minute))
		require.NoError(t, err)
		_, err = s.Pin(ctx, store.BindRawThread, "t-pinned", f.a.ID, "pin")
		require.NoError(t, err)
		key, _, err := s.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
		require.NoError(t, err)
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_1", ClientKeyID: key.ID, ThreadID: "t1", SessionID: "s1", AccountID: f.a.ID,
			Transport: "http", Path: "/backend-api/codex/responses", Model: "gpt-5.5-codex", Status: 200, Recovery: "failover", StartedAt: now.Add(-2 * time.Minute),
			Duration: 1500 * time.Millisecond, InputTokens: 1200, OutputTokens: 80}))
		require.NoError(t, s.RecordAttempts(ctx, []store.Attempt{
			{RequestID: "req_1", Seq: 1, ThreadID: "t1", AccountID: f.b.ID, Class: "usage_limit", Action: "next_account", Status: 429,
				Detail: "usage_limit_reached: account limited until its reset", StartedAt: now.Add(-2 * time.Minute), EndedAt: now.Add(-2*time.Minute + 40*time.Millisecond)},
			{RequestID: "req_1", Seq: 2, ThreadID: "t1", AccountID: f.a.ID, FromAccountID: f.b.ID, Class: "ok", Recovery: "failover", Action: "done", Status: 200,
				StartedAt: now.Add(-2*time.Minute + 40*time.Millisecond), EndedAt: now.Add(-2*time.Minute + 1500*time.Millisecond)},
		}))
		fr.lanes = []relay.LaneInfo{{Kind: "direct", AccountID: f.a.ID, SessionID: "s1", ThreadID: "t1", OpenedAt: now.Add(-5 * time.Minute), Requests: 7},
			{Kind: "bridge", AccountID: f.a.ID, SessionID: "s9", ThreadID: "t9", OpenedAt: now.Add(-time.Minute), Requests: 1, Retiring: true}}
		// A pin of the session of a thread whose lane is live on another
		// account: the page says the thread moves at its next request.
		_, err = s.Pin(ctx, store.BindRawSession, "s1", f.b.ID, "pin")
		require.NoError(t, err)
		fr.inflight[f.a.ID] = 2
		require.NoError(t, s.PutObject(ctx, store.Object{ID: "file-of-t1", Kind: store.ObjectFile, AccountID: f.a.ID, ThreadKey: "v1:st:s1:t1", Created: now.Add(-time.Minute)}))

		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "rep_test", Name: "host-a:1", Address: "http://10.0.0.1:2455", StartedAt: now.Add(-time.Hour)}))
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "rep_other", Name: "host-b:2", StartedAt: now.Add(-time.Minute), Lanes: json.RawMessage(`[{"kind":"bridge"}]`)}))

		b := newBrowser(t, srv)
		b.login()
		for _, p := range []struct {
			path string
			want []string
		}{
			{"/admin/", []string{"Accounts available", "1 / 2", "Requests per minute", "usage_limit", "t1", "alpha", "Live lanes", `data-live="/admin/live/overview"`, "<svg"}},
			{"/admin/accounts", []string{"alpha", "beta", "rate limited", "usage_limit_reached", "5h", "42%", "7d", "93%", "Pause", "Import a Codex auth.json", "cap 64 per replica"}},
			{"/admin/bindings", []string{`data-thread="t1"`, `data-thread="t-pinned"`, "pin", "admission", "laptop", "Reset thread", "Pin a session or thread"}},
			{"/admin/bindings?thread=t-pinned", []string{`class="pinned"`, "raw thread", "hard", "never"}},
			{"/admin/bindings?thread=t1", []string{"Objects of this thread", `data-object-id="file-of-t1"`, "when deleted"}},
			{"/admin/bindings?session=s1", []string{"raw session", "its live lane on alpha moves to beta at its next request"}},
			{"/admin/lanes", []string{"direct", "alpha", `data-live="/admin/live/lanes"`, "retiring at the end of its turn"}},
			{"/admin/diagnostics", []string{"usage_limit", "beta", "→", "failover", "next account", "usage_limit_reached: account limited", "2 attempts"}},
			{"/admin/diagnostics?class=ok", []string{"failover"}},
			// Filtered by its first attempt's class, the request that failed
			// over still shows whole: both attempts, the one that matched marked.
			{"/admin/diagnostics?class=usage_limit", []string{"2 attempts", "failover", "matches the filter", "1–1 of 1"}},
			{"/admin/requests", []string{"gpt-5.5-codex", "1200 / 80 / 0", "laptop", "failover", "/admin/diagnostics?request=req_1"}},
			{"/admin/keys", []string{"laptop", "active", "all accounts", "Create a client key"}},
			{"/admin/settings", []string{"Schema version", string(s.Dialect()), "Login rate limit", "host-a:1 (this one)", "http://10.0.0.1:2455",
				"host-b:2", "takes no forwarded requests", "1 lanes"}},
			{"/admin/audit", []string{`data-action="login"`}},
		} {
			rec := b.get(p.path)
			require.Equal(t, http.StatusOK, rec.Code, p.path)
			page := body(rec)
			for _, w := range p.want {
				assert.Contains(t, page, w, p.path)
			}
			h := rec.Header()
			assert.Contains(t, h.Get("Content-Security-Policy"), "script-src 'self'", p.path)
			assert.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'", p.path)
			assert.Equal(t, "DENY", h.Get("X-Frame-Options"), p.path)
			assert.Equal(t, "no-store", h.Get("Cache-Control"), p.path)
			assert.Contains(t, page, `name="_csrf"`, "%s: every page's forms carry the CSRF token", p.path)
		}
		rec := b.get("/admin/bindings?kind=nonsense")
		assert.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, body(rec), "kind: must be")
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/html", "console errors are pages")
		rec = b.get("/admin/no-such-page")
		assert.Equal(t, http.StatusNotFound, rec.Code)
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/html")
	})
}

// Whatever a client sends as a session or thread id is shown as text.
func TestConsoleEscapesClientValues(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	f := seedBindings(t, s)
	evil := `<script>alert("x")</script>`
	require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "k-evil", ThreadID: evil, SessionID: evil, AccountID: f.a.ID, Source: "admission", TTL: time.Hour}))
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	for _, path := range []string{"/admin/bindings", "/admin/bindings?thread=" + url.QueryEscape(evil)} {
		page := body(b.get(path))
		assert.NotContains(t, page, "<script>alert", path)
		assert.Contains(t, page, "&lt;script&gt;", path)
	}
}

// Resetting from the Bindings page: one binding, a thread, a session, an
// account; each follows with Forget, flashes the outcome and is audited as
// the console's admin.
func TestConsoleResetsAndPins(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s)
		srv, fr := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rows, _, err := s.Bindings(ctx, store.BindingFilter{ThreadID: "t1"})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		page := body(b.get("/admin/bindings?thread=t1"))
		require.Contains(t, page, `data-binding-id="`+rows[0].ID+`"`)

		rec := b.post("/admin/bindings/reset", url.Values{"by": {"binding"}, "value": {rows[0].ID}, "return": {"/admin/bindings?thread=t1"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Equal(t, "/admin/bindings?thread=t1", rec.Header().Get("Location"))
		assert.Equal(t, []string{rows[0].ID}, fr.forgottenIDs())
		page = body(b.get("/admin/bindings?thread=t1"))
		assert.Contains(t, page, "Reset binding "+rows[0].ID+".")
		assert.Contains(t, page, `id="no-bindings"`)
		page = body(b.get("/admin/bindings?thread=t1"))
		assert.NotContains(t, page, "Reset binding", "a flash shows once")

		rec = b.post("/admin/bindings/reset", url.Values{"by": {"session"}, "value": {"s1"}, "return": {"https://evil.example/"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Equal(t, "/admin/bindings", rec.Header().Get("Location"), "the return address stays in the console")
		assert.Contains(t, body(b.get("/admin/bindings")), "Reset 2 bindings of session s1")

		rec = b.post("/admin/bindings/reset", url.Values{"by": {"everything"}, "value": {"x"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/bindings")), "by: must be")
		rec = b.post("/admin/bindings/reset", url.Values{"by": {"thread"}, "value": {""}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/bindings")), "value: give the id")

		rec = b.post("/admin/bindings/pin", url.Values{"kind": {"session"}, "value": {"s9"}, "account_id": {f.b.ID}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		page = body(b.get("/admin/bindings?session=s9"))
		assert.Contains(t, page, "Pinned session s9")
		assert.Contains(t, page, `class="pinned"`)
		assert.Contains(t, page, "raw session")
		rec = b.post("/admin/bindings/pin", url.Values{"kind": {"thread"}, "value": {"t9"}, "account_id": {"acc_missing"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/bindings")), "account_id: no account")

		rec = b.post("/admin/bindings/reset", url.Values{"by": {"account"}, "value": {f.b.ID}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/bindings")), "Reset 3 bindings of account "+f.b.ID)
		_, total, err := s.Bindings(ctx, store.BindingFilter{IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, total)

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "binding."})
		require.NoError(t, err)
		require.Len(t, entries, 4)
		for _, e := range entries {
			assert.Equal(t, "admin-token", e.Actor)
			assert.Equal(t, "192.0.2.10", e.Address)
		}
		assert.Equal(t, "account:"+f.b.ID, entries[0].Target)
		assert.Equal(t, "3 bindings reset", entries[0].Detail)
		assert.Equal(t, "session:s9", entries[1].Target)
		assert.Equal(t, "binding:"+rows[0].ID, entries[3].Target)
		page = body(b.get("/admin/audit?action=binding.reset"))
		assert.Contains(t, page, "binding:"+rows[0].ID, "the audit page shows the reset")
	})
}

func TestConsoleAccounts(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rec := b.post("/admin/accounts", url.Values{"kind": {"compatible"}, "label": {"kept label"}, "api_key": {"sk-typed-secret"}})
		require.Equal(t, http.StatusBadRequest, rec.Code, "compatible accounts need a base URL")
		page := body(rec)
		assert.Contains(t, page, "base_url: required for compatible accounts")
		assert.Contains(t, page, `value="kept label"`, "what was typed is kept")
		assert.NotContains(t, page, "sk-typed-secret", "credentials are never sent back")

		rec = b.post("/admin/accounts", url.Values{"kind": {"openai"}, "label": {"team"}, "api_key": {"sk-1"}, "tags": {"blue, green"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		accounts, err := s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, accounts, 1)
		assert.Equal(t, []string{"blue", "green"}, accounts[0].Tags)
		cred, err := s.Credentials(ctx, accounts[0].ID)
		require.NoError(t, err)
		assert.Equal(t, "sk-1", cred.APIKey)
		assert.Contains(t, body(b.get("/admin/accounts")), "Added account team.")

		rec = b.post("/admin/accounts/"+accounts[0].ID+"/pause", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		page = body(b.get("/admin/accounts"))
		assert.Contains(t, page, "Paused team")
		assert.Contains(t, page, ">Resume<")
		a, err := s.Account(ctx, accounts[0].ID)
		require.NoError(t, err)
		assert.Equal(t, store.StatusPaused, a.Status)
		rec = b.post("/admin/accounts/"+accounts[0].ID+"/resume", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		a, err = s.Account(ctx, accounts[0].ID)
		require.NoError(t, err)
		assert.Equal(t, store.StatusActive, a.Status)
		rec = b.post("/admin/accounts/acc_missing/pause", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/accounts")), "no such object")

		// Import an auth.json, as an uploaded file and pasted.
		claims := base64.RawURLEncoding.EncodeToString([]byte(`{"email":"dev@example.com","https://api.openai.com/auth":{"chatgpt_plan_type":"pro","chatgpt_account_id":"ws-9"}}`))
		authJSON := `{"OPENAI_API_KEY":null,"tokens":{"id_token":"h.` + claims + `.s","access_token":"at-imported","refresh_token":"rt-imported"},"last_refresh":"2026-11-01T00:00:00Z"}`
		var mp bytes.Buffer
		w := multipart.NewWriter(&mp)
		require.NoError(t, w.WriteField("_csrf", b.csrf))
		require.NoError(t, w.WriteField("organization", "org-x"))
		fw, err := w.CreateFormFile("auth_json", "auth.json")
		require.NoError(t, err)
		fw.Write([]byte(authJSON))
		require.NoError(t, w.Close())
		req := httptest.NewRequest(http.MethodPost, "/admin/accounts/import", &mp)
		req.Header.Set("Content-Type", w.FormDataContentType())
		rec = b.do(req)
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		assert.Contains(t, body(b.get("/admin/accounts")), "Imported dev@example.com (pro, ws-9).")
		rec = b.post("/admin/accounts/import", url.Values{"auth_json_text": {`{"OPENAI_API_KEY":"sk-pasted"}`}, "label": {"pasted"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		rec = b.post("/admin/accounts/import", url.Values{"auth_json_text": {`{"tokens":{}}`}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/accounts")), "holds neither tokens nor OPENAI_API_KEY")
		rec = b.post("/admin/accounts/import", url.Values{"auth_json_text": {""}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/accounts")), "choose an auth.json file or paste")
		// Importing the same workspace again replaces its tokens, no twin.
		again := strings.ReplaceAll(authJSON, "rt-imported", "rt-fresh")
		rec = b.post("/admin/accounts/import", url.Values{"auth_json_text": {again}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/accounts")), "Replaced the tokens of dev@example.com (pro, ws-9).")

		accounts, err = s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, accounts, 3)
		byLabel := map[string]store.Account{}
		for _, a := range accounts {
			byLabel[a.Label] = a
		}
		imp := byLabel["dev@example.com (pro, ws-9)"]
		assert.Equal(t, store.KindChatGPT, imp.Kind)
		assert.Equal(t, "ws-9", imp.ChatGPTAccountID, "the account id comes from the id_token when auth.json has none")
		assert.Equal(t, "pro", imp.PlanType)
		assert.Equal(t, "org-x", imp.Organization)
		cred, err = s.Credentials(ctx, imp.ID)
		require.NoError(t, err)
		assert.Equal(t, "rt-fresh", cred.RefreshToken)
		assert.Equal(t, store.KindOpenAI, byLabel["pasted"].Kind)
		assert.NotContains(t, body(b.get("/admin/accounts")), "at-imported", "credentials are never shown")

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account."})
		require.NoError(t, err)
		var actions []string
		for _, e := range entries {
			actions = append(actions, e.Action)
			assert.Equal(t, "admin-token", e.Actor)
		}
		assert.Equal(t, []string{"account.import", "account.import", "account.import", "account.resume", "account.pause", "account.create"}, actions)
	})
}

func TestConsoleKeys(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s)
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rec := b.post("/admin/keys", url.Values{"name": {"ci"}, "account_ids": {f.a.ID, f.b.ID}, "models": {"gpt-5.5-codex, gpt-5.4"}, "expires_in": {"720h"}})
		require.Equal(t, http.StatusOK, rec.Code)
		page := body(rec)
		m := regexpFind(`value="(crk_[^"]+)"`, page)
		require.NotEmpty(t, m, "the new key is shown")
		assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
		k, err := s.AuthenticateClientKey(ctx, m)
		require.NoError(t, err, "the shown key works")
		assert.Equal(t, []string{f.a.ID, f.b.ID}, k.ScopeAccounts)
		assert.Equal(t, []string{"gpt-5.5-codex", "gpt-5.4"}, k.Models)
		assert.False(t, k.ExpiresAt.IsZero())

		page = body(b.get("/admin/keys"))
		assert.NotContains(t, page, m, "the key is never shown again")
		assert.Contains(t, page, "alpha, beta")

		rec = b.post("/admin/keys", url.Values{"name": {"bad"}, "expires_in": {"soon"}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		page = body(rec)
		assert.Contains(t, page, "expires_in: must be a positive duration")
		assert.Contains(t, page, `value="soon"`)

		rec = b.post("/admin/keys/"+k.ID+"/revoke", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		page = body(b.get("/admin/keys"))
		assert.Contains(t, page, "Revoked key ci")
		assert.Contains(t, page, "revoked")
		_, err = s.AuthenticateClientKey(ctx, m)
		assert.ErrorIs(t, err, store.ErrKeyRejected)
	})
}

// The live regions stream server-rendered fragments over SSE, and send them
// again when the data changes.
func TestLiveUpdates(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	f := seedBindings(t, s)
	srv, fr := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	ts := httptest.NewServer(srv)
	defer ts.Close()

	open := func(path string) (*bufio.Reader, func()) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+path, nil)
		require.NoError(t, err)
		req.AddCookie(b.cookies[sessionCookie])
		resp, err := ts.Client().Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		return bufio.NewReader(resp.Body), func() { cancel(); resp.Body.Close() }
	}
	next := func(r *bufio.Reader) string {
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

	r, stop := open("/admin/live/lanes")
	assert.Contains(t, next(r), "No live lanes")
	fr.mu.Lock()
	fr.lanes = []relay.LaneInfo{{Kind: "direct", AccountID: f.a.ID, ThreadID: "t-live", OpenedAt: time.Now()}}
	fr.mu.Unlock()
	ev := next(r)
	assert.Contains(t, ev, "t-live", "a change is pushed")
	assert.Contains(t, ev, "alpha")
	stop()

	r, stop = open("/admin/live/overview")
	assert.Contains(t, next(r), "Accounts available")
	stop()
	r, stop = open("/admin/live/diagnostics?class=ok")
	assert.Contains(t, next(r), "No attempts match")
	stop()

	rec := b.get("/admin/live/nothing")
	assert.Equal(t, http.StatusNotFound, rec.Code)
}

func TestSSEEventEncoding(t *testing.T) {
	assert.Equal(t, "event: update\ndata: <p>a</p>\ndata: <p>b</p>\n\n", string(sseEvent("update", "<p>a</p>\r\n<p>b</p>")))
}

func TestPagerLinks(t *testing.T) {
	v := url.Values{"thread": {"t"}}
	p := pagerFor("/admin/requests", v, page{Limit: 100, Offset: 100, def: 100}, 100, 250)
	assert.Equal(t, 101, p.From)
	assert.Equal(t, 200, p.To)
	assert.Equal(t, "/admin/requests?thread=t", p.Prev, "the first page needs no offset")
	assert.Equal(t, "/admin/requests?offset=200&thread=t", p.Next)
	p = pagerFor("/admin/requests", url.Values{}, page{Limit: 50, Offset: 200, def: 100}, 50, 250)
	assert.Equal(t, "/admin/requests?limit=50&offset=150", p.Prev, "a chosen limit is kept")
	assert.Empty(t, p.Next, "the last page")
	p = pagerFor("/admin/requests", url.Values{}, page{Limit: 100, def: 100}, 0, 0)
	assert.Zero(t, p.From)
	assert.Empty(t, p.Prev)
	assert.Empty(t, p.Next)
}
