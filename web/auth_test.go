package web

import (
	"context"
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

// publicConsoleRoutes are the only console routes served without a session.
var publicConsoleRoutes = map[string]bool{
	"GET /admin/login":    true,
	"POST /admin/login":   true,
	"GET /admin/static/*": true,
	// The single sign-on, a way to a session (TestOIDCRefusals: nothing
	// signs in without a sign-in this browser started).
	"GET /admin/oidc/start":    true,
	"GET /admin/oidc/callback": true,
}

// Every console route refuses a visitor without a valid session: reads are
// sent to the login page, writes refused, and nothing of the page shows.
func TestEveryConsoleRouteNeedsASession(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	other := New(Config{Store: s, AdminTokenHash: HashAdminToken("another token"), SessionKey: []byte("test session key")})
	forged, _ := other.sessions.issue(purposeSession, time.Hour)
	login, _ := srv.sessions.issue(purposeLogin, time.Hour)
	expired, _ := newSessions([]byte("test session key"), HashAdminToken(testAdminToken), func() time.Time { return time.Now().Add(-24 * time.Hour) }).issue(purposeSession, time.Hour)
	cookies := map[string]string{
		"none":                     "",
		"garbage":                  "v1.x.1.y",
		"signed for another token": forged,
		"a login-page token":       login,
		"expired":                  expired,
		"tampered expiry":          tamperExpiry(t, srv),
	}
	n := 0
	for _, r := range srv.echo.Routes() {
		if !isConsole(r.Path) || r.Method == "echo_route_not_found" || publicConsoleRoutes[r.Method+" "+r.Path] {
			continue
		}
		n++
		path := pathParam.ReplaceAllString(r.Path, "x")
		for name, value := range cookies {
			req := httptest.NewRequest(r.Method, path, strings.NewReader("_csrf=x&by=thread&value=t"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if value != "" {
				req.AddCookie(&http.Cookie{Name: sessionCookie, Value: value})
			}
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if r.Method == http.MethodGet {
				assert.Equal(t, http.StatusSeeOther, rec.Code, "%s %s with %s cookie", r.Method, r.Path, name)
				assert.True(t, strings.HasPrefix(rec.Header().Get("Location"), "/admin/login?next="), "%s %s is sent to the login page", r.Method, r.Path)
			} else {
				assert.Equal(t, http.StatusUnauthorized, rec.Code, "%s %s with %s cookie", r.Method, r.Path, name)
			}
			assert.NotContains(t, rec.Body.String(), "Log out", "%s %s shows no console page", r.Method, r.Path)
		}
	}
	assert.GreaterOrEqual(t, n, 20, "the console routes were found")

	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/no-such-page", nil))
	assert.Equal(t, http.StatusSeeOther, rec.Code, "unknown console paths do not reveal themselves")
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/static/console.css", nil))
	assert.Equal(t, http.StatusOK, rec.Code, "the stylesheet is public")
	assert.Contains(t, rec.Header().Get("Content-Type"), "text/css")
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/static/", nil))
	assert.Equal(t, http.StatusNotFound, rec.Code, "no folder listing")
}

// tamperExpiry returns a session token whose expiry was pushed out after it
// was signed.
func tamperExpiry(t *testing.T, srv *Server) string {
	tok, _ := srv.sessions.issue(purposeSession, time.Minute)
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 4)
	parts[2] = "99999999999"
	return strings.Join(parts, ".")
}

// A console session is not an API credential, and the admin token is not a
// console cookie.
func TestSessionAndBearerAreSeparate(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	rec := b.get("/api/v1/accounts")
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "the session cookie does not open the API")

	req := httptest.NewRequest(http.MethodGet, "/admin/accounts", nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusSeeOther, rec.Code, "the bearer token does not open the console")
}

func TestLoginAndLogout(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv, _ := consoleServer(t, s)
		ctx := context.Background()
		b := newBrowser(t, srv)

		rec := b.get("/admin/bindings?thread=t1")
		require.Equal(t, http.StatusSeeOther, rec.Code)
		next, err := url.Parse(rec.Header().Get("Location"))
		require.NoError(t, err)
		assert.Equal(t, "/admin/bindings?thread=t1", next.Query().Get("next"))

		rec = b.get(rec.Header().Get("Location"))
		require.Equal(t, http.StatusOK, rec.Code)
		assert.Contains(t, body(rec), `name="next" value="/admin/bindings?thread=t1"`)
		lc := b.cookies[loginCookie]
		require.NotNil(t, lc, "the login page starts a visit for its CSRF token")
		assert.True(t, lc.HttpOnly)
		assert.Equal(t, http.SameSiteStrictMode, lc.SameSite)

		rec = b.post("/admin/login", url.Values{"token": {"wrong"}, "next": {"/admin/bindings?thread=t1"}})
		assert.Equal(t, http.StatusUnauthorized, rec.Code)
		assert.Contains(t, body(rec), "not the admin token")
		assert.NotContains(t, b.cookies, sessionCookie)

		rec = b.post("/admin/login", url.Values{"token": {testAdminToken}, "next": {"/admin/bindings?thread=t1"}})
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Equal(t, "/admin/bindings?thread=t1", rec.Header().Get("Location"))
		sc := b.cookies[sessionCookie]
		require.NotNil(t, sc)
		assert.True(t, sc.HttpOnly, "HttpOnly")
		assert.Equal(t, http.SameSiteStrictMode, sc.SameSite, "SameSite=Strict")
		assert.False(t, sc.Secure, "plain HTTP: not Secure")
		assert.Equal(t, "/admin", sc.Path)
		assert.NotContains(t, sc.Value, testAdminToken)
		assert.NotContains(t, b.cookies, loginCookie, "the login visit ends")

		rec = b.get("/admin/bindings?thread=t1")
		require.Equal(t, http.StatusOK, rec.Code)
		assert.Contains(t, body(rec), "Log out")

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{})
		require.NoError(t, err)
		require.Len(t, entries, 2)
		assert.Equal(t, "login", entries[0].Action)
		assert.Equal(t, "admin-token", entries[0].Actor)
		assert.Equal(t, "192.0.2.10", entries[0].Address)
		assert.Equal(t, "login.failed", entries[1].Action)

		old := *b.cookies[sessionCookie]
		rec = b.post("/admin/logout", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.NotContains(t, b.cookies, sessionCookie, "the cookie is cleared")
		b.cookies[sessionCookie] = &old
		rec = b.get("/admin/")
		assert.Equal(t, http.StatusSeeOther, rec.Code, "a logged-out session is revoked, even if its cookie is replayed")
		_, total, err := s.AuditLog(ctx, store.AuditFilter{Action: "logout"})
		require.NoError(t, err)
		assert.Equal(t, 1, total)
	})
}

// Over TLS (directly or by a proxy's word) the cookies are Secure.
func TestCookiesSecureOverTLS(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	req := httptest.NewRequest(http.MethodGet, "https://relay.example/admin/login", nil)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	cs := rec.Result().Cookies()
	require.NotEmpty(t, cs)
	assert.True(t, cs[0].Secure)
}

// Login is a form like the others: without its CSRF token it is refused,
// even with the right admin token.
func TestLoginNeedsItsCSRFToken(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	rec := b.post("/admin/login", url.Values{"token": {testAdminToken}, "_csrf": {""}})
	assert.Equal(t, http.StatusForbidden, rec.Code, "no login visit, no token")
	b.get("/admin/login")
	rec = b.post("/admin/login", url.Values{"token": {testAdminToken}, "_csrf": {"forged"}})
	assert.Equal(t, http.StatusForbidden, rec.Code)
	assert.Contains(t, body(rec), "CSRF")
	assert.NotContains(t, b.cookies, sessionCookie)
	rec = b.post("/admin/login", url.Values{"token": {testAdminToken}})
	assert.Equal(t, http.StatusSeeOther, rec.Code)
}

// Login attempts are limited per client address: a burst, then one per
// refill period, for right and wrong tokens alike.
func TestLoginRateLimit(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	clk := &testClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Now: clk.Now})
	b := newBrowser(t, srv)
	b.get("/admin/login")
	for i := range loginBurst {
		rec := b.post("/admin/login", url.Values{"token": {"wrong"}})
		require.Equal(t, http.StatusUnauthorized, rec.Code, "attempt %d", i+1)
	}
	rec := b.post("/admin/login", url.Values{"token": {testAdminToken}})
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the right token does not get past the limit")
	assert.Equal(t, "30", rec.Header().Get("Retry-After"))
	assert.Contains(t, body(rec), "Too many login attempts")
	assert.NotContains(t, b.cookies, sessionCookie)

	neighbour := newBrowser(t, srv)
	neighbour.addr = "192.0.2.99:5555"
	neighbour.login() // another address has its own budget

	b.addr = "192.0.2.10:40001" // a new connection from the same address does not help
	rec = b.post("/admin/login", url.Values{"token": {testAdminToken}})
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)

	clk.Add(loginRefill)
	rec = b.post("/admin/login", url.Values{"token": {testAdminToken}})
	assert.Equal(t, http.StatusSeeOther, rec.Code, "one attempt more after the refill period")

	req := httptest.NewRequest(http.MethodPost, "/admin/login", strings.NewReader("token=x"))
	req.RemoteAddr = "192.0.2.10:40002"
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "a forwarded-for header does not buy a fresh budget")

	entries, _, err := s.AuditLog(context.Background(), store.AuditFilter{Action: "login.failed"})
	require.NoError(t, err)
	assert.Len(t, entries, loginBurst, "failed attempts are audited")
}

// Every state-changing console route refuses a request without the
// session's CSRF token, with another session's token, or marked cross-site.
func TestEveryConsoleWriteNeedsCSRF(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv, fr := consoleServer(t, s)
		ctx := context.Background()
		acc, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "k1", ThreadID: "t1", AccountID: acc.ID, Source: "admission", TTL: time.Hour}))
		b := newBrowser(t, srv)
		b.login()
		eve := newBrowser(t, srv)
		eve.login()

		n := 0
		for _, r := range srv.echo.Routes() {
			if !isConsole(r.Path) || r.Method != http.MethodPost || publicConsoleRoutes[r.Method+" "+r.Path] {
				continue
			}
			n++
			path := strings.ReplaceAll(r.Path, ":id", acc.ID)
			form := url.Values{"by": {"thread"}, "value": {"t1"}, "kind": {"thread"}, "account_id": {acc.ID}, "name": {"k"},
				"api_key": {"sk"}, "auth_json_text": {`{"OPENAI_API_KEY":"sk"}`}}
			for _, tc := range []struct {
				name, token, site string
			}{{"no token", "", ""}, {"another session's token", eve.csrf, ""}, {"a cross-site request", b.csrf, "cross-site"}} {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				f.Set("_csrf", tc.token)
				if tc.token == "" {
					f["_csrf"] = []string{""}
				}
				req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(withCSRF(f).Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				if tc.site != "" {
					req.Header.Set("Sec-Fetch-Site", tc.site)
				}
				rec := b.do(req)
				assert.Equal(t, http.StatusForbidden, rec.Code, "POST %s with %s", r.Path, tc.name)
				assert.Contains(t, body(rec), "CSRF", "POST %s with %s", r.Path, tc.name)
			}
		}
		assert.GreaterOrEqual(t, n, 8, "the console's writes were found")

		rows, _, err := s.Bindings(ctx, store.BindingFilter{})
		require.NoError(t, err)
		assert.Len(t, rows, 1, "no refused request reset anything")
		assert.Empty(t, fr.forgottenIDs())
		accounts, err := s.Accounts(ctx)
		require.NoError(t, err)
		assert.Len(t, accounts, 1, "no refused request added an account")
		assert.Equal(t, store.StatusActive, accounts[0].Status)
		rec := b.get("/admin/")
		assert.Equal(t, http.StatusOK, rec.Code, "the session survived")

		rec = b.post("/admin/bindings/reset", url.Values{"by": {"thread"}, "value": {"t1"}, "return": {"/admin/bindings"}})
		assert.Equal(t, http.StatusSeeOther, rec.Code, "with the token the same form works")
		req := httptest.NewRequest(http.MethodPost, "/admin/accounts/"+acc.ID+"/pause", nil)
		req.Header.Set(csrfHeader, b.csrf)
		rec = b.do(req)
		assert.Equal(t, http.StatusSeeOther, rec.Code, "the token may come as a header")
	})
}

// withCSRF drops an empty _csrf so that "no token" sends none.
func withCSRF(v url.Values) url.Values {
	if v.Get("_csrf") == "" {
		v.Del("_csrf")
	}
	return v
}

// Sessions survive a second replica with the same session key, and end
// when the admin token changes.
func TestSessionsAcrossReplicasAndTokens(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	a, _ := consoleServer(t, s)
	replica, _ := consoleServer(t, s)
	rotated := New(Config{Store: s, AdminTokenHash: HashAdminToken("rotated"), SessionKey: []byte("test session key")})
	b := newBrowser(t, a)
	b.login()
	b.h = replica
	assert.Equal(t, http.StatusOK, b.get("/admin/").Code, "another replica with the same key accepts the session")
	b.h = rotated
	assert.Equal(t, http.StatusSeeOther, b.get("/admin/").Code, "a new admin token ends the session")
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                              "/admin/",
		"/admin/":                       "/admin/",
		"/admin":                        "/admin",
		"/admin/bindings?thread=x":      "/admin/bindings?thread=x",
		"https://evil.example/admin/":   "/admin/",
		"//evil.example/admin/":         "/admin/",
		"/\\evil.example":               "/admin/",
		"/api/v1/accounts":              "/admin/",
		"/administrator":                "/admin/",
		"/admin/login?next=/admin/keys": "/admin/",
		"javascript:alert(1)":           "/admin/",
	} {
		assert.Equal(t, want, safeNext(in), "next=%q", in)
	}
}

// apiFrom sends GET /api/v1/accounts from addr with token (and, when xff is
// set, an X-Forwarded-For claiming another address).
func apiFrom(h http.Handler, addr, token, xff string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/api/v1/accounts", nil)
	req.RemoteAddr = addr
	req.Header.Set("Authorization", "Bearer "+token)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// The admin API limits failed admin-token attempts per client address: a
// burst, then one per refill period; an address out of attempts is refused
// with 429 and Retry-After, the right token too, while other addresses and
// requests without a token are not affected.
func TestAdminAPIFailureLimit(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	clk := &testClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Now: clk.Now})
	t.Cleanup(srv.Close)
	const flooder = "192.0.2.10:40000"
	codes := map[int]int{}
	for i := range 1000 {
		rec := apiFrom(srv, flooder, "cra_guess_"+strconvItoa(i), "")
		codes[rec.Code]++
		if i < apiFailureBurst {
			require.Equal(t, http.StatusUnauthorized, rec.Code, "attempt %d", i+1)
		} else if i == apiFailureBurst {
			require.Equal(t, http.StatusTooManyRequests, rec.Code, "attempt %d", i+1)
			assert.Equal(t, "30", rec.Header().Get("Retry-After"))
			assert.Contains(t, rec.Body.String(), `"code":"too_many_failures"`)
		}
	}
	assert.Equal(t, map[int]int{http.StatusUnauthorized: apiFailureBurst, http.StatusTooManyRequests: 1000 - apiFailureBurst}, codes)

	rec := apiFrom(srv, flooder, testAdminToken, "")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the right token from the flooding address is refused too")
	assert.Equal(t, "30", rec.Header().Get("Retry-After"))
	rec = apiFrom(srv, "192.0.2.10:40001", testAdminToken, "")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "a new connection from the same address does not help")
	rec = apiFrom(srv, "192.0.2.11:40000", testAdminToken, "192.0.2.10")
	assert.Equal(t, http.StatusOK, rec.Code, "another address has its own budget, whatever X-Forwarded-For says")
	rec = apiFrom(srv, flooder, testAdminToken, "192.0.2.12")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "a forwarded-for header does not buy a fresh budget")
	code, _, _ := callFrom(t, srv, flooder, http.MethodGet, "/api/v1/accounts", "", nil)
	assert.Equal(t, http.StatusUnauthorized, code, "no token: still told to send one")

	clk.Add(apiFailureRefill - time.Second)
	rec = apiFrom(srv, flooder, testAdminToken, "")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	clk.Add(time.Second)
	rec = apiFrom(srv, flooder, testAdminToken, "")
	assert.Equal(t, http.StatusOK, rec.Code, "the right token works once the refill period has passed")
	rec = apiFrom(srv, flooder, "cra_wrong", "")
	assert.Equal(t, http.StatusUnauthorized, rec.Code, "one failure more")
	rec = apiFrom(srv, flooder, "cra_wrong", "")
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)

	// Successes neither count nor reset an address's failures.
	const other = "198.51.100.7:5000"
	for range apiFailureBurst - 1 {
		require.Equal(t, http.StatusUnauthorized, apiFrom(srv, other, "cra_wrong", "").Code)
	}
	for range 50 {
		require.Equal(t, http.StatusOK, apiFrom(srv, other, testAdminToken, "").Code)
	}
	assert.Equal(t, http.StatusUnauthorized, apiFrom(srv, other, "cra_wrong", "").Code)
	assert.Equal(t, http.StatusTooManyRequests, apiFrom(srv, other, testAdminToken, "").Code)

	// Requests without a token are not attempts.
	for range 20 {
		code, _, _ := callFrom(t, srv, "198.51.100.8:1", http.MethodGet, "/api/v1/accounts", "", nil)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	assert.Equal(t, http.StatusOK, apiFrom(srv, "198.51.100.8:1", testAdminToken, "").Code)

	// An IPv6 client is limited by its /64.
	for i := range apiFailureBurst {
		apiFrom(srv, "[2001:db8:1:2::"+strconvItoa(i+1)+"]:443", "cra_wrong", "")
	}
	assert.Equal(t, http.StatusTooManyRequests, apiFrom(srv, "[2001:db8:1:2::ffff]:443", testAdminToken, "").Code)
	assert.Equal(t, http.StatusOK, apiFrom(srv, "[2001:db8:1:3::1]:443", testAdminToken, "").Code)
}

// A flood of wrong admin tokens makes a handful of audit rows, one per
// address per window, each naming its count; rows of a window are written
// by the first failure after it and by Close.
func TestAdminAPIFailuresAuditedInAggregate(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clk := &testClock{t: start}
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Now: clk.Now})
	ctx := context.Background()
	rows := func() []store.AuditEntry {
		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "api.auth_failed"})
		require.NoError(t, err)
		return entries
	}
	for i := range 1000 {
		apiFrom(srv, "192.0.2.10:40000", "cra_guess_"+strconvItoa(i), "")
	}
	for range 3 {
		apiFrom(srv, "192.0.2.20:40000", "cra_wrong", "")
	}
	assert.Zero(t, len(rows()), "the window is still open")

	clk.Add(failureWindow)
	apiFrom(srv, "192.0.2.10:40000", "cra_wrong_again", "") // the first failure after the window
	got := rows()
	require.Len(t, got, 2, "one row per address, not one per attempt")
	byTarget := map[string]store.AuditEntry{}
	for _, e := range got {
		byTarget[e.Target] = e
	}
	flood := byTarget["192.0.2.10"]
	assert.Equal(t, "anonymous", flood.Actor)
	assert.Equal(t, "192.0.2.10", flood.Address)
	assert.Equal(t, "1000 failed admin-token attempts since 2026-11-30T12:00:00Z (995 of them refused by the rate limit without a check)", flood.Detail)
	assert.Equal(t, "3 failed admin-token attempts since 2026-11-30T12:00:00Z", byTarget["192.0.2.20"].Detail)

	srv.Close()
	got = rows()
	require.Len(t, got, 3, "Close writes the open window's rows")
	assert.Equal(t, "1 failed admin-token attempt at 2026-11-30T12:01:00Z", got[0].Detail, "newest first")
}

// The timer ends a window with no failure after it; a timer that fires early
// (a clock behind it) writes nothing and waits for the rest of the window;
// past maxFailureTallies addresses, the others share one row.
func TestAuthFailuresWindow(t *testing.T) {
	clk := &testClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	var written [][]failureTally
	f := newAuthFailures(failureWindow, clk.Now, func(ts []failureTally) {
		if len(ts) > 0 {
			written = append(written, ts)
		}
	})
	var timers []func()
	var after []time.Duration
	f.after = func(d time.Duration, fn func()) func() bool {
		timers, after = append(timers, fn), append(after, d)
		return func() bool { return true }
	}
	for i := range maxFailureTallies + 5 {
		f.add("203.0.113."+strconvItoa(i%250)+":1", false) // 250 addresses...
		f.add("[2001:db8:"+strconvItoa(i)+"::1]:1", i%2 == 0)
	}
	require.Len(t, timers, 1, "one timer per window")
	assert.Equal(t, failureWindow, after[0])

	clk.Add(failureWindow / 2)
	timers[0]()
	assert.Empty(t, written, "early: nothing written")
	require.Len(t, timers, 2, "the timer is armed again for the rest of the window")
	assert.Equal(t, failureWindow/2, after[1])

	clk.Add(failureWindow / 2)
	timers[1]()
	require.Len(t, written, 1)
	rows := written[0]
	require.Len(t, rows, maxFailureTallies+1, "one row per address, up to the cap, and one for the others")
	others := rows[len(rows)-1]
	assert.Empty(t, others.addr)
	assert.Equal(t, 255, others.wrong+others.refused, "the addresses past the cap are counted together")
	assert.Contains(t, others.detail(), "from addresses beyond the first 1000")
	var total int
	for _, r := range rows {
		total += r.wrong + r.refused
	}
	assert.Equal(t, 2*(maxFailureTallies+5), total, "every attempt counted once")
	assert.Len(t, timers, 2, "no timer after the window closed")

	timers[0]() // a stale timer does nothing
	assert.Len(t, written, 1)
	f.close()
	assert.Len(t, written, 1, "nothing left to write")
}
