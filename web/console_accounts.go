package web

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// An account's console page: its state, usage and load, the actions of the
// list (pause, resume, probe), the form that edits its settings and the way
// to remove it. The form saves through updateAccount, as PATCH
// /api/v1/accounts/{id} does, so the two accept and refuse the same input
// with the same messages; removal goes through removeAccount, as DELETE
// does, after a page that says what it does.

func accountURL(id string) string { return "/admin/accounts/" + url.PathEscape(id) }

// resumeHint says what Resume does for an account in status st, for the
// button's title; "" when there is nothing to resume (st is active).
func resumeHint(st store.Status) string {
	switch st {
	case store.StatusActive:
		return ""
	case store.StatusPaused:
		return "return it to service"
	case store.StatusRateLimited, store.StatusQuotaExceeded:
		return "return it to service now, before its reset: the upstream may limit it again"
	case store.StatusReauthRequired:
		return "return it to service with the tokens it has: their refresh was refused, so sign in again unless that is fixed"
	}
	return "return it to service"
}

// accountEditForm is the account page's form as typed. Every field but the
// proxy is sent every time: a blank tags field clears the tags. The proxy
// is changed only when one is typed, or removed when NoProxy is ticked.
type accountEditForm struct {
	Label, BaseURL, Organization, Tags, Priority, MaxConcurrency string
	AccountID, Email, PlanType                                   string // ChatGPT accounts only
	ProxyURL                                                     string
	NoProxy                                                      bool
}

func parseAccountEditForm(c echo.Context) accountEditForm {
	v := func(n string) string { return strings.TrimSpace(c.FormValue(n)) }
	return accountEditForm{Label: v("label"), BaseURL: v("base_url"), Organization: v("organization"), Tags: v("tags"),
		Priority: v("priority"), MaxConcurrency: v("max_concurrency"), AccountID: v("account_id"), Email: v("email"),
		PlanType: v("plan_type"), ProxyURL: v("proxy_url"), NoProxy: c.FormValue("no_proxy") != ""}
}

// editFormOf is the form filled with the account's settings.
func editFormOf(a store.Account) accountEditForm {
	return accountEditForm{Label: a.Label, BaseURL: a.BaseURL, Organization: a.Organization, Tags: strings.Join(a.Tags, ", "),
		Priority: strconv.Itoa(a.Priority), MaxConcurrency: strconv.Itoa(a.MaxConcurrency), AccountID: a.ChatGPTAccountID,
		Email: a.Email, PlanType: a.PlanType}
}

// patch is the form as PATCH /api/v1/accounts/{id} takes it: the fields
// that differ from a, so the audit log names what changed. Only the shape
// of the numbers is checked here; the values are validated where the API
// validates them (accountPatch), with its messages.
func (f accountEditForm) patch(a store.Account) (AccountForm, error) {
	var p AccountForm
	set := func(dst **string, typed, cur string) {
		if typed != cur {
			*dst = &typed
		}
	}
	set(&p.Label, f.Label, a.Label)
	set(&p.BaseURL, f.BaseURL, a.BaseURL)
	set(&p.Organization, f.Organization, a.Organization)
	if a.Kind == store.KindChatGPT {
		set(&p.AccountID, f.AccountID, a.ChatGPTAccountID)
		set(&p.Email, f.Email, a.Email)
		set(&p.PlanType, f.PlanType, a.PlanType)
	}
	if tags := splitComma(f.Tags); !slices.Equal(tags, a.Tags) {
		tags = append([]string{}, tags...) // an empty list clears them
		p.Tags = &tags
	}
	number := func(dst **int, typed string, cur int, field, bounds string) error {
		n, err := strconv.Atoi(typed)
		if err != nil {
			return badField(field, "must be a whole number %s", bounds)
		}
		if n != cur {
			*dst = &n
		}
		return nil
	}
	if err := number(&p.Priority, f.Priority, a.Priority, "priority", "between -1000 and 1000"); err != nil {
		return p, err
	}
	if err := number(&p.MaxConcurrency, f.MaxConcurrency, a.MaxConcurrency, "max_concurrency", "between 0 (no cap) and 100000"); err != nil {
		return p, err
	}
	switch {
	case f.NoProxy && f.ProxyURL != "":
		return p, badField("proxy_url", "type a new proxy or tick “no proxy”, not both")
	case f.NoProxy && !a.Proxy.IsZero():
		none := ""
		p.ProxyURL = &none
	case f.ProxyURL != "":
		p.ProxyURL = &f.ProxyURL
	}
	return p, nil
}

// holdsPassword reports whether a typed proxy URL may hold a password: one
// that does is never sent back in a page, as credentials are not.
func holdsPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return strings.Contains(raw, "@")
	}
	_, ok := u.User.Password()
	return ok
}

func (s *Server) accountPage(c echo.Context) error {
	return s.renderAccount(c, http.StatusOK, c.Param("id"), nil)
}

// renderAccount shows an account's page; typed, when set, is a refused
// form, shown again as typed (a proxy with a password excepted).
func (s *Server) renderAccount(c echo.Context, status int, id string, typed *accountEditForm) error {
	ctx := c.Request().Context()
	a, err := s.cfg.Store.Account(ctx, id)
	if err != nil {
		return err
	}
	rows, err := s.accountRows(ctx, []store.Account{a}, s.cfg.Now())
	if err != nil {
		return err
	}
	f := editFormOf(a)
	if typed != nil {
		f = *typed
	}
	p := ui.AccountDetail{Account: rows[0], ChatGPT: a.Kind == store.KindChatGPT, Priority: strconv.Itoa(a.Priority),
		MaxConcurrency: "no cap", Created: stamp(a.CreatedAt), Updated: stamp(a.UpdatedAt),
		Form: ui.AccountEditForm{Label: f.Label, BaseURL: f.BaseURL, Organization: f.Organization, Tags: f.Tags,
			Priority: f.Priority, MaxConcurrency: f.MaxConcurrency, AccountID: f.AccountID, Email: f.Email, PlanType: f.PlanType,
			NoProxy: f.NoProxy, Proxy: a.Proxy.String()}}
	if a.MaxConcurrency > 0 {
		p.MaxConcurrency = strconv.Itoa(a.MaxConcurrency) + " requests at once"
	}
	if !a.AccessExpiresAt.IsZero() {
		p.AccessExpires = stamp(a.AccessExpiresAt) + " (" + until(s.cfg.Now(), a.AccessExpiresAt) + "; refreshed before then)"
	}
	if typed != nil && typed.ProxyURL != "" {
		if holdsPassword(typed.ProxyURL) {
			p.Form.ProxyDropped = true
		} else {
			p.Form.ProxyURL = typed.ProxyURL
		}
	}
	return s.render(c, status, ui.AccountPage(s.subframe(c, "accounts", "Account "+a.Label), p))
}

// consoleSaveAccount saves the account page's form. A refused form is
// shown again as typed, with the API's message; nothing is saved then.
func (s *Server) consoleSaveAccount(c echo.Context) error {
	id := c.Param("id")
	f := parseAccountEditForm(c)
	cur, err := s.cfg.Store.Account(c.Request().Context(), id)
	if err != nil {
		return err
	}
	patch, err := f.patch(cur)
	if err == nil && patch.fieldsGiven()[0] == "nothing" {
		return s.back(c, accountURL(id), nil, "Nothing to save: the form holds the account's settings.")
	}
	var a store.Account
	if err == nil {
		a, err = s.updateAccount(c, id, patch)
	}
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return err
		}
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		text := "Not saved: " + msg
		if f.ProxyURL != "" && holdsPassword(f.ProxyURL) {
			text += " The proxy URL you typed is not shown again (it holds a password): type it again."
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: text})
		return s.renderAccount(c, toHTTPError(err).Status, id, &f)
	}
	return s.back(c, accountURL(a.ID), nil, "Saved "+a.Label+": "+strings.Join(patch.fieldsGiven(), ", ")+" changed; new requests see it at once.")
}

// removalView says what removing an account does: to its bindings (and so
// its threads), its live lanes and requests under way, and the client keys
// limited to it.
func (s *Server) removalView(ctx context.Context, a store.Account) (ui.AccountRemoval, error) {
	rows, err := s.accountRows(ctx, []store.Account{a}, s.cfg.Now())
	if err != nil {
		return ui.AccountRemoval{}, err
	}
	p := ui.AccountRemoval{Account: rows[0]}
	for _, k := range []struct {
		kind store.BindingKind
		n    *int
	}{{store.BindThread, &p.Threads}, {store.BindSession, &p.Sessions}, {store.BindRawThread, &p.PinnedThreads}, {store.BindRawSession, &p.PinnedSessions}} {
		_, total, err := s.cfg.Store.Bindings(ctx, store.BindingFilter{AccountID: a.ID, Kind: k.kind, Limit: 1})
		if err != nil {
			return ui.AccountRemoval{}, err
		}
		*k.n = total
	}
	n, err := s.names(ctx)
	if err != nil {
		return ui.AccountRemoval{}, err
	}
	p.Others = len(n.accounts) - 1
	for _, k := range n.keys {
		if !k.RevokedAt.IsZero() || !slices.Contains(k.ScopeAccounts, a.ID) {
			continue
		}
		if len(k.ScopeAccounts) == 1 && k.ScopeTag == "" {
			p.KeysOnly = append(p.KeysOnly, k.Name)
		} else {
			p.KeysAlso = append(p.KeysAlso, k.Name)
		}
	}
	return p, nil
}

func (s *Server) removeAccountPage(c echo.Context) error {
	ctx := c.Request().Context()
	a, err := s.cfg.Store.Account(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	p, err := s.removalView(ctx, a)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, ui.RemoveAccountPage(s.subframe(c, "accounts", "Remove account "+a.Label), p))
}

// consoleRemoveAccount removes an account, once its page's confirmation
// was submitted.
func (s *Server) consoleRemoveAccount(c echo.Context) error {
	a, err := s.removeAccount(c, c.Param("id"))
	if err != nil {
		return err
	}
	return s.back(c, "/admin/accounts", nil, "Removed "+a.Label+" and its bindings: its threads go to other accounts at their next request.")
}
