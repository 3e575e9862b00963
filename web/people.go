package web

import (
	"context"
	"errors"
	"net/http"
	"net/mail"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
)

// People: users with roles, and their personal tokens. A console session
// or a personal token names its user, read at every request (uncached, as
// the console's sessions are): a user disabled or deleted, or a token
// revoked, is refused at the next request on every replica.

// userPrincipal is who a signed-in user acts as in the console: their
// email, with their role narrowed by the token they signed in with (nil:
// none, as a single sign-on will).
func userPrincipal(u store.User, t *store.UserToken) principal {
	p := principal{Actor: u.Email, UserID: u.ID, Role: u.Role}
	if t != nil {
		p.TokenID, p.Role = t.ID, roles.Effective(u.Role, t.Role)
	}
	return p
}

// sessionPrincipal is who a console session acts as, if they still may:
// admin-token for a session of the admin token; else its user, not
// disabled, and the personal token it was signed in with, still usable.
func (s *Server) sessionPrincipal(ctx context.Context, sess session) (principal, bool) {
	if sess.UserID == "" {
		return adminPrincipal, true
	}
	u, err := s.cfg.Store.User(ctx, sess.UserID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
			s.log.Warn("console session: read its user", "err", err)
		}
		return principal{}, false
	}
	if u.Disabled() {
		return principal{}, false
	}
	var tp *store.UserToken
	if sess.TokenID != "" {
		t, err := s.cfg.Store.UserToken(ctx, u.ID, sess.TokenID)
		if err != nil || !t.Usable(s.cfg.Now()) {
			return principal{}, false
		}
		tp = &t
	}
	s.seeUser(ctx, u)
	return userPrincipal(u, tp), true
}

// seeUser records a user's activity, at most once a minute.
func (s *Server) seeUser(ctx context.Context, u store.User) {
	now := s.cfg.Now()
	if !u.LastSeenAt.IsZero() && now.Sub(u.LastSeenAt) < time.Minute {
		return
	}
	if err := s.cfg.Store.SeeUser(ctx, u.ID, now); err != nil && ctx.Err() == nil {
		s.log.Warn("record a user's activity", "err", err)
	}
}

// userView is a user as the API shows it.
type userView struct {
	ID         string     `json:"id"`
	Email      string     `json:"email"`
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	Disabled   bool       `json:"disabled"`
	CreatedAt  time.Time  `json:"created_at"`
	LastSeenAt *time.Time `json:"last_seen_at"`
	DisabledAt *time.Time `json:"disabled_at"`
}

func viewUser(u store.User) userView {
	return userView{ID: u.ID, Email: u.Email, Name: u.Name, Role: string(u.Role), Disabled: u.Disabled(),
		CreatedAt: u.CreatedAt, LastSeenAt: optTime(u.LastSeenAt), DisabledAt: optTime(u.DisabledAt)}
}

// tokenView is a personal token as the API lists it: never its secret.
type tokenView struct {
	ID         string     `json:"id"`
	UserID     string     `json:"user_id"`
	Name       string     `json:"name"`
	Role       string     `json:"role,omitempty"`
	Prefix     string     `json:"prefix"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	// Token is the secret, in the answer that created it only.
	Token string `json:"token,omitempty"`
}

func viewToken(t store.UserToken) tokenView {
	return tokenView{ID: t.ID, UserID: t.UserID, Name: t.Name, Role: string(t.Role), Prefix: t.Prefix, CreatedAt: t.CreatedAt,
		ExpiresAt: optTime(t.ExpiresAt), LastUsedAt: optTime(t.LastUsedAt), RevokedAt: optTime(t.RevokedAt)}
}

// userForm is the body of POST /users.
type userForm struct {
	Email string `json:"email"`
	Name  string `json:"name"`
	Role  string `json:"role"`
}

// check reads the form into a user, naming the field that is wrong.
func (f userForm) check() (store.User, error) {
	email := strings.TrimSpace(f.Email)
	if a, err := mail.ParseAddress(email); err != nil || a.Address != email || a.Name != "" {
		return store.User{}, badField("email", "must be an address (someone@example.com)")
	}
	r, err := parseRole("role", f.Role)
	if err != nil {
		return store.User{}, err
	}
	return store.User{Email: email, Name: strings.TrimSpace(f.Name), Role: r}, nil
}

func parseRole(field, v string) (roles.Role, error) {
	r, err := roles.Parse(strings.TrimSpace(v))
	if err != nil {
		return "", badField(field, "must be viewer, operator or admin")
	}
	return r, nil
}

func (s *Server) listUsers(c echo.Context) error {
	users, err := s.cfg.Store.Users(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]userView, len(users))
	for i, u := range users {
		out[i] = viewUser(u)
	}
	return c.JSON(http.StatusOK, map[string]any{"users": out})
}

func (s *Server) createUser(c echo.Context) error {
	var f userForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	u, err := f.check()
	if err != nil {
		return err
	}
	u, err = s.addUser(c, u)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, viewUser(u))
}

// addUser creates a user and audits it: the API's and the console's.
func (s *Server) addUser(c echo.Context, u store.User) (store.User, error) {
	u, err := s.cfg.Store.CreateUser(c.Request().Context(), u)
	if errors.Is(err, store.ErrConflict) {
		return store.User{}, &HTTPError{Status: http.StatusConflict, Code: "conflict", Field: "email", Msg: "email: a user with that address exists", Err: err}
	}
	if err != nil {
		return store.User{}, err
	}
	s.audit(c, "user.create", "user:"+u.ID, u.Email+" as "+string(u.Role))
	return u, nil
}

// userPatch is the body of PATCH /users/{id}; absent fields stay.
type userPatch struct {
	Name     *string `json:"name"`
	Role     *string `json:"role"`
	Disabled *bool   `json:"disabled"`
}

func (p userPatch) change() (store.UserChange, error) {
	ch := store.UserChange{Name: p.Name, Disabled: p.Disabled}
	if p.Role != nil {
		r, err := parseRole("role", *p.Role)
		if err != nil {
			return ch, err
		}
		ch.Role = &r
	}
	return ch, nil
}

func (s *Server) patchUser(c echo.Context) error {
	var p userPatch
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	ch, err := p.change()
	if err != nil {
		return err
	}
	u, err := s.updateUser(c, c.Param("id"), ch)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewUser(u))
}

// updateUser changes a user and audits what changed, before and after.
func (s *Server) updateUser(c echo.Context, id string, ch store.UserChange) (store.User, error) {
	before, after, err := s.cfg.Store.UpdateUser(c.Request().Context(), id, ch)
	if err != nil {
		return store.User{}, err
	}
	if d := userDiff(before, after); d != "" {
		s.audit(c, "user.update", "user:"+id, before.Email+": "+d)
	}
	return after, nil
}

// userDiff says what changed between two states of a user ("" for
// nothing): "role viewer → operator; disabled no → yes".
func userDiff(a, b store.User) string {
	var ch changes
	ch.add("name", a.Name, b.Name)
	if a.Role != b.Role {
		ch = append(ch, "role "+string(a.Role)+" → "+string(b.Role))
	}
	if a.Disabled() != b.Disabled() {
		ch = append(ch, "disabled "+yesNo(a.Disabled())+" → "+yesNo(b.Disabled()))
	}
	return ch.String()
}

func quoteOrNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return `"` + s + `"`
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (s *Server) deleteUser(c echo.Context) error {
	u, err := s.cfg.Store.DeleteUser(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	s.audit(c, "user.delete", "user:"+u.ID, u.Email+" ("+string(u.Role)+"), their tokens and sessions")
	return c.NoContent(http.StatusNoContent)
}

// ownTokens checks that the request may see and change the tokens of user
// id: their own, or anyone's for an admin. Another person's tokens need the
// admin role, so the refusal is role_required.
func ownTokens(c echo.Context, id string) error {
	if p := principalOf(c); p.UserID != "" && p.UserID == id {
		return nil
	}
	return checkRole(c, roles.Admin)
}

func (s *Server) listUserTokens(c echo.Context) error {
	id := c.Param("id")
	if err := ownTokens(c, id); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.cfg.Store.User(ctx, id); err != nil {
		return err
	}
	ts, err := s.cfg.Store.UserTokens(ctx, id)
	if err != nil {
		return err
	}
	out := make([]tokenView, len(ts))
	for i, t := range ts {
		out[i] = viewToken(t)
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": out})
}

// tokenForm is the body of POST /users/{id}/tokens.
type tokenForm struct {
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	ExpiresAt *time.Time `json:"expires_at"`
}

func (s *Server) createUserToken(c echo.Context) error {
	var f tokenForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	t, secret, err := s.makeToken(c, c.Param("id"), f)
	if err != nil {
		return err
	}
	v := viewToken(t)
	v.Token = secret
	return c.JSON(http.StatusCreated, v)
}

// makeToken makes a personal token for user id, if the request may (their
// own, or anyone's for an admin), and audits it: the API's and the
// console's.
func (s *Server) makeToken(c echo.Context, id string, f tokenForm) (store.UserToken, string, error) {
	if err := ownTokens(c, id); err != nil {
		return store.UserToken{}, "", err
	}
	t := store.UserToken{UserID: id, Name: strings.TrimSpace(f.Name)}
	if t.Name == "" {
		return store.UserToken{}, "", badField("name", "required")
	}
	if f.Role != "" {
		r, err := parseRole("role", f.Role)
		if err != nil {
			return store.UserToken{}, "", err
		}
		t.Role = r
	}
	if f.ExpiresAt != nil {
		if !f.ExpiresAt.After(s.cfg.Now()) {
			return store.UserToken{}, "", badField("expires_at", "must be in the future")
		}
		t.ExpiresAt = *f.ExpiresAt
	}
	ctx := c.Request().Context()
	u, err := s.cfg.Store.User(ctx, id)
	if err != nil {
		return store.UserToken{}, "", err
	}
	if t.Role != "" && !u.Role.Covers(t.Role) {
		return store.UserToken{}, "", badField("role", "a token's role narrows its user's: %s's is %s", u.Email, u.Role)
	}
	// A token made by its user never acts above the token (or session) it
	// was made with: a viewer token of an admin makes viewer tokens.
	if p := principalOf(c); p.UserID == id && !p.Role.Covers(u.Role) {
		t.Role = roles.Effective(p.Role, t.Role)
	}
	t, secret, err := s.cfg.Store.CreateUserToken(ctx, t)
	if err != nil {
		return store.UserToken{}, "", err
	}
	detail := u.Email + `: "` + t.Name + `"`
	if t.Role != "" {
		detail += " as " + string(t.Role)
	}
	if !t.ExpiresAt.IsZero() {
		detail += ", until " + t.ExpiresAt.UTC().Format(time.RFC3339)
	}
	s.audit(c, "token.create", "token:"+t.ID, detail)
	return t, secret, nil
}

func (s *Server) revokeUserToken(c echo.Context) error {
	t, err := s.revokeToken(c, c.Param("id"), c.Param("token_id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewToken(t))
}

// revokeToken revokes one of user id's tokens, if the request may, and
// audits it.
func (s *Server) revokeToken(c echo.Context, id, tokenID string) (store.UserToken, error) {
	if err := ownTokens(c, id); err != nil {
		return store.UserToken{}, err
	}
	t, err := s.cfg.Store.RevokeUserToken(c.Request().Context(), id, tokenID)
	if err != nil {
		return store.UserToken{}, err
	}
	s.audit(c, "token.revoke", "token:"+t.ID, `"`+t.Name+`"`)
	return t, nil
}
