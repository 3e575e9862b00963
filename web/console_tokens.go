package web

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's tokens page: a person's own personal tokens, or, for an
// admin, anyone's (?user= from People). It makes and revokes them through
// makeToken and revokeToken, the API's, so the checks and audit are one.

// tokensUser is whose tokens the page is about: the user= field, else the
// signed-in person ("" for the admin token).
func tokensUser(c echo.Context) string {
	if id := strings.TrimSpace(c.FormValue("user")); id != "" {
		return id
	}
	return principalOf(c).UserID
}

func tokensURL(c echo.Context, id string) string {
	if id == "" || id == principalOf(c).UserID {
		return "/admin/tokens"
	}
	return "/admin/tokens?user=" + id
}

func (s *Server) tokensPage(c echo.Context) error {
	return s.renderTokens(c, http.StatusOK, tokensUser(c), nil)
}

func (s *Server) renderTokens(c echo.Context, status int, id string, created *ui.CreatedKey) error {
	p := ui.Tokens{Created: created}
	title := "Your tokens"
	if id != "" {
		if err := ownTokens(c, id); err != nil {
			return err
		}
		ctx := c.Request().Context()
		u, err := s.cfg.Store.User(ctx, id)
		if err != nil {
			return err
		}
		ts, err := s.cfg.Store.UserTokens(ctx, id)
		if err != nil {
			return err
		}
		now := s.cfg.Now()
		p.UserID, p.Email, p.Role = u.ID, u.Email, string(u.Role)
		// The new token's role: theirs (as the request may grant it) or
		// any narrower one.
		p.Roles = []ui.Option{{Value: "", Label: "theirs (" + string(u.Role) + ")", Selected: true}}
		for _, r := range roles.All {
			if u.Role.Covers(r) && r != u.Role {
				p.Roles = append(p.Roles, ui.Option{Value: string(r), Label: string(r)})
			}
		}
		for _, t := range ts {
			p.Tokens = append(p.Tokens, tokenRow(t, now))
		}
		if id != principalOf(c).UserID {
			title = "Tokens of " + u.Email
		}
	}
	if id != "" || principalOf(c).UserID == "" {
		rows, err := s.sessionRows(c, id)
		if err != nil {
			return err
		}
		p.Sessions = rows
	}
	nav := "tokens"
	if id != principalOf(c).UserID {
		nav = "people"
	}
	return s.render(c, status, ui.TokensPage(s.frame(c, nav, title), p))
}

func tokenRow(t store.UserToken, now time.Time) ui.TokenRow {
	r := ui.TokenRow{ID: t.ID, Name: t.Name, Prefix: t.Prefix, Role: string(t.Role), State: "active", Tone: "ok",
		Expires: "never", LastUsed: ago(now, t.LastUsedAt), Created: stamp(t.CreatedAt), Revoked: !t.RevokedAt.IsZero()}
	if r.Role == "" {
		r.Role = "theirs"
	}
	if !t.ExpiresAt.IsZero() {
		r.Expires = until(now, t.ExpiresAt)
	}
	switch {
	case r.Revoked:
		r.State, r.Tone = "revoked", "bad"
	case !t.Usable(now):
		r.State, r.Tone = "expired", "warn"
	}
	return r
}

func (s *Server) consoleMakeToken(c echo.Context) error {
	id := tokensUser(c)
	if err := ownTokens(c, id); err != nil && id != "" {
		return err // another person's: refused as the role middleware refuses
	}
	f := tokenForm{Name: c.FormValue("name"), Role: strings.TrimSpace(c.FormValue("role"))}
	if in := strings.TrimSpace(c.FormValue("expires_in")); in != "" {
		d, err := time.ParseDuration(in)
		if err != nil || d <= 0 {
			return s.back(c, tokensURL(c, id), badField("expires_in", "must be a positive duration such as 720h"), "")
		}
		at := s.cfg.Now().Add(d)
		f.ExpiresAt = &at
	}
	if id == "" {
		return s.back(c, "/admin/people", badField("user", "the admin token has no tokens: pick a person"), "")
	}
	t, secret, err := s.makeToken(c, id, f)
	if err != nil {
		return s.back(c, tokensURL(c, id), err, "")
	}
	return s.renderTokens(c, http.StatusOK, id, &ui.CreatedKey{Name: t.Name, Secret: secret})
}

func (s *Server) consoleRevokeToken(c echo.Context) error {
	id := tokensUser(c)
	if err := ownTokens(c, id); err != nil {
		return err
	}
	t, err := s.revokeToken(c, id, c.Param("id"))
	return s.back(c, tokensURL(c, id), err, "Revoked token "+t.Name+": its next request is refused.")
}

// sessionRows lists the standing console sessions of user ("": the admin
// token's), the one this request comes in marked.
func (s *Server) sessionRows(c echo.Context, user string) ([]ui.SessionRow, error) {
	now := s.cfg.Now()
	list, err := s.cfg.Store.ConsoleSessionsOf(c.Request().Context(), user, now)
	if err != nil {
		return nil, err
	}
	this, _ := c.Get(sessionKey).(session)
	rows := make([]ui.SessionRow, len(list))
	for i, cs := range list {
		via := "single sign-on"
		switch {
		case user == "":
			via = "the admin token"
		case cs.TokenID != "":
			via = "a personal token"
		}
		rows[i] = ui.SessionRow{Created: stamp(cs.Created), Seen: ago(now, cs.Seen), Expires: until(now, cs.Expires), Via: via, This: cs.ID == this.ID}
	}
	return rows, nil
}

// consoleSignOutEverywhere signs out every console session of a person
// (one's own; an admin may do it for anyone), this one too when it is
// theirs, on every replica at its next request.
func (s *Server) consoleSignOutEverywhere(c echo.Context) error {
	id := tokensUser(c)
	if id != "" {
		if err := ownTokens(c, id); err != nil {
			return err
		}
	} else if err := checkRole(c, roles.Admin); err != nil {
		return err // the admin token's sessions: the admin token's to end
	}
	n, err := s.cfg.Store.RevokeConsoleSessionsOf(c.Request().Context(), id, s.cfg.Now())
	if err != nil {
		return err
	}
	target := "the admin token"
	if id != "" {
		target = "user:" + id
	}
	s.audit(c, "sessions.revoke", target, fmt.Sprintf("%d %s signed out everywhere", n, plural(int(n), "session", "sessions")))
	if id == principalOf(c).UserID {
		s.clearCookie(c, sessionCookie)
		return c.Redirect(http.StatusSeeOther, "/admin/login")
	}
	return c.Redirect(http.StatusSeeOther, tokensURL(c, id))
}
