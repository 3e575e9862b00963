package web

import (
	"cmp"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's actions: each form is parsed into a small struct, handed to
// the action shared with the API, and answered with a redirect that carries
// a flash message (or, for forms worth keeping, the page again with its
// values and the error).

// fixable reports whether err is the operator's to fix (a 4xx), with the
// message to show. Other errors go to the error handler.
func fixable(err error) (string, bool) {
	he := toHTTPError(err)
	return he.Msg, he.Status < 500
}

// safeReturn keeps a form's return address inside the console.
func safeReturn(ret, def string) string {
	if ret == "" || safeNext(ret) != ret {
		return def
	}
	return ret
}

// back answers an action with a redirect to ret and a flash for err (or ok).
func (s *Server) back(c echo.Context, ret string, err error, ok string) error {
	if err != nil {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		s.flash(c, "error", msg)
	} else {
		s.flash(c, "ok", ok)
	}
	return c.Redirect(http.StatusSeeOther, ret)
}

// accountAddForm is the console's add-account form.
type accountAddForm struct {
	Kind, Label, BaseURL, Organization, APIKey, AccessToken, RefreshToken, IDToken, AccountID, Email, Tags string
	ProxyURL                                                                                               string
}

func parseAccountAddForm(c echo.Context) accountAddForm {
	v := func(n string) string { return strings.TrimSpace(c.FormValue(n)) }
	return accountAddForm{Kind: v("kind"), Label: v("label"), BaseURL: v("base_url"), Organization: v("organization"),
		APIKey: v("api_key"), AccessToken: v("access_token"), RefreshToken: v("refresh_token"), IDToken: v("id_token"),
		AccountID: v("account_id"), Email: v("email"), Tags: v("tags"), ProxyURL: v("proxy_url")}
}

// AccountForm maps the console form onto the API's: blank fields are absent.
func (f accountAddForm) AccountForm() AccountForm {
	opt := optional
	out := AccountForm{Kind: opt(f.Kind), Label: opt(f.Label), BaseURL: opt(f.BaseURL), Organization: opt(f.Organization),
		APIKey: opt(f.APIKey), AccessToken: opt(f.AccessToken), RefreshToken: opt(f.RefreshToken), IDToken: opt(f.IDToken),
		AccountID: opt(f.AccountID), Email: opt(f.Email), ProxyURL: opt(f.ProxyURL)}
	if tags := splitComma(f.Tags); len(tags) > 0 {
		out.Tags = &tags
	}
	return out
}

func splitComma(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (s *Server) consoleAddAccount(c echo.Context) error {
	f := parseAccountAddForm(c)
	a, err := s.addAccount(c, f.AccountForm(), "account.create")
	if err != nil {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		// Show the form again with what was typed, credentials excepted.
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: msg})
		return s.renderAccounts(c, http.StatusBadRequest, ui.AccountForm{Kind: cmp.Or(f.Kind, "openai"), Label: f.Label,
			BaseURL: f.BaseURL, Organization: f.Organization, AccountID: f.AccountID, Email: f.Email, Tags: f.Tags})
	}
	return s.back(c, "/admin/accounts", nil, "Added account "+a.Label+".")
}

// maxAuthJSON bounds an uploaded auth.json (the console's body limit bounds
// a pasted one).
const maxAuthJSON = 512 << 10

// consoleImportAccount adds an account from a Codex auth.json, uploaded as a
// file (auth_json) or pasted (auth_json_text).
func (s *Server) consoleImportAccount(c echo.Context) error {
	var data []byte
	if fh, err := c.FormFile("auth_json"); err == nil && fh.Size > 0 {
		if fh.Size > maxAuthJSON {
			return s.back(c, "/admin/accounts", badField("auth_json", "the file is too large for an auth.json"), "")
		}
		file, err := fh.Open()
		if err != nil {
			return err
		}
		data, err = io.ReadAll(io.LimitReader(file, maxAuthJSON))
		file.Close()
		if err != nil {
			return err
		}
	} else {
		data = []byte(strings.TrimSpace(c.FormValue("auth_json_text")))
	}
	if len(data) == 0 {
		return s.back(c, "/admin/accounts", badField("auth_json", "choose an auth.json file or paste its content"), "")
	}
	added, refreshed, err := s.importAuthJSON(c, data, c.FormValue("label"), c.FormValue("organization"))
	if err != nil {
		return s.back(c, "/admin/accounts", err, "")
	}
	var parts []string
	if len(added) > 0 {
		parts = append(parts, "Imported "+strings.Join(added, ", ")+".")
	}
	if len(refreshed) > 0 {
		parts = append(parts, "Replaced the tokens of "+strings.Join(refreshed, ", ")+".")
	}
	return s.back(c, "/admin/accounts", nil, strings.Join(parts, " "))
}

// The pause, probe and resume forms come from the accounts list or an
// account's page (return) and go back there.

func (s *Server) consolePauseAccount(c echo.Context) error {
	a, err := s.setAccountPaused(c, c.Param("id"), true, c.FormValue("reason"))
	return s.back(c, safeReturn(c.FormValue("return"), "/admin/accounts"), err, "Paused "+a.Label+": it serves nothing until resumed.")
}

func (s *Server) consoleProbeAccount(c echo.Context) error {
	a, err := s.probeAccount(c, c.Param("id"))
	return s.back(c, safeReturn(c.FormValue("return"), "/admin/accounts"), err, "Probed "+a.Label+": "+string(a.Status)+".")
}

// consoleResumeAccount returns an account to service whatever kept it out
// (paused, limited until a reset, waiting for a new login), as the API's
// resume does.
func (s *Server) consoleResumeAccount(c echo.Context) error {
	a, err := s.setAccountPaused(c, c.Param("id"), false, "")
	return s.back(c, safeReturn(c.FormValue("return"), "/admin/accounts"), err, "Resumed "+a.Label+": it serves requests again.")
}

// bindingActionForm is the console's reset form (by: what to reset, value:
// its id) and pin form (kind: session or thread, value: its id, account_id),
// with the page to come back to.
type bindingActionForm struct {
	By, Kind, Value, AccountID, Return string
}

func parseBindingActionForm(c echo.Context) bindingActionForm {
	v := func(n string) string { return strings.TrimSpace(c.FormValue(n)) }
	return bindingActionForm{By: v("by"), Kind: v("kind"), Value: v("value"), AccountID: v("account_id"),
		Return: safeReturn(c.FormValue("return"), "/admin/bindings")}
}

func (f bindingActionForm) reset() (store.BindingReset, error) {
	if f.Value == "" {
		return store.BindingReset{}, badField("value", "give the id of what to reset")
	}
	switch f.By {
	case "binding":
		return store.BindingReset{BindingID: f.Value}, nil
	case "thread":
		return store.BindingReset{ThreadID: f.Value}, nil
	case "session":
		return store.BindingReset{SessionID: f.Value}, nil
	case "account":
		return store.BindingReset{AccountID: f.Value}, nil
	}
	return store.BindingReset{}, badField("by", "must be binding, thread, session or account")
}

func (s *Server) consoleResetBindings(c echo.Context) error {
	f := parseBindingActionForm(c)
	r, err := f.reset()
	if err != nil {
		return s.back(c, f.Return, err, "")
	}
	reset, err := s.resetBindings(c, r)
	if err != nil {
		return s.back(c, f.Return, err, "")
	}
	return s.back(c, f.Return, nil, resetMessage(f.By, f.Value, len(reset)))
}

// resetMessage says what a reset did, for the flash.
func resetMessage(by, value string, n int) string {
	switch {
	case by == "binding" && n == 0:
		return "Nothing to reset: binding " + value + " does not exist."
	case by == "binding":
		return "Reset binding " + value + "."
	case n == 0:
		return "Nothing to reset: no binding of " + by + " " + value + "."
	}
	return "Reset " + strconv.Itoa(n) + " " + plural(n, "binding", "bindings") + " of " + by + " " + value + "."
}

func (s *Server) consolePin(c echo.Context) error {
	f := parseBindingActionForm(c)
	kind := store.BindRawThread
	switch f.Kind {
	case "thread":
	case "session":
		kind = store.BindRawSession
	default:
		return s.back(c, f.Return, badField("kind", "must be thread or session"), "")
	}
	_, err := s.pinBinding(c, kind, f.Value, f.AccountID)
	return s.back(c, f.Return, err, "Pinned "+f.Kind+" "+f.Value+".")
}

// keyCreateForm is the console's create-key form; Limits is one limit a
// line (ParseLimitLines).
type keyCreateForm struct {
	Name, AccountTag, Models, ExpiresIn, Limits string
	AccountIDs                                  []string
}

func parseKeyCreateForm(c echo.Context) (keyCreateForm, error) {
	form, err := c.FormParams()
	if err != nil {
		return keyCreateForm{}, &HTTPError{Status: http.StatusBadRequest, Code: "invalid_form", Msg: "The form could not be read.", Err: err}
	}
	return keyCreateForm{Name: strings.TrimSpace(form.Get("name")), AccountTag: strings.TrimSpace(form.Get("account_tag")),
		Models: strings.TrimSpace(form.Get("models")), ExpiresIn: strings.TrimSpace(form.Get("expires_in")),
		Limits: form.Get("limits"), AccountIDs: form["account_ids"]}, nil
}

func (s *Server) consoleCreateKey(c echo.Context) error {
	f, err := parseKeyCreateForm(c)
	if err != nil {
		return err
	}
	limits, err := ParseLimitLines(f.Limits)
	var (
		k      store.ClientKey
		secret string
	)
	if err == nil {
		k, secret, err = s.issueKey(c, KeyForm{Name: f.Name, AccountIDs: f.AccountIDs, AccountTag: f.AccountTag,
			Models: splitComma(f.Models), ExpiresIn: f.ExpiresIn, Limits: limits})
	}
	if err != nil {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: msg})
		return s.renderKeys(c, http.StatusBadRequest, nil, ui.KeyForm{Name: f.Name, Tag: f.AccountTag, Models: f.Models,
			ExpiresIn: f.ExpiresIn, Limits: f.Limits})
	}
	if v, err := s.viewKeyUse(c.Request().Context(), k); err == nil && len(v.Warnings) > 0 {
		c.Set(flashNowKey, &ui.Flash{Kind: "warn", Text: "Warning: " + strings.Join(v.Warnings, "; ") + "."})
	}
	return s.renderKeys(c, http.StatusOK, &ui.CreatedKey{Name: k.Name, Secret: secret}, ui.KeyForm{})
}

func (s *Server) consoleRevokeKey(c echo.Context) error {
	k, err := s.revokeKeyByID(c, c.Param("id"))
	return s.back(c, "/admin/keys", err, "Revoked key "+k.Name+": clients using it are refused from now on.")
}
