package web

import (
	"context"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
)

// importAuthJSON adds the accounts of Codex auth.json content (one object,
// an array, or several; see oauth.ParseAuthJSON), as importAccounts does.
// label and organization, when given, are the operator's and apply to
// every account added. It returns the labels added and refreshed.
func (s *Server) importAuthJSON(c echo.Context, data []byte, label, organization string) (added, refreshed []string, err error) {
	imported, err := oauth.ParseAuthJSON(data)
	if err != nil {
		return nil, nil, badField("auth_json", "%s", err.Error()) // its messages never quote a token
	}
	label, organization = strings.TrimSpace(label), strings.TrimSpace(organization)
	place := AccountForm{Label: optional(label), Organization: optional(organization)}
	results, err := s.importAccounts(c.Request().Context(), actorOf(c), imported, place, "account.import")
	for _, r := range results {
		if r.Refreshed {
			refreshed = append(refreshed, r.Account.Label)
		} else {
			added = append(added, r.Account.Label)
		}
	}
	return added, refreshed, err
}

// imported is what importAccounts did with one login: the account it
// added, or the one whose tokens it replaced (Refreshed).
type imported struct {
	Account   store.Account
	Refreshed bool
}

// importAccounts adds logins (from an auth.json or a sign-in) to the pool.
// A ChatGPT login of a workspace already in the pool replaces that
// account's tokens instead of adding a twin, and returns it to service if it
// was waiting for a new login (reauth_required), as `accounts import
// -update` and `accounts login -update` do. place holds what the operator
// set for the accounts added (a blank label or organisation is the
// login's own); the kind, credentials and identity are the login's.
// Actions are audited as action, by w.
func (s *Server) importAccounts(ctx context.Context, w who, logins []oauth.ImportedAccount, place AccountForm, action string) ([]imported, error) {
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return nil, err
	}
	byWorkspace := map[string]store.Account{}
	for _, a := range accounts {
		if a.Kind == store.KindChatGPT {
			byWorkspace[a.ChatGPTAccountID] = a
		}
	}
	var out []imported
	for _, im := range logins {
		if cur, ok := byWorkspace[im.ChatGPTAccountID]; ok && im.Kind == store.KindChatGPT {
			if err := s.cfg.Store.SetCredentials(ctx, cur.ID, im.Credentials, im.AccessExpiresAt); err != nil {
				return out, err
			}
			s.auditAs(ctx, w, action, "account:"+cur.ID, cur.Label+": tokens replaced")
			if cur.Status == store.StatusReauthRequired {
				const reason = "signed in again"
				if cur, err = s.cfg.Store.SetAccountStatus(ctx, cur.ID, store.StatusActive, reason, time.Time{}); err != nil {
					return out, err
				}
				s.auditAs(ctx, w, "account.resume", "account:"+cur.ID, cur.Label+": "+reason)
			}
			out = append(out, imported{Account: cur, Refreshed: true})
			continue
		}
		kind := string(im.Kind)
		f := place
		f.Kind = &kind
		f.Label = ptrOr(str(place.Label), im.Label())
		f.Organization = ptrOr(str(place.Organization), im.Organization)
		if im.Kind == store.KindChatGPT {
			cred := im.Credentials
			f.AccessToken, f.RefreshToken, f.IDToken = &cred.AccessToken, &cred.RefreshToken, &cred.IDToken
			f.AccountID, f.Email, f.PlanType = &im.ChatGPTAccountID, &im.Email, &im.PlanType
			f.accessExpiresAt = im.AccessExpiresAt
		} else {
			f.APIKey = &im.Credentials.APIKey
		}
		a, err := s.addAccountAs(ctx, w, f, action)
		if err != nil {
			return out, err
		}
		if a.Kind == store.KindChatGPT {
			byWorkspace[a.ChatGPTAccountID] = a
		}
		out = append(out, imported{Account: a})
	}
	return out, nil
}

// ptrOr points at v, or at def when v is blank.
func ptrOr(v, def string) *string {
	if v == "" {
		v = def
	}
	return &v
}

// optional points at v, or is nil when v is blank: a form field left empty
// is a field not given.
func optional(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}
