package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

// An OpenID Connect sign-in under way serves one callback: taken once,
// refused after (a replay), refused past its expiry, and a state is never
// stored twice.
func TestOIDCLogins(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		t0 := clk.Now()
		l := store.OIDCLogin{State: "st1", Nonce: "n1", Verifier: "v1", Next: "/admin/keys", Created: t0, Expires: t0.Add(10 * time.Minute)}
		require.NoError(t, s.PutOIDCLogin(ctx, l))
		assert.ErrorIs(t, s.PutOIDCLogin(ctx, l), store.ErrConflict)
		require.Error(t, s.PutOIDCLogin(ctx, store.OIDCLogin{State: "x", Created: t0, Expires: t0.Add(time.Minute)}), "a nonce and a verifier are required")

		got, err := s.TakeOIDCLogin(ctx, "st1", t0.Add(time.Minute))
		require.NoError(t, err)
		assert.Equal(t, "n1", got.Nonce)
		assert.Equal(t, "v1", got.Verifier)
		assert.Equal(t, "/admin/keys", got.Next)
		assert.True(t, got.Expires.Equal(l.Expires))
		_, err = s.TakeOIDCLogin(ctx, "st1", t0.Add(time.Minute))
		assert.ErrorIs(t, err, store.ErrNotFound, "a state serves one callback")
		_, err = s.TakeOIDCLogin(ctx, "never", t0)
		assert.ErrorIs(t, err, store.ErrNotFound)

		require.NoError(t, s.PutOIDCLogin(ctx, store.OIDCLogin{State: "st2", Nonce: "n", Verifier: "v", Created: t0, Expires: t0.Add(time.Minute)}))
		_, err = s.TakeOIDCLogin(ctx, "st2", t0.Add(2*time.Minute))
		assert.ErrorIs(t, err, store.ErrNotFound, "past its expiry")
	})
}
