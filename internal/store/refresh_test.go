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

// A refresh claim is exclusive while it lives, lapses at its expiry so a
// crashed holder cannot block an account forever, and is given up by
// release or commit; a late release of a claim taken over drops nothing.
func TestRefreshClaims(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			clk := &clock{t: time.UnixMilli(1_800_000_000_000).UTC()}
			s := storetest.Open(t, b.URL(t), store.Options{Now: clk.Now})
			a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "ws-a"},
				store.Credentials{AccessToken: "at-1", RefreshToken: "rt-1"})
			require.NoError(t, err)

			_, held, err := s.RefreshClaimOf(ctx, a.ID)
			require.NoError(t, err)
			assert.False(t, held)

			c1, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-1", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, "replica-1", c1.Owner)
			assert.Equal(t, clk.Now().Add(time.Minute), c1.ExpiresAt)

			holder, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-2", time.Minute)
			require.NoError(t, err)
			assert.False(t, ok, "a live claim is exclusive")
			assert.Equal(t, c1.ID, holder.ID, "the loser learns who holds it")

			clk.Add(time.Minute)
			c2, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-2", time.Minute)
			require.NoError(t, err)
			require.True(t, ok, "a lapsed claim is taken over")
			assert.NotEqual(t, c1.ID, c2.ID)

			require.NoError(t, s.ReleaseRefresh(ctx, c1), "a late release by the first holder")
			cur, held, err := s.RefreshClaimOf(ctx, a.ID)
			require.NoError(t, err)
			require.True(t, held, "drops nothing of the new holder's")
			assert.Equal(t, c2.ID, cur.ID)

			require.NoError(t, s.ReleaseRefresh(ctx, c2))
			_, held, err = s.RefreshClaimOf(ctx, a.ID)
			require.NoError(t, err)
			assert.False(t, held)

			// Commit writes credentials and expiry together and gives the claim up.
			c3, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-1", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			exp := clk.Now().Add(10 * 24 * time.Hour)
			rotated := store.Credentials{AccessToken: "at-2", RefreshToken: "rt-2", IDToken: "id-2"}
			require.NoError(t, s.CommitRefresh(ctx, c3, rotated, exp))
			cred, gotExp, err := s.TokenState(ctx, a.ID)
			require.NoError(t, err)
			assert.Equal(t, rotated, cred)
			assert.True(t, exp.Equal(gotExp), "want %v got %v", exp, gotExp)
			acct, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			assert.True(t, exp.Equal(acct.AccessExpiresAt))
			_, held, err = s.RefreshClaimOf(ctx, a.ID)
			require.NoError(t, err)
			assert.False(t, held, "commit gives the claim up")

			// A commit whose claim was taken over still stores the rotated
			// tokens: they are the only ones the auth server accepts now.
			c4, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-1", time.Second)
			require.NoError(t, err)
			require.True(t, ok)
			clk.Add(2 * time.Second)
			c5, ok, err := s.ClaimRefresh(ctx, a.ID, "replica-2", time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			require.NoError(t, s.CommitRefresh(ctx, c4, store.Credentials{AccessToken: "at-3", RefreshToken: "rt-3"}, time.Time{}))
			cred, gotExp, err = s.TokenState(ctx, a.ID)
			require.NoError(t, err)
			assert.Equal(t, "rt-3", cred.RefreshToken)
			assert.True(t, gotExp.IsZero())
			cur, held, err = s.RefreshClaimOf(ctx, a.ID)
			require.NoError(t, err)
			require.True(t, held)
			assert.Equal(t, c5.ID, cur.ID, "the late commit leaves the new holder's claim")

			_, _, err = s.TokenState(ctx, "acc_missing")
			assert.ErrorIs(t, err, store.ErrNotFound)
			assert.ErrorIs(t, s.CommitRefresh(ctx, store.RefreshClaim{AccountID: "acc_missing", ID: "x"}, store.Credentials{}, time.Time{}), store.ErrNotFound)
			_, _, err = s.ClaimRefresh(ctx, a.ID, "r", 0)
			assert.Error(t, err)
		})
	}
}

// Replicas racing for one account's claim: exactly one wins, whichever
// store handle (connection pool) each uses.
func TestRefreshClaimRace(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.URL(t)
			stores := []*store.Store{storetest.Open(t, url, store.Options{}), storetest.Open(t, url, store.Options{})}
			a, err := stores[0].CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "ws-a"},
				store.Credentials{AccessToken: "at", RefreshToken: "rt"})
			require.NoError(t, err)
			for round := range 5 {
				var wins atomic.Int32
				var wg sync.WaitGroup
				claims := make(chan store.RefreshClaim, 16)
				for i := range 16 {
					wg.Go(func() {
						c, ok, err := stores[i%2].ClaimRefresh(ctx, a.ID, "replica", time.Minute)
						assert.NoError(t, err)
						if ok {
							wins.Add(1)
							claims <- c
						}
					})
				}
				wg.Wait()
				close(claims)
				require.EqualValues(t, 1, wins.Load(), "round %d: exactly one claim wins", round)
				require.NoError(t, stores[round%2].ReleaseRefresh(ctx, <-claims))
			}
		})
	}
}
