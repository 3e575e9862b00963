package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/codexrelay/codex-relay/internal/roles"
)

// UserTokenPrefix starts every personal API token, so one is told apart
// from a client key (crk_) and from the admin token at a glance.
const UserTokenPrefix = "crp_"

// seenEvery is how often at most a user's last sighting, or a token's last
// use, is written: not a write per request.
const seenEvery = time.Minute

// User is a person who runs the relay. Email is unique whatever its case.
// Users are made by an admin or, with single sign-on, at their first
// sign-in; a disabled one is refused at their next request.
type User struct {
	ID         string
	Email      string
	Name       string
	Role       roles.Role
	CreatedAt  time.Time
	LastSeenAt time.Time
	DisabledAt time.Time // zero while the user may sign in
}

// Disabled reports whether the user is refused.
func (u User) Disabled() bool { return !u.DisabledAt.IsZero() }

// UserToken is a personal API token. Only a hash of the secret is stored;
// the secret is shown once, when it is created.
type UserToken struct {
	ID     string
	UserID string
	Name   string
	// Role narrows the user's role for this token; "" acts with the user's.
	Role       roles.Role
	Prefix     string // the first characters of the secret, for display
	CreatedAt  time.Time
	ExpiresAt  time.Time // zero: never
	LastUsedAt time.Time
	RevokedAt  time.Time
}

// Usable reports whether the token may authenticate at now (its user aside).
func (t UserToken) Usable(now time.Time) bool {
	return t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || now.Before(t.ExpiresAt))
}

type userRow struct {
	ID         string `db:"id"`
	Email      string `db:"email"`
	Name       string `db:"name"`
	Role       string `db:"role"`
	CreatedAt  int64  `db:"created_at"`
	LastSeenAt *int64 `db:"last_seen_at"`
	DisabledAt *int64 `db:"disabled_at"`
}

func (r userRow) user() User {
	return User{ID: r.ID, Email: r.Email, Name: r.Name, Role: roles.Role(r.Role), CreatedAt: time.UnixMilli(r.CreatedAt).UTC(),
		LastSeenAt: fromMillis(r.LastSeenAt), DisabledAt: fromMillis(r.DisabledAt)}
}

const userColumns = `id, email, name, role, created_at, last_seen_at, disabled_at`

type userTokenRow struct {
	ID         string `db:"id"`
	UserID     string `db:"user_id"`
	Name       string `db:"name"`
	Role       string `db:"role"`
	Prefix     string `db:"prefix"`
	CreatedAt  int64  `db:"created_at"`
	ExpiresAt  *int64 `db:"expires_at"`
	LastUsedAt *int64 `db:"last_used_at"`
	RevokedAt  *int64 `db:"revoked_at"`
}

func (r userTokenRow) token() UserToken {
	return UserToken{ID: r.ID, UserID: r.UserID, Name: r.Name, Role: roles.Role(r.Role), Prefix: r.Prefix,
		CreatedAt: time.UnixMilli(r.CreatedAt).UTC(), ExpiresAt: fromMillis(r.ExpiresAt),
		LastUsedAt: fromMillis(r.LastUsedAt), RevokedAt: fromMillis(r.RevokedAt)}
}

const userTokenColumns = `id, user_id, name, role, prefix, created_at, expires_at, last_used_at, revoked_at`

// emailKey is the form of an address its uniqueness is judged by.
func emailKey(email string) string { return strings.ToLower(strings.TrimSpace(email)) }

// checkEmail accepts a bare address (someone@example.com), not a display
// name with one.
func checkEmail(email string) error {
	a, err := mail.ParseAddress(email)
	if err != nil || a.Address != email || a.Name != "" {
		return fmt.Errorf("%w: email: not an address (someone@example.com)", ErrInvalid)
	}
	return nil
}

// ErrInvalid is returned for a value the store refuses to write (a role
// that is none of the three, an address that is not one).
var ErrInvalid = errors.New("invalid")

// CreateUser adds a user with u's email, name and role (and disabled when
// u.DisabledAt is set), returning it as stored. Another user with the same
// email, in any case, is ErrConflict.
func (s *Store) CreateUser(ctx context.Context, u User) (User, error) {
	u.Email = strings.TrimSpace(u.Email)
	if err := checkEmail(u.Email); err != nil {
		return User{}, fmt.Errorf("create user: %w", err)
	}
	if !u.Role.Valid() {
		return User{}, fmt.Errorf("create user: %w: role: one of viewer, operator, admin", ErrInvalid)
	}
	now := s.now()
	u.ID = NewID("usr", now)
	_, err := s.exec(ctx, `INSERT INTO users (id, email, email_key, name, role, created_at, disabled_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		u.ID, u.Email, emailKey(u.Email), strings.TrimSpace(u.Name), string(u.Role), now.UnixMilli(), millis(u.DisabledAt))
	if isUniqueViolation(err) {
		return User{}, fmt.Errorf("create user: a user with that email exists: %w", ErrConflict)
	}
	if err != nil {
		return User{}, fmt.Errorf("create user: %w", err)
	}
	return s.User(ctx, u.ID)
}

// User reads a user by id.
func (s *Store) User(ctx context.Context, id string) (User, error) {
	var r userRow
	err := s.get(ctx, &r, `SELECT `+userColumns+` FROM users WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, fmt.Errorf("user %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return User{}, fmt.Errorf("read user: %w", err)
	}
	return r.user(), nil
}

// UserByEmail reads the user of an address, whatever its case: what a
// single sign-on looks up at each sign-in.
func (s *Store) UserByEmail(ctx context.Context, email string) (User, error) {
	var r userRow
	err := s.get(ctx, &r, `SELECT `+userColumns+` FROM users WHERE email_key = ?`, emailKey(email))
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, fmt.Errorf("user by email: %w", ErrNotFound)
	}
	if err != nil {
		return User{}, fmt.Errorf("read user: %w", err)
	}
	return r.user(), nil
}

// Users lists every user, disabled ones included, by email.
func (s *Store) Users(ctx context.Context) ([]User, error) {
	var rows []userRow
	if err := s.selectAll(ctx, &rows, `SELECT `+userColumns+` FROM users ORDER BY email_key`); err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	out := make([]User, len(rows))
	for i, r := range rows {
		out[i] = r.user()
	}
	return out, nil
}

// UserChange is what UpdateUser changes; nil fields stay as they are.
type UserChange struct {
	Name     *string
	Role     *roles.Role
	Disabled *bool
}

// UpdateUser applies ch to a user and returns it before and after. Disabling
// keeps the first time a user was disabled; enabling clears it.
func (s *Store) UpdateUser(ctx context.Context, id string, ch UserChange) (before, after User, err error) {
	if ch.Role != nil && !ch.Role.Valid() {
		return User{}, User{}, fmt.Errorf("update user: %w: role: one of viewer, operator, admin", ErrInvalid)
	}
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		var r userRow
		if err := tx.GetContext(ctx, &r, s.q(`SELECT `+userColumns+` FROM users WHERE id = ?`), id); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("user %s: %w", id, ErrNotFound)
			}
			return err
		}
		before = r.user()
		after = before
		if ch.Name != nil {
			after.Name = strings.TrimSpace(*ch.Name)
		}
		if ch.Role != nil {
			after.Role = *ch.Role
		}
		if ch.Disabled != nil {
			switch {
			case !*ch.Disabled:
				after.DisabledAt = time.Time{}
			case after.DisabledAt.IsZero():
				after.DisabledAt = time.UnixMilli(s.now().UnixMilli()).UTC()
			}
		}
		_, err := tx.ExecContext(ctx, s.q(`UPDATE users SET name = ?, role = ?, disabled_at = ? WHERE id = ?`),
			after.Name, string(after.Role), millis(after.DisabledAt), id)
		return err
	})
	if err != nil {
		return User{}, User{}, fmt.Errorf("update user: %w", err)
	}
	return before, after, nil
}

// DeleteUser deletes a user with their tokens, and signs out their console
// sessions. It returns the user as it was.
func (s *Store) DeleteUser(ctx context.Context, id string) (User, error) {
	var u User
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		var r userRow
		if err := tx.GetContext(ctx, &r, s.q(`SELECT `+userColumns+` FROM users WHERE id = ?`), id); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("user %s: %w", id, ErrNotFound)
			}
			return err
		}
		u = r.user()
		for _, q := range []string{`DELETE FROM user_tokens WHERE user_id = ?`, `DELETE FROM users WHERE id = ?`} {
			if _, err := tx.ExecContext(ctx, s.q(q), id); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, s.q(`UPDATE console_sessions SET revoked_at = COALESCE(revoked_at, ?) WHERE user_id = ?`),
			s.now().UnixMilli(), id)
		return err
	})
	if err != nil {
		return User{}, fmt.Errorf("delete user: %w", err)
	}
	return u, nil
}

// SeeUser records that a user was active at at, when their last sighting is
// a minute old or more (not a write per request).
func (s *Store) SeeUser(ctx context.Context, id string, at time.Time) error {
	if _, err := s.exec(ctx, `UPDATE users SET last_seen_at = ? WHERE id = ? AND (last_seen_at IS NULL OR last_seen_at <= ?)`,
		at.UnixMilli(), id, at.Add(-seenEvery).UnixMilli()); err != nil {
		return fmt.Errorf("see user: %w", err)
	}
	return nil
}

// CreateUserToken makes a personal token for t.UserID, named t.Name, with
// t's role (narrower than the user's, or "") and expiry, and returns it with
// its secret, which is not stored and cannot be read again.
func (s *Store) CreateUserToken(ctx context.Context, t UserToken) (UserToken, string, error) {
	t.Name = strings.TrimSpace(t.Name)
	if t.Name == "" {
		return UserToken{}, "", fmt.Errorf("create user token: %w: name: required", ErrInvalid)
	}
	if t.Role != "" && !t.Role.Valid() {
		return UserToken{}, "", fmt.Errorf("create user token: %w: role: one of viewer, operator, admin", ErrInvalid)
	}
	if _, err := s.User(ctx, t.UserID); err != nil {
		return UserToken{}, "", fmt.Errorf("create user token: %w", err)
	}
	now := s.now()
	secret := NewSecret(UserTokenPrefix)
	t.ID = NewID("tok", now)
	t.Prefix = secret[:len(UserTokenPrefix)+6]
	_, err := s.exec(ctx, `INSERT INTO user_tokens (id, user_id, name, role, prefix, token_hash, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.UserID, t.Name, string(t.Role), t.Prefix, HashClientKey(secret), now.UnixMilli(), millis(t.ExpiresAt))
	if err != nil {
		return UserToken{}, "", fmt.Errorf("create user token: %w", err)
	}
	created, err := s.UserToken(ctx, t.UserID, t.ID)
	return created, secret, err
}

// UserToken reads one of a user's tokens.
func (s *Store) UserToken(ctx context.Context, userID, id string) (UserToken, error) {
	var r userTokenRow
	err := s.get(ctx, &r, `SELECT `+userTokenColumns+` FROM user_tokens WHERE id = ? AND user_id = ?`, id, userID)
	if errors.Is(err, sql.ErrNoRows) {
		return UserToken{}, fmt.Errorf("user token %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return UserToken{}, fmt.Errorf("read user token: %w", err)
	}
	return r.token(), nil
}

// UserTokens lists a user's tokens, revoked ones included, newest first.
func (s *Store) UserTokens(ctx context.Context, userID string) ([]UserToken, error) {
	var rows []userTokenRow
	if err := s.selectAll(ctx, &rows, `SELECT `+userTokenColumns+` FROM user_tokens WHERE user_id = ? ORDER BY created_at DESC, id DESC`, userID); err != nil {
		return nil, fmt.Errorf("list user tokens: %w", err)
	}
	out := make([]UserToken, len(rows))
	for i, r := range rows {
		out[i] = r.token()
	}
	return out, nil
}

// RevokeUserToken revokes one of a user's tokens at once (its next request
// is refused); revoking twice keeps the first time.
func (s *Store) RevokeUserToken(ctx context.Context, userID, id string) (UserToken, error) {
	res, err := s.exec(ctx, `UPDATE user_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ? AND user_id = ?`,
		s.now().UnixMilli(), id, userID)
	if err := affectedOne(res, err, "revoke user token", id); err != nil {
		return UserToken{}, err
	}
	return s.UserToken(ctx, userID, id)
}

// ErrTokenRejected means a presented personal token is unknown, revoked or
// expired, or its user is disabled.
var ErrTokenRejected = errors.New("personal token rejected")

// AuthenticateUserToken finds the usable token whose secret is presented
// and its user, read now (uncached: a revoked token or a disabled user is
// refused at the next request). Its last use is recorded, at most once a
// minute. The lookup is by the secret's SHA-256, as a client key's: how
// long an index search for a hash takes says nothing of the secret, so no
// comparison of secrets is left to be made in constant time.
func (s *Store) AuthenticateUserToken(ctx context.Context, secret string) (UserToken, User, error) {
	if !strings.HasPrefix(secret, UserTokenPrefix) {
		return UserToken{}, User{}, ErrTokenRejected
	}
	var r userTokenRow
	err := s.get(ctx, &r, `SELECT `+userTokenColumns+` FROM user_tokens WHERE token_hash = ?`, HashClientKey(secret))
	if errors.Is(err, sql.ErrNoRows) {
		return UserToken{}, User{}, ErrTokenRejected
	}
	if err != nil {
		return UserToken{}, User{}, fmt.Errorf("authenticate user token: %w", err)
	}
	t := r.token()
	now := s.now()
	if !t.Usable(now) {
		return UserToken{}, User{}, ErrTokenRejected
	}
	u, err := s.User(ctx, t.UserID)
	if errors.Is(err, ErrNotFound) || (err == nil && u.Disabled()) {
		return UserToken{}, User{}, ErrTokenRejected
	}
	if err != nil {
		return UserToken{}, User{}, fmt.Errorf("authenticate user token: %w", err)
	}
	if t.LastUsedAt.IsZero() || now.Sub(t.LastUsedAt) >= seenEvery {
		if _, err := s.exec(ctx, `UPDATE user_tokens SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at <= ?)`,
			now.UnixMilli(), t.ID, now.Add(-seenEvery).UnixMilli()); err != nil {
			return UserToken{}, User{}, fmt.Errorf("record user token use: %w", err)
		}
		t.LastUsedAt = time.UnixMilli(now.UnixMilli()).UTC()
	}
	return t, u, nil
}
