package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
)

// Users: created with a unique email whatever its case, read by id and by
// email, changed (before and after), disabled and enabled, deleted with
// their tokens and console sessions.
func TestUsers(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		ann, err := s.CreateUser(ctx, store.User{Email: "Ann@Example.com", Name: " Ann ", Role: roles.Operator})
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(ann.ID, "usr_"))
		assert.Equal(t, store.User{ID: ann.ID, Email: "Ann@Example.com", Name: "Ann", Role: roles.Operator, CreatedAt: clk.Now()}, ann)

		_, err = s.CreateUser(ctx, store.User{Email: "ann@example.COM", Role: roles.Viewer})
		assert.ErrorIs(t, err, store.ErrConflict, "email is unique whatever its case")
		for _, bad := range []store.User{{Email: "not an address", Role: roles.Viewer}, {Email: "Ann <a@b.c>", Role: roles.Viewer},
			{Email: "b@example.com", Role: "root"}, {Email: "b@example.com"}} {
			_, err = s.CreateUser(ctx, bad)
			assert.ErrorIs(t, err, store.ErrInvalid, "%+v", bad)
		}
		bob, err := s.CreateUser(ctx, store.User{Email: "bob@example.com", Role: roles.Viewer})
		require.NoError(t, err)

		got, err := s.UserByEmail(ctx, "ANN@example.com")
		require.NoError(t, err)
		assert.Equal(t, ann, got)
		_, err = s.UserByEmail(ctx, "nobody@example.com")
		assert.ErrorIs(t, err, store.ErrNotFound)
		all, err := s.Users(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)
		assert.Equal(t, []string{ann.ID, bob.ID}, []string{all[0].ID, all[1].ID}, "by email")

		admin, yes := roles.Admin, true
		clk.Add(time.Minute)
		before, after, err := s.UpdateUser(ctx, bob.ID, store.UserChange{Role: &admin, Disabled: &yes})
		require.NoError(t, err)
		assert.Equal(t, bob, before)
		assert.Equal(t, roles.Admin, after.Role)
		assert.Equal(t, clk.Now(), after.DisabledAt)
		assert.True(t, after.Disabled())
		clk.Add(time.Minute)
		_, again, err := s.UpdateUser(ctx, bob.ID, store.UserChange{Disabled: &yes})
		require.NoError(t, err)
		assert.Equal(t, after.DisabledAt, again.DisabledAt, "disabling twice keeps the first time")
		no := false
		_, enabled, err := s.UpdateUser(ctx, bob.ID, store.UserChange{Disabled: &no})
		require.NoError(t, err)
		assert.False(t, enabled.Disabled())
		root := roles.Role("root")
		_, _, err = s.UpdateUser(ctx, bob.ID, store.UserChange{Role: &root})
		assert.ErrorIs(t, err, store.ErrInvalid)
		_, _, err = s.UpdateUser(ctx, "usr_nope", store.UserChange{Role: &admin})
		assert.ErrorIs(t, err, store.ErrNotFound)

		// Last seen: written at most once a minute.
		t0 := clk.Now()
		require.NoError(t, s.SeeUser(ctx, ann.ID, t0))
		require.NoError(t, s.SeeUser(ctx, ann.ID, t0.Add(30*time.Second)))
		got, err = s.User(ctx, ann.ID)
		require.NoError(t, err)
		assert.Equal(t, t0, got.LastSeenAt, "a sighting within the minute is not written")
		require.NoError(t, s.SeeUser(ctx, ann.ID, t0.Add(time.Minute)))
		got, err = s.User(ctx, ann.ID)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(time.Minute), got.LastSeenAt)

		// Deleting a user takes their tokens and signs their sessions out.
		_, secret, err := s.CreateUserToken(ctx, store.UserToken{UserID: ann.ID, Name: "ci"})
		require.NoError(t, err)
		require.NoError(t, s.CreateConsoleSession(ctx, store.ConsoleSession{ID: "cs_ann", UserID: ann.ID, Created: t0, Seen: t0, Expires: t0.Add(time.Hour)}))
		gone, err := s.DeleteUser(ctx, ann.ID)
		require.NoError(t, err)
		assert.Equal(t, ann.ID, gone.ID)
		_, err = s.User(ctx, ann.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		assert.ErrorIs(t, err, store.ErrTokenRejected)
		cs, err := s.ConsoleSession(ctx, "cs_ann")
		require.NoError(t, err)
		assert.False(t, cs.Revoked.IsZero(), "the user's session is signed out")
		_, err = s.DeleteUser(ctx, ann.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
}

// A personal token: shown once, stored hashed, authenticates until it is
// revoked or expires or its user is disabled; its last use is written at
// most once a minute.
func TestUserTokens(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		u, err := s.CreateUser(ctx, store.User{Email: "ops@example.com", Role: roles.Admin})
		require.NoError(t, err)
		other, err := s.CreateUser(ctx, store.User{Email: "other@example.com", Role: roles.Viewer})
		require.NoError(t, err)

		tok, secret, err := s.CreateUserToken(ctx, store.UserToken{UserID: u.ID, Name: " ci ", Role: roles.Viewer, ExpiresAt: clk.Now().Add(time.Hour)})
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(secret, store.UserTokenPrefix))
		assert.Len(t, secret, len(store.UserTokenPrefix)+32)
		assert.True(t, strings.HasPrefix(secret, tok.Prefix))
		assert.Equal(t, "ci", tok.Name)
		assert.Equal(t, roles.Viewer, tok.Role)
		assert.True(t, tok.LastUsedAt.IsZero())

		for _, bad := range []store.UserToken{{UserID: u.ID}, {UserID: u.ID, Name: "x", Role: "root"}} {
			_, _, err = s.CreateUserToken(ctx, bad)
			assert.ErrorIs(t, err, store.ErrInvalid)
		}
		_, _, err = s.CreateUserToken(ctx, store.UserToken{UserID: "usr_nope", Name: "x"})
		assert.ErrorIs(t, err, store.ErrNotFound)

		got, owner, err := s.AuthenticateUserToken(ctx, secret)
		require.NoError(t, err)
		assert.Equal(t, tok.ID, got.ID)
		assert.Equal(t, u.ID, owner.ID)
		assert.Equal(t, clk.Now(), got.LastUsedAt)
		t0 := clk.Now()
		clk.Add(30 * time.Second)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		require.NoError(t, err)
		listed, err := s.UserTokens(ctx, u.ID)
		require.NoError(t, err)
		require.Len(t, listed, 1)
		assert.Equal(t, t0, listed[0].LastUsedAt, "a use within the minute is not written")
		clk.Add(30 * time.Second)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		require.NoError(t, err)
		listed, err = s.UserTokens(ctx, u.ID)
		require.NoError(t, err)
		assert.Equal(t, clk.Now(), listed[0].LastUsedAt)

		for _, wrong := range []string{"", "crp_", secret + "x", strings.ToUpper(secret), "crk_" + secret[4:]} {
			_, _, err = s.AuthenticateUserToken(ctx, wrong)
			assert.ErrorIs(t, err, store.ErrTokenRejected, "%q", wrong)
		}

		// Another user's token id is not this user's.
		_, err = s.RevokeUserToken(ctx, other.ID, tok.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		none, err := s.UserTokens(ctx, other.ID)
		require.NoError(t, err)
		assert.Empty(t, none)

		// A disabled user's token stops; enabled again, it works again.
		yes, no := true, false
		_, _, err = s.UpdateUser(ctx, u.ID, store.UserChange{Disabled: &yes})
		require.NoError(t, err)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		assert.ErrorIs(t, err, store.ErrTokenRejected)
		_, _, err = s.UpdateUser(ctx, u.ID, store.UserChange{Disabled: &no})
		require.NoError(t, err)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		require.NoError(t, err)

		// Expired.
		clk.Add(time.Hour)
		_, _, err = s.AuthenticateUserToken(ctx, secret)
		assert.ErrorIs(t, err, store.ErrTokenRejected, "expired")

		// Revoked, once.
		tok2, secret2, err := s.CreateUserToken(ctx, store.UserToken{UserID: u.ID, Name: "laptop"})
		require.NoError(t, err)
		revoked, err := s.RevokeUserToken(ctx, u.ID, tok2.ID)
		require.NoError(t, err)
		assert.Equal(t, clk.Now(), revoked.RevokedAt)
		clk.Add(time.Minute)
		again, err := s.RevokeUserToken(ctx, u.ID, tok2.ID)
		require.NoError(t, err)
		assert.Equal(t, revoked.RevokedAt, again.RevokedAt)
		_, _, err = s.AuthenticateUserToken(ctx, secret2)
		assert.ErrorIs(t, err, store.ErrTokenRejected, "revoked")
		listed, err = s.UserTokens(ctx, u.ID)
		require.NoError(t, err)
		assert.Equal(t, []string{tok2.ID, tok.ID}, []string{listed[0].ID, listed[1].ID}, "newest first")
	})
}

// The audit log keeps the person behind a token, and a filter by their
// email finds what they did through it.
func TestAuditNamesThePersonBehindAToken(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		_, err := s.RecordAudit(ctx, store.AuditEntry{Actor: "token:ci", UserEmail: "ann@example.com", Action: "key.create"})
		require.NoError(t, err)
		_, err = s.RecordAudit(ctx, store.AuditEntry{Actor: "ann@example.com", Action: "account.pause"})
		require.NoError(t, err)
		_, err = s.RecordAudit(ctx, store.AuditEntry{Actor: "admin-token", Action: "login"})
		require.NoError(t, err)
		got, total, err := s.AuditLog(ctx, store.AuditFilter{Actor: "ann@example.com"})
		require.NoError(t, err)
		assert.Equal(t, 2, total)
		for _, e := range got {
			assert.NotEqual(t, "admin-token", e.Actor)
		}
		got, total, err = s.AuditLog(ctx, store.AuditFilter{Actor: "token:ci"})
		require.NoError(t, err)
		require.Equal(t, 1, total)
		assert.Equal(t, "ann@example.com", got[0].UserEmail)
	})
}
