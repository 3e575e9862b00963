package web

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/relay/store"
)

// KeyView is a client key as the API shows it; Key is set only in the answer
// that created it.
type KeyView struct {
	ID           string     `json:"id"`
	Name         string     `json:"name"`
	Prefix       string     `json:"prefix"`
	Key          string     `json:"key,omitempty"`
	AccountIDs   []string   `json:"account_ids"`
	AccountTag   string     `json:"account_tag"`
	Models       []string   `json:"models"`
	ExpiresAt    *time.Time `json:"expires_at"`
	CreatedAt    time.Time  `json:"created_at"`
	LastUsedAt   *time.Time `json:"last_used_at"`
	RevokedAt    *time.Time `json:"revoked_at"`
	RequestCount int64      `json:"request_count"`
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func viewKey(k store.ClientKey) KeyView {
	return KeyView{
		ID: k.ID, Name: k.Name, Prefix: k.Prefix, AccountIDs: nonNil(k.ScopeAccounts), AccountTag: k.ScopeTag,
		Models: nonNil(k.Models), ExpiresAt: optTime(k.ExpiresAt), CreatedAt: k.CreatedAt,
		LastUsedAt: optTime(k.LastUsedAt), RevokedAt: optTime(k.RevokedAt), RequestCount: k.RequestCount,
	}
}

// KeyForm is the body of POST /keys. Scope: account_ids, or account_tag, or
// neither for every account. Expiry: expires_at (RFC 3339) or expires_in (a
// Go duration such as "720h").
type KeyForm struct {
	Name       string   `json:"name"`
	AccountIDs []string `json:"account_ids"`
	AccountTag string   `json:"account_tag"`
	Models     []string `json:"models"`
	ExpiresAt  string   `json:"expires_at"`
	ExpiresIn  string   `json:"expires_in"`
}

// newClientKey validates a key form into the key to create.
func (s *Server) newClientKey(c echo.Context, f KeyForm) (store.ClientKey, error) {
	k := store.ClientKey{Name: strings.TrimSpace(f.Name), ScopeTag: strings.TrimSpace(f.AccountTag)}
	for _, m := range f.Models {
		if m = strings.TrimSpace(m); m != "" {
			k.Models = append(k.Models, m)
		}
	}
	if k.Name == "" {
		return k, badField("name", "required: say who or what uses the key")
	}
	if len(k.Name) > 200 {
		return k, badField("name", "at most 200 characters")
	}
	if len(f.AccountIDs) > 0 && k.ScopeTag != "" {
		return k, badField("account_tag", "give account_ids or account_tag, not both")
	}
	for _, id := range f.AccountIDs {
		if _, err := s.cfg.Store.Account(c.Request().Context(), strings.TrimSpace(id)); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return k, badField("account_ids", "no account %q", id)
			}
			return k, err
		}
		k.ScopeAccounts = append(k.ScopeAccounts, strings.TrimSpace(id))
	}
	now := s.cfg.Now()
	switch {
	case f.ExpiresAt != "" && f.ExpiresIn != "":
		return k, badField("expires_in", "give expires_at or expires_in, not both")
	case f.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, f.ExpiresAt)
		if err != nil {
			return k, badField("expires_at", "must be an RFC 3339 time such as 2027-01-31T00:00:00Z")
		}
		if !t.After(now) {
			return k, badField("expires_at", "must be in the future")
		}
		k.ExpiresAt = t
	case f.ExpiresIn != "":
		d, err := time.ParseDuration(f.ExpiresIn)
		if err != nil || d <= 0 {
			return k, badField("expires_in", "must be a positive duration such as 720h")
		}
		k.ExpiresAt = now.Add(d)
	}
	return k, nil
}

func (s *Server) createKey(c echo.Context) error {
	var f KeyForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	created, secret, err := s.issueKey(c, f)
	if err != nil {
		return err
	}
	v := viewKey(created)
	v.Key = secret
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().Header().Set("Location", "/api/v1/keys/"+created.ID)
	return c.JSON(http.StatusCreated, v)
}

func (s *Server) listKeys(c echo.Context) error {
	keys, err := s.cfg.Store.ClientKeys(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]KeyView, len(keys))
	for i, k := range keys {
		out[i] = viewKey(k)
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": out})
}

func (s *Server) getKey(c echo.Context) error {
	k, err := s.cfg.Store.ClientKey(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewKey(k))
}

// KeyPatch is the body of PATCH /keys/{id}: a field left out is kept.
// account_ids or account_tag replaces the scope (an empty list, or an empty
// tag, is every account); models replaces the allow-list; expires_at or
// expires_in sets a new expiry, and an empty expires_at removes it.
type KeyPatch struct {
	Name       *string   `json:"name"`
	AccountIDs *[]string `json:"account_ids"`
	AccountTag *string   `json:"account_tag"`
	Models     *[]string `json:"models"`
	ExpiresAt  *string   `json:"expires_at"`
	ExpiresIn  *string   `json:"expires_in"`
}

// patchKey changes a key's name, scope, models or expiry. The change holds
// at the key's next request on every replica, open WebSockets included: a
// thread outside the new scope moves at its next request.
func (s *Server) patchKey(c echo.Context) error {
	var f KeyPatch
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	k, err := s.updateKey(c, c.Param("id"), f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewKey(k))
}

// updateKey applies a patch to a key, validated as a new key's form is.
func (s *Server) updateKey(c echo.Context, id string, f KeyPatch) (store.ClientKey, error) {
	cur, err := s.cfg.Store.ClientKey(c.Request().Context(), id)
	if err != nil {
		return store.ClientKey{}, err
	}
	if !cur.RevokedAt.IsZero() {
		return store.ClientKey{}, &HTTPError{Status: http.StatusConflict, Code: "key_revoked", Msg: "a revoked key cannot be changed"}
	}
	form := KeyForm{Name: cur.Name, AccountIDs: cur.ScopeAccounts, AccountTag: cur.ScopeTag, Models: cur.Models}
	if f.Name != nil {
		form.Name = *f.Name
	}
	switch {
	case f.AccountIDs != nil && f.AccountTag != nil:
		form.AccountIDs, form.AccountTag = *f.AccountIDs, *f.AccountTag
	case f.AccountIDs != nil:
		form.AccountIDs, form.AccountTag = *f.AccountIDs, ""
	case f.AccountTag != nil:
		form.AccountIDs, form.AccountTag = nil, *f.AccountTag
	}
	if f.Models != nil {
		form.Models = *f.Models
	}
	if f.ExpiresAt != nil {
		form.ExpiresAt = *f.ExpiresAt
	}
	if f.ExpiresIn != nil {
		form.ExpiresIn = *f.ExpiresIn
	}
	k, err := s.newClientKey(c, form)
	if err != nil {
		return store.ClientKey{}, err
	}
	if f.ExpiresAt == nil && f.ExpiresIn == nil {
		k.ExpiresAt = cur.ExpiresAt // kept as it is, even when already past
	}
	k.ID = cur.ID
	updated, err := s.cfg.Store.UpdateClientKey(c.Request().Context(), k)
	if err != nil {
		return store.ClientKey{}, err
	}
	s.audit(c, "key.update", "key:"+updated.ID, updated.Name)
	return updated, nil
}

// revokeKey revokes rather than deletes, so the request log keeps naming it.
func (s *Server) revokeKey(c echo.Context) error {
	k, err := s.revokeKeyByID(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewKey(k))
}
