package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// The operator's actions, shared by the API and the console: each makes the
// change, does the relay's follow-up, and writes the audit entry.

// resetTarget names what a reset addresses, for the audit log; the second
// result says how many fields were set.
func resetTarget(r store.BindingReset) (string, int) {
	var target string
	n := 0
	for _, f := range []struct{ name, v string }{{"binding", r.BindingID}, {"thread", r.ThreadID}, {"session", r.SessionID}, {"account", r.AccountID}} {
		if f.v != "" {
			target = f.name + ":" + f.v
			n++
		}
	}
	return target, n
}

// resetBindings deletes the bindings r names (exactly one of its fields),
// tells the relay to forget the reset threads (continuity and lanes), and
// audits the reset. It returns the bindings it reset.
func (s *Server) resetBindings(c echo.Context, r store.BindingReset) ([]store.Binding, error) {
	target, n := resetTarget(r)
	if n != 1 {
		return nil, &HTTPError{Status: 400, Code: "invalid_field", Field: "binding_id",
			Msg: "give exactly one of binding_id, thread_id, session_id, account_id"}
	}
	reset, err := s.cfg.Store.ResetBindings(c.Request().Context(), r)
	if err != nil {
		return nil, err
	}
	s.cfg.Relay.Forget(reset)
	s.audit(c, "binding.reset", target, fmt.Sprintf("%d %s reset", len(reset), plural(len(reset), "binding", "bindings")))
	return reset, nil
}

// pinBinding pins a raw session or thread to an account: a hard row that
// wins over soft bindings until it is reset.
func (s *Server) pinBinding(c echo.Context, kind store.BindingKind, raw, accountID string) (store.Binding, error) {
	raw, accountID = strings.TrimSpace(raw), strings.TrimSpace(accountID)
	field := "session_id"
	if kind == store.BindRawThread {
		field = "thread_id"
	}
	if raw == "" {
		return store.Binding{}, badField(field, "required: the %s to pin", strings.TrimSuffix(field, "_id"))
	}
	if len(raw) > 500 {
		return store.Binding{}, badField(field, "at most 500 characters")
	}
	if accountID == "" {
		return store.Binding{}, badField("account_id", "required: the account to pin to")
	}
	ctx := c.Request().Context()
	acc, err := s.cfg.Store.Account(ctx, accountID)
	if errors.Is(err, store.ErrNotFound) {
		return store.Binding{}, badField("account_id", "no account %q", accountID)
	}
	if err != nil {
		return store.Binding{}, err
	}
	b, err := s.cfg.Store.Pin(ctx, kind, raw, acc.ID, "pin")
	if err != nil {
		return store.Binding{}, err
	}
	s.audit(c, "binding.pin", strings.TrimSuffix(field, "_id")+":"+raw, "pinned to "+acc.Label+" ("+acc.ID+")")
	return b, nil
}

// addAccount validates and stores a new account; action is account.create
// or account.import.
func (s *Server) addAccount(c echo.Context, f AccountForm, action string) (store.Account, error) {
	return s.addAccountAs(c.Request().Context(), actorOf(c), f, action)
}

// addAccountAs is addAccount for an action that outlives its request (a
// sign-in), audited as w.
func (s *Server) addAccountAs(ctx context.Context, w who, f AccountForm, action string) (store.Account, error) {
	a, cred, err := f.newAccount()
	if err != nil {
		return store.Account{}, err
	}
	created, err := s.cfg.Store.CreateAccount(ctx, a, cred)
	if err != nil {
		return store.Account{}, err
	}
	s.auditAs(ctx, w, action, "account:"+created.ID, created.Label+" ("+string(created.Kind)+")")
	return created, nil
}

// updateAccount applies a PATCH form to an account, whole or not at all
// (accountPatch), and audits the fields it set. The API's PATCH and the
// console's account page both save through it, so they accept and refuse
// the same input with the same messages.
func (s *Server) updateAccount(c echo.Context, id string, f AccountForm) (store.Account, error) {
	ctx := c.Request().Context()
	before, err := s.cfg.Store.Account(ctx, id)
	if err != nil {
		return store.Account{}, err
	}
	p, err := s.accountPatch(ctx, id, f)
	if err != nil {
		return store.Account{}, err
	}
	a, err := s.cfg.Store.UpdateAccount(ctx, id, p)
	if err != nil {
		return store.Account{}, err
	}
	s.audit(c, "account.update", "account:"+a.ID, accountDiff(before, a, f))
	return a, nil
}

// accountDiff says what an update changed, before and after: its settings
// as shown (the proxy without its password), and which credentials were
// replaced, by name only.
func accountDiff(a, b store.Account, f AccountForm) string {
	var ch changes
	ch.add("label", a.Label, b.Label)
	ch.add("base_url", a.BaseURL, b.BaseURL)
	ch.add("organization", a.Organization, b.Organization)
	ch.add("account_id", a.ChatGPTAccountID, b.ChatGPTAccountID)
	ch.add("email", a.Email, b.Email)
	ch.add("plan_type", a.PlanType, b.PlanType)
	ch.add("tags", strings.Join(a.Tags, ","), strings.Join(b.Tags, ","))
	ch.add("priority", strconv.Itoa(a.Priority), strconv.Itoa(b.Priority))
	ch.add("max_concurrency", strconv.Itoa(a.MaxConcurrency), strconv.Itoa(b.MaxConcurrency))
	ch.add("proxy_url", a.Proxy.String(), b.Proxy.String())
	var creds []string
	for _, c := range []struct {
		name string
		set  bool
	}{{"api_key", f.APIKey != nil}, {"access_token", f.AccessToken != nil}, {"refresh_token", f.RefreshToken != nil}, {"id_token", f.IDToken != nil}} {
		if c.set {
			creds = append(creds, c.name)
		}
	}
	if len(creds) > 0 {
		ch = append(ch, "replaced "+strings.Join(creds, ", "))
	}
	if len(ch) == 0 {
		return "nothing changed"
	}
	return ch.String()
}

// removeAccount deletes an account with its credentials and every binding
// that points at it (store.DeleteAccount). Its threads are placed afresh at
// their next request; its live lanes retire at the end of their turn. It
// returns the account as it was.
func (s *Server) removeAccount(c echo.Context, id string) (store.Account, error) {
	ctx := c.Request().Context()
	a, err := s.cfg.Store.Account(ctx, id)
	if err != nil {
		return store.Account{}, err
	}
	if err := s.cfg.Store.DeleteAccount(ctx, a.ID); err != nil {
		return store.Account{}, err
	}
	s.audit(c, "account.delete", "account:"+a.ID, a.Label+" and its bindings")
	return a, nil
}

// setAccountPaused pauses an account (it serves nothing) or resumes it.
func (s *Server) setAccountPaused(c echo.Context, id string, paused bool, reason string) (store.Account, error) {
	st, action := store.StatusActive, "account.resume"
	if paused {
		st, action = store.StatusPaused, "account.pause"
		if reason = strings.TrimSpace(reason); reason == "" {
			reason = "paused by an operator"
		}
	} else {
		reason = "resumed by an operator"
	}
	a, err := s.cfg.Store.SetAccountStatus(c.Request().Context(), id, st, reason, time.Time{})
	if err != nil {
		return store.Account{}, err
	}
	s.audit(c, action, "account:"+a.ID, a.Label+": "+reason)
	return a, nil
}

// probeAccount checks an account against its upstream now.
func (s *Server) probeAccount(c echo.Context, id string) (store.Account, error) {
	if s.cfg.Probe == nil {
		return store.Account{}, &HTTPError{Status: http.StatusNotImplemented, Code: "probe_unavailable", Msg: "this relay cannot probe accounts"}
	}
	a, err := s.cfg.Probe(c.Request().Context(), id)
	if err != nil {
		return store.Account{}, err
	}
	s.audit(c, "account.probe", "account:"+a.ID, a.Label+": "+string(a.Status))
	return a, nil
}

// issueKey validates and creates a client key; the secret is in the second
// result, to be shown once.
func (s *Server) issueKey(c echo.Context, f KeyForm) (store.ClientKey, string, error) {
	k, err := s.newClientKey(c, f)
	if err != nil {
		return store.ClientKey{}, "", err
	}
	created, secret, err := s.cfg.Store.CreateClientKey(c.Request().Context(), k)
	if err != nil {
		return store.ClientKey{}, "", err
	}
	s.audit(c, "key.create", "key:"+created.ID, created.Name+" ("+created.Prefix+"…)")
	return created, secret, nil
}

// revokeKeyByID revokes a client key: refused at once from then on.
func (s *Server) revokeKeyByID(c echo.Context, id string) (store.ClientKey, error) {
	k, err := s.cfg.Store.RevokeClientKey(c.Request().Context(), id)
	if err != nil {
		return store.ClientKey{}, err
	}
	s.audit(c, "key.revoke", "key:"+k.ID, k.Name)
	return k, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
