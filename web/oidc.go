package web

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/labstack/echo/v4"
	"golang.org/x/oauth2"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// OIDC is the console's single sign-on with an OpenID Connect provider:
// the authorization code flow with PKCE, its state and nonce checked and
// the ID token verified against the issuer's keys. People appear on their
// first sign-in, with the role their claim maps to.
type OIDC struct {
	// Issuer is the provider's issuer URL (CODEX_RELAY_OIDC_ISSUER); its
	// discovery document is read on the first sign-in, and again after a
	// failure.
	Issuer       string
	ClientID     string
	ClientSecret string
	// RoleClaim names the ID token claim the roles are read from (a string
	// or a list of strings; CODEX_RELAY_OIDC_ROLE_CLAIM, default groups).
	RoleClaim string
	// Roles maps the claim's values to roles (see ParseRoleMap).
	Roles RoleMap
	// PublicURL is the console's origin as browsers reach it
	// (CODEX_RELAY_PUBLIC_URL): the redirect URI is
	// PublicURL/admin/oidc/callback.
	PublicURL string
	// Client is the HTTP client the provider is reached with (discovery,
	// keys, the code's exchange); nil: http.DefaultClient's transport with
	// a deadline.
	Client *http.Client
}

// oidcLoginTTL is how long a sign-in may take at the provider.
const oidcLoginTTL = 10 * time.Minute

// oidcStateCookie carries a sign-in's state in the browser that started
// it, so a callback is only taken from that browser (no one else's code can
// be slipped into it). It is SameSite=Lax: the provider's redirect back is
// a cross-site top-level navigation, on which a Strict cookie is not sent.
const oidcStateCookie = "codex_relay_oidc"

// oidcPath is where the sign-in's routes and its state cookie live.
const oidcPath = "/admin/oidc"

// RoleMap maps values of the role claim to roles: the first role (admin,
// then operator, then viewer) with a value the person's claim holds wins;
// "*" matches everyone, a default role. No match: the sign-in is refused.
type RoleMap map[roles.Role][]string

// ParseRoleMap reads CODEX_RELAY_OIDC_ROLES: comma-separated role=value
// pairs, a role named more than once taking every value
// ("admin=relay-admins,operator=relay-ops,viewer=*").
func ParseRoleMap(s string) (RoleMap, error) {
	m := RoleMap{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, ok := strings.Cut(part, "=")
		if !ok || strings.TrimSpace(value) == "" {
			return nil, fmt.Errorf("%q is not role=claim-value", part)
		}
		r, err := roles.Parse(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		m[r] = append(m[r], strings.TrimSpace(value))
	}
	if len(m) == 0 {
		return nil, errors.New("no role is mapped: give role=claim-value pairs, e.g. admin=relay-admins,viewer=*")
	}
	return m, nil
}

// RoleFor is the role a person whose claim holds values gets, and false
// when none is mapped to them.
func (m RoleMap) RoleFor(values []string) (roles.Role, bool) {
	for _, r := range []roles.Role{roles.Admin, roles.Operator, roles.Viewer} {
		for _, want := range m[r] {
			if want == "*" || slices.Contains(values, want) {
				return r, true
			}
		}
	}
	return "", false
}

// claimValues reads a claim that is a string or a list of strings.
func claimValues(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// oidcClient is the console's relying party: the provider, discovered once
// it answers.
type oidcClient struct {
	cfg OIDC
	mu  sync.Mutex
	p   *oidc.Provider // nil until discovered
}

func newOIDCClient(cfg OIDC) *oidcClient {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 15 * time.Second}
	}
	if cfg.RoleClaim == "" {
		cfg.RoleClaim = "groups"
	}
	return &oidcClient{cfg: cfg}
}

// provider discovers the issuer, once it answers.
func (o *oidcClient) provider(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.p != nil {
		return o.p, nil
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, o.cfg.Client), o.cfg.Issuer)
	if err != nil {
		return nil, err
	}
	o.p = p
	return p, nil
}

// oauth is the OAuth 2.0 side of the flow, for provider p.
func (o *oidcClient) oauth(p *oidc.Provider) *oauth2.Config {
	scopes := []string{oidc.ScopeOpenID, "email", "profile"}
	var disc struct {
		Scopes []string `json:"scopes_supported"`
	}
	if p.Claims(&disc) == nil && slices.Contains(disc.Scopes, o.cfg.RoleClaim) {
		scopes = append(scopes, o.cfg.RoleClaim) // the claim is asked for by a scope of its name (groups)
	}
	return &oauth2.Config{ClientID: o.cfg.ClientID, ClientSecret: o.cfg.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: strings.TrimRight(o.cfg.PublicURL, "/") + oidcPath + "/callback", Scopes: scopes}
}

// oidcStart begins a sign-in: its state, nonce and PKCE verifier stored
// for the callback (on whichever replica it reaches), the state also in
// this browser's cookie, and the browser sent to the provider.
func (s *Server) oidcStart(c echo.Context) error {
	if s.oidc == nil {
		return echo.ErrNotFound
	}
	ctx := c.Request().Context()
	p, err := s.oidc.provider(ctx)
	if err != nil {
		s.log.Warn("single sign-on: the provider's discovery failed", "issuer", s.oidc.cfg.Issuer, "err", err)
		return s.loginError(c, http.StatusBadGateway, "The single sign-on provider did not answer. Try again in a moment, or sign in with a token.")
	}
	now := s.cfg.Now()
	l := store.OIDCLogin{State: store.NewSecret(""), Nonce: store.NewSecret(""), Verifier: oauth2.GenerateVerifier(),
		Next: safeNext(c.QueryParam("next")), Created: now, Expires: now.Add(oidcLoginTTL)}
	if err := s.cfg.Store.PutOIDCLogin(ctx, l); err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: oidcStateCookie, Value: l.State, Path: oidcPath, MaxAge: int(oidcLoginTTL / time.Second),
		HttpOnly: true, Secure: secure(c), SameSite: http.SameSiteLaxMode})
	u := s.oidc.oauth(p).AuthCodeURL(l.State, oidc.Nonce(l.Nonce), oauth2.S256ChallengeOption(l.Verifier))
	return c.Redirect(http.StatusFound, u)
}

// oidcCallback finishes a sign-in. It is refused, with nothing signed in,
// unless the state is the one this browser started and still stands
// (taken here: a replayed callback finds none), the code is exchanged
// with its verifier, the ID token verifies against the issuer's keys (its
// issuer, audience and expiry), names the sign-in's nonce and a verified
// email, and the role claim maps to a role. The person is then found by
// email, or created, their role set to the mapped one; a disabled person
// is refused.
func (s *Server) oidcCallback(c echo.Context) error {
	if s.oidc == nil {
		return echo.ErrNotFound
	}
	ctx := c.Request().Context()
	state := c.QueryParam("state")
	cookie, _ := c.Cookie(oidcStateCookie)
	c.SetCookie(&http.Cookie{Name: oidcStateCookie, Value: "", Path: oidcPath, MaxAge: -1, HttpOnly: true, Secure: secure(c), SameSite: http.SameSiteLaxMode})
	refuse := func(status int, why, msg string) error {
		s.audit(c, "login.failed", "", "single sign-on: "+why)
		return s.loginError(c, status, msg)
	}
	if cookie == nil || state == "" || subtle.ConstantTimeCompare([]byte(cookie.Value), []byte(state)) != 1 {
		return refuse(http.StatusBadRequest, "state mismatch", "This sign-in was not started in this browser (its state does not match). Start it again.")
	}
	l, err := s.cfg.Store.TakeOIDCLogin(ctx, state, s.cfg.Now())
	if errors.Is(err, store.ErrNotFound) {
		return refuse(http.StatusBadRequest, "state unknown, used or expired", "This sign-in has expired or was used already. Start it again.")
	}
	if err != nil {
		return err
	}
	if e := c.QueryParam("error"); e != "" {
		return refuse(http.StatusUnauthorized, "the provider said "+e, "The single sign-on provider refused the sign-in ("+e+").")
	}
	p, err := s.oidc.provider(ctx)
	if err != nil {
		return s.loginError(c, http.StatusBadGateway, "The single sign-on provider did not answer. Try again in a moment.")
	}
	octx := oidc.ClientContext(ctx, s.oidc.cfg.Client)
	tok, err := s.oidc.oauth(p).Exchange(octx, c.QueryParam("code"), oauth2.VerifierOption(l.Verifier))
	if err != nil {
		return refuse(http.StatusUnauthorized, "code exchange refused: "+err.Error(), "The single sign-on provider refused the sign-in's code.")
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return refuse(http.StatusUnauthorized, "no ID token", "The single sign-on provider sent no ID token.")
	}
	idt, err := p.VerifierContext(octx, &oidc.Config{ClientID: s.oidc.cfg.ClientID, Now: s.cfg.Now}).Verify(octx, raw)
	if err != nil {
		return refuse(http.StatusUnauthorized, "ID token refused: "+err.Error(), "The ID token did not verify (its issuer, audience, signature or expiry).")
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(l.Nonce)) != 1 {
		return refuse(http.StatusUnauthorized, "nonce mismatch", "The ID token is not this sign-in's (its nonce does not match).")
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return refuse(http.StatusUnauthorized, "unreadable claims", "The ID token's claims could not be read.")
	}
	email, _ := claims["email"].(string)
	if verified, ok := claims["email_verified"].(bool); email == "" || ok && !verified {
		return refuse(http.StatusForbidden, "no verified email", "Your sign-in names no verified email address, which the relay knows people by.")
	}
	role, ok := s.oidc.cfg.Roles.RoleFor(claimValues(claims[s.oidc.cfg.RoleClaim]))
	if !ok {
		return refuse(http.StatusForbidden, "no role for "+email, "Your account has no role on this relay: ask its admin to add you to a group that has one.")
	}
	u, err := s.oidcPerson(c, email, nameOf(claims), role)
	if err != nil {
		return err
	}
	if u.Disabled() {
		return refuse(http.StatusForbidden, email+" is disabled", "Your account on this relay is disabled.")
	}
	p2 := userPrincipal(u, nil)
	token, sess := s.sessions.issueFor(purposeSession, sessionTTL, u.ID, "")
	if _, ok := s.sessions.lookup(ctx, sess.ID); !ok {
		return s.loginError(c, http.StatusServiceUnavailable, "Signed in, but the database did not store the session: try again in a moment.")
	}
	s.setCookie(c, sessionCookie, token, sessionTTL)
	c.Set(principalKey, p2)
	s.audit(c, "login", "", "single sign-on, role "+string(role))
	// The session cookie is SameSite=Strict, and this answer ends a chain
	// of redirects that began at the provider (cross-site): a redirect from
	// here would arrive without it. A page of the relay's own that moves on
	// starts a same-site navigation, which carries it.
	return s.render(c, http.StatusOK, ui.SignedInPage(ui.SignedIn{Next: l.Next}))
}

// oidcPerson is the person an SSO sign-in names: found by email, their
// role brought to the mapped one, or created with it; each change audited.
func (s *Server) oidcPerson(c echo.Context, email, name string, role roles.Role) (store.User, error) {
	ctx := c.Request().Context()
	u, err := s.cfg.Store.UserByEmail(ctx, email)
	switch {
	case errors.Is(err, store.ErrNotFound):
		u, err = s.cfg.Store.CreateUser(ctx, store.User{Email: email, Name: name, Role: role})
		if errors.Is(err, store.ErrConflict) { // another replica made them a moment ago
			u, err = s.cfg.Store.UserByEmail(ctx, email)
		} else if err == nil {
			s.auditAs(ctx, who{Actor: email, Address: c.RealIP()}, "user.create", "user:"+u.ID, u.Email+" as "+string(role)+", at their first single sign-on")
		}
		return u, err
	case err != nil:
		return store.User{}, err
	case u.Role != role && !u.Disabled():
		before, after, err := s.cfg.Store.UpdateUser(ctx, u.ID, store.UserChange{Role: &role})
		if err != nil {
			return store.User{}, err
		}
		s.auditAs(ctx, who{Actor: email, Address: c.RealIP()}, "user.update", "user:"+u.ID,
			email+": "+userDiff(before, after)+", from their single sign-on's claim")
		return after, nil
	}
	return u, nil
}

// nameOf is the display name an ID token gives.
func nameOf(claims map[string]any) string {
	for _, k := range []string{"name", "preferred_username"} {
		if v, ok := claims[k].(string); ok && v != "" {
			return v
		}
	}
	return ""
}

// loginError shows the login page with msg, at status.
func (s *Server) loginError(c echo.Context, status int, msg string) error {
	v := s.loginVisit(c)
	return s.render(c, status, ui.LoginPage(ui.Login{CSRF: s.sessions.csrf(purposeLogin, v), Next: "/admin/", Error: msg, SSO: s.oidc != nil}))
}
