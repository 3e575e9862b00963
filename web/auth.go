package web

import (
	"crypto/hmac"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/ratelimit"
	"github.com/codexrelay/codex-relay/web/ui"
)

// Context keys set by the auth middlewares.
const (
	actorKey   = "codex_relay.actor"   // who acts: actorAdmin or actorAPI
	sessionKey = "codex_relay.session" // the console session, a session
)

// Actors, as the audit log names them.
const (
	actorAdmin = "admin" // the console
	actorAPI   = "api"   // a bearer-token client of /api/v1
)

// Login attempts per client address: a burst of loginBurst, then one more
// every loginRefill. Successful logins count too, so the limit cannot be
// reset by a token the attacker already has.
const (
	loginBurst  = ratelimit.DefaultBurst
	loginRefill = ratelimit.DefaultRefill
)

// csrfField is the form field, and csrfHeader the header, that carry the
// CSRF token of a state-changing console request.
const (
	csrfField  = "_csrf"
	csrfHeader = "X-CSRF-Token"
)

// secure reports whether cookies must be Secure: the request came over TLS,
// directly or through a proxy that says so.
func secure(c echo.Context) bool { return c.Scheme() == "https" }

func (s *Server) setCookie(c echo.Context, name, value string, ttl time.Duration) {
	c.SetCookie(&http.Cookie{Name: name, Value: value, Path: cookiePath, MaxAge: int(ttl / time.Second),
		HttpOnly: true, Secure: secure(c), SameSite: http.SameSiteStrictMode})
}

func (s *Server) clearCookie(c echo.Context, name string) {
	c.SetCookie(&http.Cookie{Name: name, Value: "", Path: cookiePath, MaxAge: -1,
		HttpOnly: true, Secure: secure(c), SameSite: http.SameSiteStrictMode})
}

// currentSession returns the verified session of the request's cookie.
func (s *Server) currentSession(c echo.Context) (session, bool) {
	ck, err := c.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	return s.sessions.verify(c.Request().Context(), purposeSession, ck.Value)
}

// requireSession admits console requests of a logged-in operator; their
// actions are audited as actor "admin". Others are sent to the login page
// (reads) or refused (writes).
func (s *Server) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		sess, ok := s.currentSession(c)
		if !ok {
			r := c.Request()
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				return c.Redirect(http.StatusSeeOther, "/admin/login?next="+url.QueryEscape(r.URL.RequestURI()))
			}
			return &HTTPError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "Log in to the console first."}
		}
		c.Set(sessionKey, sess)
		c.Set(actorKey, actorAdmin)
		return next(c)
	}
}

// requireCSRF refuses state-changing console requests that do not carry the
// session's CSRF token (form field _csrf or header X-CSRF-Token), or that a
// browser marks as cross-site. It runs after requireSession.
func (s *Server) requireCSRF(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		switch c.Request().Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			return next(c)
		}
		sess, _ := c.Get(sessionKey).(session)
		if err := s.checkCSRF(c, s.sessions.csrf(purposeSession, sess)); err != nil {
			return err
		}
		return next(c)
	}
}

var errCSRF = &HTTPError{Status: http.StatusForbidden, Code: "csrf_failed",
	Msg: "This form is stale or did not come from the console (missing or wrong CSRF token). Reload the page and try again."}

func (s *Server) checkCSRF(c echo.Context, want string) error {
	if c.Request().Header.Get("Sec-Fetch-Site") == "cross-site" {
		return errCSRF
	}
	got := c.Request().Header.Get(csrfHeader)
	if got == "" {
		got = c.FormValue(csrfField)
	}
	if got == "" || want == "" || !hmac.Equal([]byte(got), []byte(want)) {
		return errCSRF
	}
	return nil
}

// loginVisit returns the login-page visit of the request, starting one (and
// setting its cookie) when there is none.
func (s *Server) loginVisit(c echo.Context) session {
	if ck, err := c.Cookie(loginCookie); err == nil {
		if v, ok := s.sessions.verify(c.Request().Context(), purposeLogin, ck.Value); ok {
			return v
		}
	}
	token, v := s.sessions.issue(purposeLogin, loginTTL)
	s.setCookie(c, loginCookie, token, loginTTL)
	return v
}

// safeNext keeps a post-login destination inside the console.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(next, "//") || strings.Contains(next, `\`) ||
		!(u.Path == "/admin" || strings.HasPrefix(u.Path, "/admin/")) || strings.HasPrefix(u.Path, "/admin/login") {
		return "/admin/"
	}
	return u.RequestURI()
}

func (s *Server) loginPage(c echo.Context) error {
	next := safeNext(c.QueryParam("next"))
	if _, ok := s.currentSession(c); ok {
		return c.Redirect(http.StatusSeeOther, next)
	}
	v := s.loginVisit(c)
	return s.render(c, http.StatusOK, ui.LoginPage(ui.Login{CSRF: s.sessions.csrf(purposeLogin, v), Next: next}))
}

// loginForm is the body of POST /admin/login.
type loginForm struct {
	Token string `form:"token"`
	Next  string `form:"next"`
}

// login checks the admin token. Attempts are rate-limited per client address
// and audited, failures included.
func (s *Server) login(c echo.Context) error {
	f := loginForm{Token: c.FormValue("token"), Next: safeNext(c.FormValue("next"))}
	v := s.loginVisit(c)
	page := ui.Login{CSRF: s.sessions.csrf(purposeLogin, v), Next: f.Next}
	if ok, wait := s.limiter.Allow(c.RealIP()); !ok {
		secs := int(wait / time.Second)
		c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
		page.Error = "Too many login attempts from your address. Try again in " + strconv.Itoa(secs) + " s."
		return s.render(c, http.StatusTooManyRequests, ui.LoginPage(page))
	}
	if err := s.checkCSRF(c, s.sessions.csrf(purposeLogin, v)); err != nil {
		return err
	}
	if strings.TrimSpace(f.Token) == "" || !s.adminToken(strings.TrimSpace(f.Token)) {
		s.audit(c, "login.failed", "", "wrong admin token")
		page.Error = "That is not the admin token."
		return s.render(c, http.StatusUnauthorized, ui.LoginPage(page))
	}
	token, sess := s.sessions.issue(purposeSession, sessionTTL)
	if _, ok := s.sessions.lookup(c.Request().Context(), sess.ID); !ok {
		// Its row was not stored (the log says why): no replica would
		// take the cookie, so say so here rather than loop to this page.
		page.Error = "Signed in, but the database did not store the session: try again in a moment."
		return s.render(c, http.StatusServiceUnavailable, ui.LoginPage(page))
	}
	s.setCookie(c, sessionCookie, token, sessionTTL)
	s.clearCookie(c, loginCookie)
	s.audit(c, "login", "", "")
	return c.Redirect(http.StatusSeeOther, f.Next)
}

// logout ends the session: the cookie is cleared and the session revoked.
func (s *Server) logout(c echo.Context) error {
	var err error
	if sess, ok := c.Get(sessionKey).(session); ok {
		err = s.sessions.revoke(c.Request().Context(), sess)
	}
	s.clearCookie(c, sessionCookie)
	if err != nil {
		// This browser is signed out; the session's row is not, so another
		// replica would still take a copy of the cookie until it ends.
		return &HTTPError{Status: http.StatusServiceUnavailable, Code: "store_unavailable",
			Msg: "signed out in this browser, but the database did not record it: the session still stands elsewhere until it ends; sign in and out again once the database answers"}
	}
	s.audit(c, "logout", "", "")
	return c.Redirect(http.StatusSeeOther, "/admin/login")
}
