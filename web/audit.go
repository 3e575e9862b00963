package web

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// audit records an admin action: the actor set by the auth middleware
// (a user's email, token:<name>, or admin-token), the client address,
// the action, its target and a short detail. The action has happened by now,
// so a failed write is logged rather than turned into a failed answer.
func (s *Server) audit(c echo.Context, action, target, detail string) {
	s.auditAs(c.Request().Context(), actorOf(c), action, target, detail)
}

// who is the operator behind an action, as the audit log names them: an
// action that ends after its request (a sign-in completing in the
// background) keeps the who of the request that started it.
type who struct {
	Actor, UserEmail, Address string
}

func actorOf(c echo.Context) who {
	p := principalOf(c)
	if p.Actor == "" {
		// The login page before a sign-in: someone, not known yet.
		return who{Actor: actorAnonymous, Address: c.RealIP()}
	}
	return who{Actor: p.Actor, UserEmail: p.UserEmail, Address: c.RealIP()}
}

// auditAs records an action of w; ctx's cancellation does not stop the write.
func (s *Server) auditAs(ctx context.Context, w who, action, target, detail string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := s.cfg.Store.RecordAudit(ctx, store.AuditEntry{Actor: w.Actor, UserEmail: w.UserEmail, Address: w.Address, Action: action,
		Target: target, Detail: detail})
	if err != nil {
		s.log.Error("audit log write failed", "action", action, "target", target, "err", err)
	}
}

// changes are what an action changed, before and after, for its audit
// row's detail ("role viewer → operator; tags (none) → \"blue\""). Only
// what may be shown goes in: never a secret.
type changes []string

// add notes field's change from before to after, if it changed.
func (ch *changes) add(field, before, after string) {
	if before != after {
		*ch = append(*ch, field+" "+quoteOrNone(before)+" → "+quoteOrNone(after))
	}
}

func (ch changes) String() string { return strings.Join(ch, "; ") }

// auditView is an audit entry as the API shows it.
type auditView struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`
	User    string    `json:"user,omitempty"` // the person behind a token:<name> actor
	Address string    `json:"address"`
	Action  string    `json:"action"`
	Target  string    `json:"target"`
	Detail  string    `json:"detail"`
}

func (s *Server) listAudit(c echo.Context) error {
	q, err := parseAuditQuery(c)
	if err != nil {
		return err
	}
	entries, total, err := s.cfg.Store.AuditLog(c.Request().Context(), q.filter())
	if err != nil {
		return err
	}
	out := make([]auditView, len(entries))
	for i, e := range entries {
		out[i] = auditView{ID: e.ID, At: e.At, Actor: e.Actor, User: e.UserEmail, Address: e.Address, Action: e.Action, Target: e.Target, Detail: e.Detail}
	}
	return c.JSON(http.StatusOK, map[string]any{"entries": out, "total": total})
}
