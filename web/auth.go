package web

import (
	"context"
	"crypto/hmac"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/ratelimit"
	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// Context keys set by the auth middlewares.
const (
	principalKey = "codex_relay.principal" // who acts, a principal
	sessionKey   = "codex_relay.session"   // the console session, a session
)

// actorAdminToken is the audit log's actor for the admin token, in the
// console and on the API alike: the break-glass owner, not a person.
const actorAdminToken = "admin-token"

// actorAnonymous is the actor of a failed sign-in or API attempt: whoever
// it was did not show who they are.
const actorAnonymous = "anonymous"

// principal is who a request acts as, and with which role: the admin token
// (role admin), a person signed into the console, or a personal token.
type principal struct {
	// Actor names them in the audit log: a user's email, token:<name>, or
	// admin-token.
	Actor string
	// UserEmail is the person behind a token; "" otherwise.
	UserEmail string
	// UserID is the user acting (through the console or a token); "" for
	// the admin token.
	UserID string
	// TokenID is the personal token a request or a console session bears.
	TokenID string
	Role    roles.Role
}

// adminPrincipal is the admin token's.
var adminPrincipal = principal{Actor: actorAdminToken, Role: roles.Admin}

// tokenPrincipal is a personal token's: it acts with the lower of its own
// role and its user's.
func tokenPrincipal(t store.UserToken, u store.User) principal {
	return principal{Actor: "token:" + t.Name, UserEmail: u.Email, UserID: u.ID, TokenID: t.ID, Role: roles.Effective(u.Role, t.Role)}
}

// principalOf is who the request acts as; none (no role) before the auth
// middlewares have run.
func principalOf(c echo.Context) principal {
	p, _ := c.Get(principalKey).(principal)
	return p
}

// requireRole refuses a request whose principal's role does not cover
// need, before the handler runs: nothing happens but the 403.
func requireRole(need roles.Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if err := checkRole(c, need); err != nil {
				return err
			}
			return next(c)
		}
	}
}

// checkRole is requireRole's test, for a handler whose need depends on what
// it is asked (another person's tokens need admin).
func checkRole(c echo.Context, need roles.Role) error {
	if principalOf(c).Role.Covers(need) {
		return nil
	}
	return roleRequired(need)
}

func roleRequired(need roles.Role) *HTTPError {
	return &HTTPError{Status: http.StatusForbidden, Type: "forbidden", Code: "role_required",
		Msg: "this needs the " + string(need) + " role"}
}

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

// requireSession admits console requests of a signed-in session whose
// person may still sign in: one signed in with the admin token acts as
// admin-token, a person as their email with their role (narrowed by the
// personal token they signed in with, which must still stand). Others are
// sent to the login page (reads) or refused (writes).
func (s *Server) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		sess, ok := s.currentSession(c)
		var p principal
		if ok {
			p, ok = s.sessionPrincipal(c.Request().Context(), sess)
		}
		if !ok {
			r := c.Request()
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				return c.Redirect(http.StatusSeeOther, "/admin/login?next="+url.QueryEscape(r.URL.RequestURI()))
			}
			return &HTTPError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "Log in to the console first."}
		}
		c.Set(sessionKey, sess)
		c.Set(principalKey, p)
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
	return s.render(c, http.StatusOK, ui.LoginPage(ui.Login{CSRF: s.sessions.csrf(purposeLogin, v), Next: next, SSO: s.oidc != nil}))
}

// loginForm is the body of POST /admin/login.
type loginForm struct {
	Token string `form:"token"`
	Next  string `form:"next"`
}

// login signs in with the admin token (as admin-token) or a personal
// token (as its user, with its role). Attempts are rate-limited per client
// address and audited, failures included.
func (s *Server) login(c echo.Context) error {
	f := loginForm{Token: strings.TrimSpace(c.FormValue("token")), Next: safeNext(c.FormValue("next"))}
	v := s.loginVisit(c)
	page := ui.Login{CSRF: s.sessions.csrf(purposeLogin, v), Next: f.Next, SSO: s.oidc != nil}
	if ok, wait := s.limiter.Allow(c.RealIP()); !ok {
		secs := int(wait / time.Second)
		c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
		page.Error = "Too many login attempts from your address. Try again in " + strconv.Itoa(secs) + " s."
		return s.render(c, http.StatusTooManyRequests, ui.LoginPage(page))
	}
	if err := s.checkCSRF(c, s.sessions.csrf(purposeLogin, v)); err != nil {
		return err
	}
	if s.cfg.NoAdminTokenLogin && s.adminToken(f.Token) {
		admin, err := s.anAdminExists(c.Request().Context())
		if err != nil {
			return err
		}
		if admin {
			s.audit(c, "login.failed", "", "the admin token, whose console sign-in is off")
			page.Error = "The admin token does not sign in to this console (CODEX_RELAY_ADMIN_TOKEN_LOGIN=off): sign in with single sign-on or a personal token."
			return s.render(c, http.StatusUnauthorized, ui.LoginPage(page))
		}
	}
	p, ok, err := s.loginPrincipal(c.Request().Context(), f.Token)
	if err != nil {
		return err
	}
	if !ok {
		s.audit(c, "login.failed", "", "wrong token")
		page.Error = "That is not the admin token, nor a personal token that stands (not revoked or expired, its user not disabled)."
		return s.render(c, http.StatusUnauthorized, ui.LoginPage(page))
	}
	token, sess := s.sessions.issueFor(purposeSession, sessionTTL, p.UserID, p.TokenID)
	if _, ok := s.sessions.lookup(c.Request().Context(), sess.ID); !ok {
		// Its row was not stored (the log says why): no replica would
		// take the cookie, so say so here rather than loop to this page.
		page.Error = "Signed in, but the database did not store the session: try again in a moment."
		return s.render(c, http.StatusServiceUnavailable, ui.LoginPage(page))
	}
	s.setCookie(c, sessionCookie, token, sessionTTL)
	s.clearCookie(c, loginCookie)
	c.Set(principalKey, p)
	s.audit(c, "login", "", "role "+string(p.Role))
	return c.Redirect(http.StatusSeeOther, f.Next)
}

// loginPrincipal is who a token given to the login form signs in as: the
// admin token's owner, or a personal token's user (as their email, with
// the token's role). ok is false for any other token.
func (s *Server) loginPrincipal(ctx context.Context, token string) (principal, bool, error) {
	if token == "" {
		return principal{}, false, nil
	}
	if s.adminToken(token) {
		return adminPrincipal, true, nil
	}
	t, u, err := s.cfg.Store.AuthenticateUserToken(ctx, token)
	if errors.Is(err, store.ErrTokenRejected) {
		return principal{}, false, nil
	}
	if err != nil {
		return principal{}, false, err
	}
	return userPrincipal(u, &t), true, nil
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

// anAdminExists reports whether a person with the admin role may sign in.
func (s *Server) anAdminExists(ctx context.Context) (bool, error) {
	users, err := s.cfg.Store.Users(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(users, func(u store.User) bool { return u.Role == roles.Admin && !u.Disabled() }), nil
}
