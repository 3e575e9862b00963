package web

import (
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
)

// importAuthJSON adds the accounts of Codex auth.json content (one object,
// an array, or several; see oauth.ParseAuthJSON). A ChatGPT account already
// in the pool (the same workspace) gets the imported tokens instead of a
// twin. label and organization, when given, are the operator's and apply to
// every account added. It returns the labels added and refreshed.
func (s *Server) importAuthJSON(c echo.Context, data []byte, label, organization string) (added, refreshed []string, err error) {
	imported, err := oauth.ParseAuthJSON(data)
	if err != nil {
		return nil, nil, badField("auth_json", "%s", err.Error()) // its messages never quote a token
	}
	ctx := c.Request().Context()
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return nil, nil, err
	}
	byWorkspace := map[string]store.Account{}
	for _, a := range accounts {
		if a.Kind == store.KindChatGPT {
			byWorkspace[a.ChatGPTAccountID] = a
		}
	}
	label, organization = strings.TrimSpace(label), strings.TrimSpace(organization)
	for _, im := range imported {
		if cur, ok := byWorkspace[im.ChatGPTAccountID]; ok && im.Kind == store.KindChatGPT {
			if err := s.cfg.Store.SetCredentials(ctx, cur.ID, im.Credentials, im.AccessExpiresAt); err != nil {
				return added, refreshed, err
			}
			s.audit(c, "account.import", "account:"+cur.ID, cur.Label+": tokens replaced")
			refreshed = append(refreshed, cur.Label)
			continue
		}
		kind := string(im.Kind)
		f := AccountForm{Kind: &kind, Label: ptrOr(label, im.Label()), Organization: ptrOr(organization, im.Organization)}
		if im.Kind == store.KindChatGPT {
			cred := im.Credentials
			f.AccessToken, f.RefreshToken, f.IDToken = &cred.AccessToken, &cred.RefreshToken, &cred.IDToken
			f.AccountID, f.Email, f.PlanType = &im.ChatGPTAccountID, &im.Email, &im.PlanType
		} else {
			f.APIKey = &im.Credentials.APIKey
		}
		a, err := s.addAccount(c, f, "account.import")
		if err != nil {
			return added, refreshed, err
		}
		added = append(added, a.Label)
	}
	return added, refreshed, nil
}

// ptrOr points at v, or at def when v is blank.
func ptrOr(v, def string) *string {
	if v == "" {
		v = def
	}
	return &v
}
