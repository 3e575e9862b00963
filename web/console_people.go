package web

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's People page: the API's users routes as forms (addUser and
// updateUser are theirs too, so the checks and the audit are the same).

func roleChoices(selected roles.Role) []ui.Option {
	out := make([]ui.Option, len(roles.All))
	for i, r := range roles.All {
		out[i] = ui.Option{Value: string(r), Label: string(r), Selected: r == selected}
	}
	return out
}

func (s *Server) peoplePage(c echo.Context) error {
	return s.renderPeople(c, http.StatusOK, ui.PersonForm{Roles: roleChoices(roles.Viewer)})
}

func (s *Server) renderPeople(c echo.Context, status int, form ui.PersonForm) error {
	users, err := s.cfg.Store.Users(c.Request().Context())
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	p := ui.People{Form: form}
	for _, u := range users {
		r := ui.PersonRow{ID: u.ID, Email: u.Email, Name: u.Name, Role: string(u.Role), State: "active", Tone: "ok",
			LastSeen: ago(now, u.LastSeenAt), Created: stamp(u.CreatedAt), Disabled: u.Disabled(), Roles: roleChoices(u.Role)}
		if u.Disabled() {
			r.State, r.Tone = "disabled", "bad"
		}
		p.Users = append(p.Users, r)
	}
	return s.render(c, status, ui.PeoplePage(s.frame(c, "people", "People"), p))
}

func (s *Server) consoleAddUser(c echo.Context) error {
	f := userForm{Email: c.FormValue("email"), Name: c.FormValue("name"), Role: c.FormValue("role")}
	again := func(err error) error {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: msg})
		r, _ := roles.Parse(f.Role)
		return s.renderPeople(c, toHTTPError(err).Status, ui.PersonForm{Email: strings.TrimSpace(f.Email), Name: f.Name, Roles: roleChoices(r)})
	}
	u, err := f.check()
	if err != nil {
		return again(err)
	}
	if u, err = s.addUser(c, u); err != nil {
		return again(err)
	}
	return s.back(c, "/admin/people", nil, "Added "+u.Email+" as "+string(u.Role)+".")
}

// consoleUpdateUser changes a person's role (do=role) or disables or
// enables them (do=disable, do=enable).
func (s *Server) consoleUpdateUser(c echo.Context) error {
	var ch store.UserChange
	switch c.FormValue("do") {
	case "role":
		r, err := parseRole("role", c.FormValue("role"))
		if err != nil {
			return s.back(c, "/admin/people", err, "")
		}
		ch.Role = &r
	case "disable", "enable":
		off := c.FormValue("do") == "disable"
		ch.Disabled = &off
	default:
		return s.back(c, "/admin/people", badField("do", "must be role, disable or enable"), "")
	}
	u, err := s.updateUser(c, c.Param("id"), ch)
	if err != nil {
		return s.back(c, "/admin/people", err, "")
	}
	state := "enabled"
	if u.Disabled() {
		state = "disabled: their sessions and tokens stop at their next request"
	}
	return s.back(c, "/admin/people", nil, u.Email+" is "+string(u.Role)+", "+state+".")
}
