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
		assert.Equal(t, "admin", entries[0].Actor)
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

func TestLoginLimiterForgetsIdleAddresses(t *testing.T) {
	clk := &testClock{t: time.Unix(0, 0)}
	l := newLoginLimiter(2, time.Second, clk.Now)
	for i := range limiterMaxAddrs {
		ok, _ := l.allow("a" + strconvItoa(i))
		require.True(t, ok)
	}
	clk.Add(time.Hour)
	ok, _ := l.allow("new")
	assert.True(t, ok)
	assert.Len(t, l.buckets, 1, "refilled buckets are dropped when the table is full")
	for i := range 2 * limiterMaxAddrs {
		l.allow("b" + strconvItoa(i))
	}
	assert.LessOrEqual(t, len(l.buckets), limiterMaxAddrs, "memory stays bounded under many addresses")
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
