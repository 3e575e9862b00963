package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

var unavailable = []store.Status{store.StatusPaused, store.StatusRateLimited, store.StatusQuotaExceeded}

func TestRetireOwnerIsACompareAndSet(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		b, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "b"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		pin, err := s.Pin(ctx, store.BindRawSession, "sess", a.ID, "pin")
		require.NoError(t, err)

		ok, err := s.RetireOwner(ctx, pin.ID, a.ID, unavailable, "process_session:goal_restart")
		require.NoError(t, err)
		assert.False(t, ok, "an active owner is not retired")

		_, err = s.SetAccountStatus(ctx, a.ID, store.StatusRateLimited, "usage_limit_reached", time.Now().Add(time.Hour))
		require.NoError(t, err)
		ok, err = s.RetireOwner(ctx, pin.ID, b.ID, unavailable, "process_session:goal_restart")
		require.NoError(t, err)
		assert.False(t, ok, "the owner changed: the retirement loses")

		// Concurrent retirements: exactly one wins.
		var wins atomic.Int32
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.RetireOwner(ctx, pin.ID, a.ID, unavailable, "process_session:goal_restart")
				assert.NoError(t, err)
				if ok {
					wins.Add(1)
				}
			}()
		}
		wg.Wait()
		assert.EqualValues(t, 1, wins.Load())
		got, err := s.Binding(ctx, pin.ID)
		require.NoError(t, err)
		assert.Equal(t, "process_session:goal_restart", got.AbandonedScope)
		live, err := s.BindingsFor(ctx, store.BindingLookup{RawSession: "sess"})
		require.NoError(t, err)
		assert.Empty(t, live, "an abandoned pin binds nothing")

		// A recovered owner is not retired.
		pin2, err := s.Pin(ctx, store.BindRawSession, "sess2", a.ID, "pin")
		require.NoError(t, err)
		_, err = s.SetAccountStatus(ctx, a.ID, store.StatusActive, "", time.Time{})
		require.NoError(t, err)
		ok, err = s.RetireOwner(ctx, pin2.ID, a.ID, unavailable, "process_session:goal_restart")
		require.NoError(t, err)
		assert.False(t, ok, "a concurrent recovery wins")
	})
}
