package web

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// BindingView is a binding as the API shows it.
type BindingView struct {
	ID        string     `json:"id"`
	Kind      string     `json:"kind"`
	Strength  string     `json:"strength"`
	Pin       bool       `json:"pin"` // an operator's pin of a raw session or thread
	AccountID string     `json:"account_id"`
	ClientKey string     `json:"client_key"` // the client key id the row belongs to; "" for keyless clients and pins
	SessionID string     `json:"session_id"`
	ThreadID  string     `json:"thread_id"`
	Key       string     `json:"key"` // the derived thread or session key (or, for pins, the raw id)
	Source    string     `json:"source"`
	CreatedAt time.Time  `json:"created_at"`
	LastSeen  time.Time  `json:"last_seen_at"`
	ExpiresAt *time.Time `json:"expires_at"` // null: never (hard rows)
	Abandoned string     `json:"abandoned_scope,omitempty"`
}

func isPin(k store.BindingKind) bool { return k == store.BindRawSession || k == store.BindRawThread }

func viewBinding(b store.Binding) BindingView {
	return BindingView{ID: b.ID, Kind: string(b.Kind), Strength: string(b.Strength), Pin: isPin(b.Kind),
		AccountID: b.AccountID, ClientKey: b.ClientScope, SessionID: b.SessionID, ThreadID: b.ThreadID, Key: b.Key,
		Source: b.Source, CreatedAt: b.CreatedAt, LastSeen: b.LastSeenAt, ExpiresAt: optTime(b.ExpiresAt),
		Abandoned: b.AbandonedScope}
}

func (s *Server) listBindings(c echo.Context) error {
	q, err := parseBindingQuery(c)
	if err != nil {
		return err
	}
	rows, total, err := s.cfg.Store.Bindings(c.Request().Context(), q.filter())
	if err != nil {
		return err
	}
	out := make([]BindingView, len(rows))
	for i, b := range rows {
		out[i] = viewBinding(b)
	}
	return c.JSON(http.StatusOK, map[string]any{"bindings": out, "total": total})
}

func (s *Server) getBinding(c echo.Context) error {
	b, err := s.cfg.Store.Binding(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewBinding(b))
}

// deleteBinding resets one binding by id.
func (s *Server) deleteBinding(c echo.Context) error {
	if _, err := s.cfg.Store.Binding(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	if _, err := s.resetBindings(c, store.BindingReset{BindingID: c.Param("id")}); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// pinForm is the body of POST /bindings: a session_id or a thread_id, and
// the account to pin it to.
type pinForm struct {
	SessionID string `json:"session_id"`
	ThreadID  string `json:"thread_id"`
	AccountID string `json:"account_id"`
}

func (f pinForm) kind() (store.BindingKind, string, error) {
	switch {
	case f.SessionID != "" && f.ThreadID != "":
		return "", "", badField("thread_id", "give session_id or thread_id, not both")
	case f.ThreadID != "":
		return store.BindRawThread, f.ThreadID, nil
	case f.SessionID != "":
		return store.BindRawSession, f.SessionID, nil
	}
	return "", "", badField("session_id", "required: a session_id or a thread_id to pin")
}

func (s *Server) createPin(c echo.Context) error {
	var f pinForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	kind, raw, err := f.kind()
	if err != nil {
		return err
	}
	b, err := s.pinBinding(c, kind, raw, f.AccountID)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/bindings/"+b.ID)
	return c.JSON(http.StatusCreated, viewBinding(b))
}

// resetForm is the body of POST /bindings/reset: exactly one field.
type resetForm struct {
	BindingID string `json:"binding_id"`
	ThreadID  string `json:"thread_id"`
	SessionID string `json:"session_id"`
	AccountID string `json:"account_id"`
}

func (s *Server) resetBindingsAPI(c echo.Context) error {
	var f resetForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	reset, err := s.resetBindings(c, store.BindingReset{BindingID: f.BindingID, ThreadID: f.ThreadID,
		SessionID: f.SessionID, AccountID: f.AccountID})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]int{"reset": len(reset)})
}
