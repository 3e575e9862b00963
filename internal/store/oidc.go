package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// OIDCLogin is a console sign-in with OpenID Connect under way: what its
// callback must find again (see migration 0013).
type OIDCLogin struct {
	State, Nonce, Verifier string
	// Next is the console page to land on once signed in.
	Next    string
	Created time.Time
	Expires time.Time
}

type oidcLoginRow struct {
	State    string `db:"state"`
	Nonce    string `db:"nonce"`
	Verifier string `db:"verifier"`
	Next     string `db:"next"`
	Created  int64  `db:"created_at"`
	Expires  int64  `db:"expires_at"`
}

// PutOIDCLogin stores a sign-in under way; its state must be new
// (ErrConflict otherwise). Sign-ins past their expiry are deleted with it.
func (s *Store) PutOIDCLogin(ctx context.Context, l OIDCLogin) error {
	if l.State == "" || l.Nonce == "" || l.Verifier == "" || l.Expires.IsZero() {
		return errors.New("put oidc login: a state, a nonce, a verifier and an expiry are required")
	}
	if _, err := s.exec(ctx, `DELETE FROM oidc_logins WHERE expires_at <= ?`, l.Created.UnixMilli()); err != nil {
		return fmt.Errorf("put oidc login: %w", err)
	}
	_, err := s.exec(ctx, `INSERT INTO oidc_logins (state, nonce, verifier, next, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
		l.State, l.Nonce, l.Verifier, l.Next, l.Created.UnixMilli(), l.Expires.UnixMilli())
	if isUniqueViolation(err) {
		return fmt.Errorf("put oidc login: %w", ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("put oidc login: %w", err)
	}
	return nil
}

// TakeOIDCLogin takes the sign-in of state: deleted as it is read, so it
// serves one callback only. ErrNotFound when there is none (never made,
// taken already, or past its expiry at now).
func (s *Store) TakeOIDCLogin(ctx context.Context, state string, now time.Time) (OIDCLogin, error) {
	var rows []oidcLoginRow
	err := s.writeQuery(ctx, &rows, `DELETE FROM oidc_logins WHERE state = ?
		RETURNING state, nonce, verifier, next, created_at, expires_at`, state)
	if err != nil {
		return OIDCLogin{}, fmt.Errorf("take oidc login: %w", err)
	}
	if len(rows) == 0 || rows[0].Expires <= now.UnixMilli() {
		return OIDCLogin{}, fmt.Errorf("oidc login: %w", ErrNotFound)
	}
	r := rows[0]
	return OIDCLogin{State: r.State, Nonce: r.Nonce, Verifier: r.Verifier, Next: r.Next,
		Created: time.UnixMilli(r.Created).UTC(), Expires: time.UnixMilli(r.Expires).UTC()}, nil
}
