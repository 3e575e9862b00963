package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

// A console session's row: stored, seen (never backwards, not once
// revoked), revoked once, and unknown after its end is swept.
func TestConsoleSessions(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		t0 := clk.Now()
		require.NoError(t, s.CreateConsoleSession(ctx, store.ConsoleSession{ID: "cs1", Created: t0, Seen: t0, Expires: t0.Add(12 * time.Hour)}))
		assert.ErrorIs(t, s.CreateConsoleSession(ctx, store.ConsoleSession{ID: "cs1", Created: t0, Seen: t0, Expires: t0.Add(time.Hour)}), store.ErrConflict)
		require.NoError(t, s.CreateConsoleSession(ctx, store.ConsoleSession{ID: "cs2", UserID: "usr_1", Created: t0, Seen: t0, Expires: t0.Add(time.Hour)}))

		got, err := s.ConsoleSession(ctx, "cs1")
		require.NoError(t, err)
		assert.Equal(t, store.ConsoleSession{ID: "cs1", Created: t0, Seen: t0, Expires: t0.Add(12 * time.Hour)}, got)
		got, err = s.ConsoleSession(ctx, "cs2")
		require.NoError(t, err)
		assert.Equal(t, "usr_1", got.UserID)
		_, err = s.ConsoleSession(ctx, "nope")
		assert.ErrorIs(t, err, store.ErrNotFound)

		require.NoError(t, s.SeeConsoleSession(ctx, "cs1", t0.Add(5*time.Minute)))
		require.NoError(t, s.SeeConsoleSession(ctx, "cs1", t0.Add(2*time.Minute)), "an older sighting arriving late")
		got, err = s.ConsoleSession(ctx, "cs1")
		require.NoError(t, err)
		assert.Equal(t, t0.Add(5*time.Minute), got.Seen, "seen never moves back")

		require.NoError(t, s.RevokeConsoleSession(ctx, "cs1", t0.Add(6*time.Minute)))
		require.NoError(t, s.RevokeConsoleSession(ctx, "cs1", t0.Add(7*time.Minute)))
		require.NoError(t, s.SeeConsoleSession(ctx, "cs1", t0.Add(8*time.Minute)))
		got, err = s.ConsoleSession(ctx, "cs1")
		require.NoError(t, err)
		assert.Equal(t, t0.Add(6*time.Minute), got.Revoked, "the first sign-out counts")
		assert.Equal(t, t0.Add(5*time.Minute), got.Seen, "a signed-out session is not seen again")
		assert.NoError(t, s.RevokeConsoleSession(ctx, "nope", t0), "signing out a swept session is no error")

		n, err := s.DeleteEndedConsoleSessions(ctx, t0.Add(time.Hour-time.Millisecond))
		require.NoError(t, err)
		assert.Zero(t, n, "none has ended")
		n, err = s.DeleteEndedConsoleSessions(ctx, t0.Add(time.Hour))
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "cs2 ended at its hour")
		_, err = s.ConsoleSession(ctx, "cs2")
		assert.ErrorIs(t, err, store.ErrNotFound)
		_, err = s.ConsoleSession(ctx, "cs1")
		assert.NoError(t, err, "cs1, signed out, stays until its own end")
		n, err = s.DeleteEndedConsoleSessions(ctx, t0.Add(12*time.Hour))
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		_, err = s.ConsoleSession(ctx, "cs1")
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
}

// A person's standing sessions are listed, newest first, and signed out
// all at once; the admin token's (no user) are theirs apart.
func TestConsoleSessionsOfAPerson(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		t0 := clk.Now()
		mk := func(id, user string, created time.Time, ttl time.Duration) {
			require.NoError(t, s.CreateConsoleSession(ctx, store.ConsoleSession{ID: id, UserID: user, Created: created, Seen: created, Expires: created.Add(ttl)}))
		}
		mk("a1", "usr_a", t0, time.Hour)
		mk("a2", "usr_a", t0.Add(time.Minute), time.Hour)
		mk("a3", "usr_a", t0, time.Minute) // ends before the list
		mk("b1", "usr_b", t0, time.Hour)
		mk("t1", "", t0, time.Hour)
		require.NoError(t, s.RevokeConsoleSession(ctx, "a1", t0.Add(2*time.Minute)))
		mk("a4", "usr_a", t0.Add(3*time.Minute), time.Hour)

		ids := func(user string) []string {
			got, err := s.ConsoleSessionsOf(ctx, user, t0.Add(5*time.Minute))
			require.NoError(t, err)
			var out []string
			for _, cs := range got {
				out = append(out, cs.ID)
			}
			return out
		}
		assert.Equal(t, []string{"a4", "a2"}, ids("usr_a"), "standing ones only, newest first")
		assert.Equal(t, []string{"t1"}, ids(""), "the admin token's")
		n, err := s.RevokeConsoleSessionsOf(ctx, "usr_a", t0.Add(6*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		assert.Empty(t, ids("usr_a"))
		assert.Equal(t, []string{"b1"}, ids("usr_b"), "another person's stand")
		assert.Equal(t, []string{"t1"}, ids(""))
	})
}
