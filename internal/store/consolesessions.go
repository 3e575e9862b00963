package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ConsoleSession is a signed-in console session as every replica sees it.
// The web layer decides what its times mean (its idle and absolute
// limits); the store keeps them.
type ConsoleSession struct {
	ID string
	// UserID names who signed in; "" is the admin token.
	UserID string
	// TokenID names the personal token the user signed in with, whose role
	// the session acts with and whose revocation ends it; "" for none.
	TokenID string
	Created time.Time
	// Seen is the session's last page or form, as last written: callers
	// write it at most once a minute, so it may lag by that much.
	Seen    time.Time
	Expires time.Time // the absolute end
	Revoked time.Time // when it was signed out; zero while it stands
}

type consoleSessionRow struct {
	ID      string         `db:"id"`
	UserID  sql.NullString `db:"user_id"`
	TokenID sql.NullString `db:"token_id"`
	Created int64          `db:"created_at"`
	Seen    int64          `db:"seen_at"`
	Expires int64          `db:"expires_at"`
	Revoked *int64         `db:"revoked_at"`
}

func (r consoleSessionRow) session() ConsoleSession {
	return ConsoleSession{ID: r.ID, UserID: r.UserID.String, TokenID: r.TokenID.String, Created: time.UnixMilli(r.Created).UTC(),
		Seen: time.UnixMilli(r.Seen).UTC(), Expires: time.UnixMilli(r.Expires).UTC(), Revoked: fromMillis(r.Revoked)}
}

// CreateConsoleSession stores a new session, not revoked whatever cs.Revoked
// says. Its id must be new (ErrConflict otherwise).
func (s *Store) CreateConsoleSession(ctx context.Context, cs ConsoleSession) error {
	if cs.ID == "" || cs.Expires.IsZero() {
		return errors.New("create console session: an id and an expiry are required")
	}
	user := sql.NullString{String: cs.UserID, Valid: cs.UserID != ""}
	token := sql.NullString{String: cs.TokenID, Valid: cs.TokenID != ""}
	_, err := s.exec(ctx, `INSERT INTO console_sessions (id, user_id, token_id, created_at, seen_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
		cs.ID, user, token, cs.Created.UnixMilli(), cs.Seen.UnixMilli(), cs.Expires.UnixMilli())
	if isUniqueViolation(err) {
		return fmt.Errorf("create console session: %w", ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create console session: %w", err)
	}
	return nil
}

// ConsoleSession reads a session by id (ErrNotFound when there is none:
// never created, or swept).
func (s *Store) ConsoleSession(ctx context.Context, id string) (ConsoleSession, error) {
	var r consoleSessionRow
	err := s.get(ctx, &r, `SELECT id, user_id, token_id, created_at, seen_at, expires_at, revoked_at FROM console_sessions WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return ConsoleSession{}, fmt.Errorf("console session: %w", ErrNotFound)
	}
	if err != nil {
		return ConsoleSession{}, fmt.Errorf("read console session: %w", err)
	}
	return r.session(), nil
}

// SeeConsoleSession records activity of a session at at. It never moves
// Seen back, and leaves a revoked session as it is.
func (s *Store) SeeConsoleSession(ctx context.Context, id string, at time.Time) error {
	if _, err := s.exec(ctx, `UPDATE console_sessions SET seen_at = ? WHERE id = ? AND seen_at < ? AND revoked_at IS NULL`,
		at.UnixMilli(), id, at.UnixMilli()); err != nil {
		return fmt.Errorf("see console session: %w", err)
	}
	return nil
}

// RevokeConsoleSession signs a session out at at; revoking twice keeps the
// first time. A session that is not there (swept) is not an error: it is
// over either way.
func (s *Store) RevokeConsoleSession(ctx context.Context, id string, at time.Time) error {
	if _, err := s.exec(ctx, `UPDATE console_sessions SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, at.UnixMilli(), id); err != nil {
		return fmt.Errorf("revoke console session: %w", err)
	}
	return nil
}

// DeleteEndedConsoleSessions deletes the sessions whose absolute end is at
// or before now, revoked or not, and reports how many. A session that
// ended earlier (signed out, idle) is refused by its row until then.
func (s *Store) DeleteEndedConsoleSessions(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM console_sessions WHERE expires_at <= ?`, now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete ended console sessions: %w", err)
	}
	return res.RowsAffected()
}

// ConsoleSessionsOf lists the sessions of user (""; the admin token's)
// that stand at now: not signed out, not past their end. Newest first.
func (s *Store) ConsoleSessionsOf(ctx context.Context, user string, now time.Time) ([]ConsoleSession, error) {
	var rows []consoleSessionRow
	var err error
	const cols = `SELECT id, user_id, token_id, created_at, seen_at, expires_at, revoked_at FROM console_sessions`
	if user == "" {
		err = s.selectAll(ctx, &rows, cols+` WHERE user_id IS NULL AND revoked_at IS NULL AND expires_at > ? ORDER BY created_at DESC, id`, now.UnixMilli())
	} else {
		err = s.selectAll(ctx, &rows, cols+` WHERE user_id = ? AND revoked_at IS NULL AND expires_at > ? ORDER BY created_at DESC, id`, user, now.UnixMilli())
	}
	if err != nil {
		return nil, fmt.Errorf("list console sessions: %w", err)
	}
	out := make([]ConsoleSession, len(rows))
	for i, r := range rows {
		out[i] = r.session()
	}
	return out, nil
}

// RevokeConsoleSessionsOf signs every session of user ("": the admin
// token's) out at at, and reports how many stood.
func (s *Store) RevokeConsoleSessionsOf(ctx context.Context, user string, at time.Time) (int64, error) {
	var res sql.Result
	var err error
	if user == "" {
		res, err = s.exec(ctx, `UPDATE console_sessions SET revoked_at = ? WHERE user_id IS NULL AND revoked_at IS NULL AND expires_at > ?`,
			at.UnixMilli(), at.UnixMilli())
	} else {
		res, err = s.exec(ctx, `UPDATE console_sessions SET revoked_at = ? WHERE user_id = ? AND revoked_at IS NULL AND expires_at > ?`,
			at.UnixMilli(), user, at.UnixMilli())
	}
	if err != nil {
		return 0, fmt.Errorf("revoke console sessions: %w", err)
	}
	return res.RowsAffected()
}
