package web

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// signInServer is a console whose sign-ins go to the simulated upstream's
// auth server, never the internet; its sign-ins end with the test.
func signInServer(t *testing.T, s *store.Store, authURL string, timeout time.Duration) *Server {
	t.Helper()
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: &fakeRelay{inflight: map[string]int{}},
		SessionKey: []byte("test session key"), AuthURL: authURL, SignInTimeout: timeout})
	t.Cleanup(srv.Close)
	return srv
}

func authSim(t *testing.T) *sim.Server {
	t.Helper()
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "alice", Kind: sim.KindChatGPT, AccessToken: "at-alice", RefreshToken: "rt-alice", ChatGPTAccountID: "cg-alice",
			Email: "alice@example.com", Organization: "org-a"},
	}})
	t.Cleanup(upstream.Close)
	require.NoError(t, upstream.SetDeviceLogin(0, 0)) // poll as often as the client likes
	return upstream
}

// startSignIn submits a sign-in form and returns the sign-in, its page and
// the user code the page shows.
func startSignIn(t *testing.T, b *browser, srv *Server, form url.Values) (*signIn, string, string) {
	t.Helper()
	rec := b.post("/admin/accounts/signin", form)
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	loc := rec.Header().Get("Location")
	id, ok := strings.CutPrefix(loc, "/admin/accounts/signin/")
	require.True(t, ok, "sent to the sign-in's page, not %s", loc)
	rec = b.get(loc)
	require.Equal(t, http.StatusOK, rec.Code)
	page := body(rec)
	code := regexpFind(`class="user-code">([A-Z0-9-]+)<`, page)
	require.NotEmpty(t, code, "the page shows the code: %s", page)
	si, ok := srv.signIns.get(id)
	require.True(t, ok)
	return si, loc, code
}

// ended waits for a sign-in's goroutine to record its outcome.
func ended(t *testing.T, si *signIn) {
	t.Helper()
	select {
	case <-si.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the sign-in did not end")
	}
}

// "Sign in with ChatGPT" runs the device-code login `accounts login` runs,
// against the sim: the page shows the code and where to enter it, the
// approval completes in the background, the account is added with the
// form's settings and audited; signing the same workspace in again gives
// it the new tokens and returns it to service.
func TestConsoleSignIn(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		upstream := authSim(t)
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		assert.Contains(t, body(b.get("/admin/accounts")), "Sign in with ChatGPT")

		si, page, code := startSignIn(t, b, srv, url.Values{"tags": {"team, blue"}, "priority": {"7"}, "base_url": {upstream.CodexBaseURL()}})
		text := body(b.get(page))
		assert.Contains(t, text, upstream.URL+"/codex/device", "where to enter the code")
		assert.Contains(t, text, "waiting for approval")
		assert.Contains(t, text, `action="/admin/accounts/signin/`+si.id+`/cancel"`, "it may be given up")
		assert.Contains(t, text, `data-live="/admin/live/signin?id=`+si.id+`"`, "the page follows the sign-in live")
		assert.Contains(t, body(b.get("/admin/accounts")), code, "the accounts page lists the sign-in under way")

		require.NoError(t, upstream.ApproveDeviceLogin(code, "alice"))
		ended(t, si)
		text = body(b.get(page))
		assert.Contains(t, text, "Signed in as alice@example.com")
		assert.Contains(t, text, "account added.")
		accounts, err := s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, accounts, 1)
		a := accounts[0]
		assert.Contains(t, text, `href="/admin/accounts/`+a.ID+`"`, "the page links to the new account")
		assert.Equal(t, store.KindChatGPT, a.Kind)
		assert.Equal(t, "cg-alice", a.ChatGPTAccountID)
		assert.Equal(t, "alice@example.com", a.Email)
		assert.Equal(t, []string{"team", "blue"}, a.Tags)
		assert.Equal(t, 7, a.Priority)
		assert.Equal(t, upstream.CodexBaseURL(), a.BaseURL)
		assert.False(t, a.AccessExpiresAt.IsZero(), "the access token's expiry is kept")
		assert.NotContains(t, text, "Cancel the sign-in", "nothing left to cancel")
		cred, err := s.Credentials(ctx, a.ID)
		require.NoError(t, err)
		st, _ := upstream.Account("alice")
		assert.Equal(t, st.RefreshToken, cred.RefreshToken, "the login's tokens are stored")
		assert.NotContains(t, text, cred.RefreshToken)
		assert.NotContains(t, text, cred.AccessToken)

		// The account needs a new login: signing in again from its page
		// replaces its tokens and resumes it; no twin.
		_, err = s.SetAccountStatus(ctx, a.ID, store.StatusReauthRequired, "refresh_token_reused", time.Time{})
		require.NoError(t, err)
		assert.Contains(t, body(b.get("/admin/accounts/"+a.ID)), "Sign in again with ChatGPT")
		si, page, code = startSignIn(t, b, srv, url.Values{"account": {a.ID}})
		require.NoError(t, upstream.ApproveDeviceLogin(code, "alice"))
		ended(t, si)
		assert.Contains(t, body(b.get(page)), "the account already in the pool has the new tokens")
		accounts, err = s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, accounts, 1, "no twin")
		assert.Equal(t, store.StatusActive, accounts[0].Status)
		assert.Equal(t, []string{"team", "blue"}, accounts[0].Tags, "its settings are kept")
		cred, err = s.Credentials(ctx, a.ID)
		require.NoError(t, err)
		st, _ = upstream.Account("alice")
		assert.Equal(t, st.RefreshToken, cred.RefreshToken, "the new login's tokens")

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account."})
		require.NoError(t, err)
		var got []string
		for _, e := range entries {
			assert.Equal(t, "admin-token", e.Actor)
			assert.Equal(t, "192.0.2.10", e.Address, "the address of the request that started it")
			got = append(got, e.Action+" "+strings.SplitN(e.Target, ":", 2)[0]+" "+e.Detail)
		}
		assert.Equal(t, []string{
			"account.resume account " + a.Label + ": signed in again",
			"account.signin account " + a.Label + ": tokens replaced",
			"account.signin signin started: waiting up to 15m 00s for the approval",
			"account.signin account " + a.Label + " (chatgpt)",
			"account.signin signin started: waiting up to 15m 00s for the approval",
		}, got)
	})
}

// A sign-in that does not complete says why on its page, adds nothing and
// is audited: denied, expired, not approved in time, cancelled, the relay
// stopping; one that cannot start says so on the accounts page.
func TestConsoleSignInFails(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	upstream := authSim(t)

	t.Run("denied", func(t *testing.T) {
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		si, page, code := startSignIn(t, b, srv, nil)
		require.NoError(t, upstream.DenyDeviceLogin(code))
		ended(t, si)
		assert.Contains(t, body(b.get(page)), "Not signed in: the sign-in was denied.")
	})
	t.Run("expired", func(t *testing.T) {
		require.NoError(t, upstream.SetDeviceLogin(0, time.Second))
		defer func() { require.NoError(t, upstream.SetDeviceLogin(0, 15*time.Minute)) }()
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		si, page, _ := startSignIn(t, b, srv, nil)
		ended(t, si)
		assert.Contains(t, body(b.get(page)), "Not signed in: the code expired before it was approved; start again.")
	})
	t.Run("not approved in time", func(t *testing.T) {
		srv := signInServer(t, s, upstream.URL, 300*time.Millisecond)
		b := newBrowser(t, srv)
		b.login()
		si, page, _ := startSignIn(t, b, srv, nil)
		ended(t, si)
		assert.Contains(t, body(b.get(page)), "Not signed in: not approved within 300 ms; start again.")
	})
	t.Run("cancelled", func(t *testing.T) {
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		si, page, _ := startSignIn(t, b, srv, nil)
		rec := b.post(page+"/cancel", url.Values{"_csrf": {""}})
		assert.Equal(t, http.StatusForbidden, rec.Code, "no CSRF token, no cancel")
		rec = b.post(page+"/cancel", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		ended(t, si)
		text := body(b.get(page))
		assert.Contains(t, text, "Cancelled the sign-in.")
		assert.Contains(t, text, "Not signed in: cancelled by an operator.")
	})
	t.Run("the relay stops", func(t *testing.T) {
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		si, page, _ := startSignIn(t, b, srv, nil)
		srv.Close() // returns once the sign-in's goroutine has
		select {
		case <-si.done:
		default:
			t.Fatal("Close returned before the sign-in ended")
		}
		assert.Contains(t, body(b.get(page)), "Not signed in: the relay stopped before the sign-in was approved; start again.")
		rec := b.post("/admin/accounts/signin", nil)
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Contains(t, body(rec), "the relay is stopping")
	})
	t.Run("no device login at the auth server", func(t *testing.T) {
		none := httptest.NewServer(http.NotFoundHandler())
		defer none.Close()
		srv := signInServer(t, s, none.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		rec := b.post("/admin/accounts/signin", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Equal(t, "/admin/accounts", rec.Header().Get("Location"))
		assert.Contains(t, body(b.get("/admin/accounts")), "Could not start the sign-in: this auth server does not offer device-code sign-in (404)")
		assert.Empty(t, srv.signIns.list(time.Now()))
	})
	t.Run("bad settings", func(t *testing.T) {
		srv := signInServer(t, s, upstream.URL, 0)
		b := newBrowser(t, srv)
		b.login()
		for field, v := range map[string]string{"priority": "x", "proxy_url": "ftp://127.0.0.1:21", "base_url": "nope"} {
			rec := b.post("/admin/accounts/signin", url.Values{field: {v}})
			require.Equal(t, http.StatusSeeOther, rec.Code)
			assert.Contains(t, body(b.get("/admin/accounts")), field+": ", "the flash names the field")
		}
		assert.Empty(t, srv.signIns.list(time.Now()), "nothing started")
		assert.Equal(t, http.StatusNotFound, b.get("/admin/accounts/signin/signin_nope").Code)
	})

	accounts, err := s.Accounts(ctx)
	require.NoError(t, err)
	assert.Empty(t, accounts, "no failed sign-in added an account")
	entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account.signin"})
	require.NoError(t, err)
	var details []string
	for _, e := range entries {
		details = append(details, e.Detail)
	}
	for _, want := range []string{"failed: the sign-in was denied", "failed: the code expired before it was approved; start again",
		"failed: not approved within 300 ms; start again", "cancelled", "failed: the relay stopped before the sign-in was approved; start again"} {
		assert.Contains(t, details, want)
	}
}

// A sign-in's page follows it over the console's live stream: the code
// while it waits, the outcome once the approval went through.
func TestConsoleSignInLive(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	upstream := authSim(t)
	srv := signInServer(t, s, upstream.URL, 0)
	b := newBrowser(t, srv)
	b.login()
	si, _, code := startSignIn(t, b, srv, nil)
	ts := httptest.NewServer(srv)
	defer ts.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/admin/live/signin?id="+url.QueryEscape(si.id), nil)
	require.NoError(t, err)
	req.AddCookie(b.cookies[sessionCookie])
	resp, err := ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := bufio.NewReader(resp.Body)
	next := func() string {
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
	first := next()
	assert.Contains(t, first, code)
	assert.Contains(t, first, `data-state="waiting for approval"`)
	require.NoError(t, upstream.ApproveDeviceLogin(code, "alice"))
	ev := next()
	for ; !strings.Contains(ev, `data-state="added"`); ev = next() {
		assert.Contains(t, ev, code, "until it ends, the code is shown")
	}
	assert.Contains(t, ev, "Signed in as alice@example.com")
	assert.Equal(t, http.StatusNotFound, b.get("/admin/live/signin?id=signin_nope").Code)
}
