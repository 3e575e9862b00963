package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"
)

// AuditEntry is one admin action: who did what to which object, and when.
type AuditEntry struct {
	ID string
	At time.Time
	// Actor is who acted: a user's email, token:<name> for a personal
	// token, or admin-token.
	Actor string
	// UserEmail is the person behind a token:<name> actor; "" otherwise.
	UserEmail string
	Address   string // the client address the action came from
	Action    string // e.g. binding.reset, account.pause, login, login.failed
	Target    string // e.g. thread:<id>, account:<id>; empty when none
	Detail    string // a short human-readable note
}

type auditRow struct {
	ID      string `db:"id"`
	At      int64  `db:"at"`
	Actor   string `db:"actor"`
	User    string `db:"user_email"`
	Address string `db:"address"`
	Action  string `db:"action"`
	Target  string `db:"target"`
	Detail  string `db:"detail"`
}

const auditColumns = `id, at, actor, user_email, address, action, target, detail`

// RecordAudit appends an entry to the audit log, filling in its id and,
// when zero, its time. It returns the entry as stored.
func (s *Store) RecordAudit(ctx context.Context, e AuditEntry) (AuditEntry, error) {
	if e.Actor == "" || e.Action == "" {
		return AuditEntry{}, errors.New("record audit: actor and action required")
	}
	if e.At.IsZero() {
		e.At = s.now()
	}
	if e.ID == "" {
		e.ID = auditID(e.At)
	}
	e.At = time.UnixMilli(e.At.UnixMilli()).UTC()
	_, err := s.exec(ctx, `INSERT INTO audit_log (`+auditColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		e.ID, e.At.UnixMilli(), e.Actor, e.UserEmail, e.Address, e.Action, e.Target, e.Detail)
	if err != nil {
		return AuditEntry{}, fmt.Errorf("record audit: %w", err)
	}
	return e, nil
}

// auditID orders entries of the same millisecond by their nanoseconds, so
// actions taken in quick succession list in the order they happened.
func auditID(at time.Time) string {
	var r [5]byte
	if _, err := rand.Read(r[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return fmt.Sprintf("aud_%016x%x", uint64(at.UnixNano()), r)
}

// AuditFilter selects audit entries; empty fields do not filter. Actor
// matches the actor, or the person behind a token (a user's email matches
// what they did with their tokens too). Action matches exactly, or by
// prefix when it ends in "." ("binding." matches every binding action).
type AuditFilter struct {
	Actor, Action, Target string
	Limit, Offset         int
}

// AuditLog lists audit entries, newest first, and how many match.
func (s *Store) AuditLog(ctx context.Context, f AuditFilter) ([]AuditEntry, int, error) {
	conds := []string{"1 = 1"}
	var args []any
	if f.Actor != "" {
		conds, args = append(conds, "(actor = ? OR user_email = ?)"), append(args, f.Actor, f.Actor)
	}
	if f.Target != "" {
		conds, args = append(conds, "target = ?"), append(args, f.Target)
	}
	if prefix, ok := strings.CutSuffix(f.Action, "."); ok && prefix != "" {
		// Compare the prefix instead of LIKE, whose escaping differs between
		// the two databases.
		conds, args = append(conds, "SUBSTR(action, 1, ?) = ?"), append(args, len(f.Action), f.Action)
	} else if f.Action != "" {
		conds, args = append(conds, "action = ?"), append(args, f.Action)
	}
	var rows []auditRow
	total, err := s.page(ctx, &rows, "audit_log", auditColumns, strings.Join(conds, " AND "), args, "at DESC, id DESC", f.Limit, f.Offset)
	if err != nil {
		return nil, 0, err
	}
	out := make([]AuditEntry, len(rows))
	for i, r := range rows {
		out[i] = AuditEntry{ID: r.ID, At: time.UnixMilli(r.At).UTC(), Actor: r.Actor, UserEmail: r.User, Address: r.Address,
			Action: r.Action, Target: r.Target, Detail: r.Detail}
	}
	return out, total, nil
}
