package store_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// eachTwoProcesses runs f on each backend with two stores on one database
// (two replicas, or the CLI beside serve) sharing one clock, opened with
// opts and that clock.
func eachTwoProcesses(t *testing.T, opts store.Options, f func(t *testing.T, one, other *store.Store, clk *clock)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			url := b.URL(t)
			clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			opts.Now = clk.Now
			f(t, storetest.Open(t, url, opts), storetest.Open(t, url, opts), clk)
		})
	}
}

// The accounts listing is reused, but a write through the same store shows
// at once, and a write by another process (a second store on the same
// database) shows once the listing's second has passed.
func TestAccountsListingFollowsWrites(t *testing.T) {
	eachTwoProcesses(t, store.Options{}, func(t *testing.T, one, other *store.Store, clk *clock) {
		ctx := context.Background()

		a, err := one.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		status := func(s *store.Store) store.Status {
			t.Helper()
			list, err := s.Accounts(ctx)
			require.NoError(t, err)
			require.Len(t, list, 1)
			return list[0].Status
		}
		assert.Equal(t, store.StatusActive, status(one))
		assert.Equal(t, store.StatusActive, status(other))

		_, err = one.SetAccountStatus(ctx, a.ID, store.StatusPaused, "by hand", time.Time{})
		require.NoError(t, err)
		assert.Equal(t, store.StatusPaused, status(one), "a write through this store shows at once")
		assert.Equal(t, store.StatusActive, status(other), "the other process reuses its listing within its second")
		clk.Add(time.Second)
		assert.Equal(t, store.StatusPaused, status(other), "and sees the change after it")

		// A caller changing its copy does not change the cached listing.
		list, err := one.Accounts(ctx)
		require.NoError(t, err)
		list[0].Label = "changed"
		again, err := one.Accounts(ctx)
		require.NoError(t, err)
		assert.Equal(t, "a", again[0].Label)

		require.NoError(t, one.DeleteAccount(ctx, a.ID))
		list, err = one.Accounts(ctx)
		require.NoError(t, err)
		assert.Empty(t, list)
	})
}

// A usage write keeps this store's listing, with the new windows in it as
// a fresh read shows them, instead of dropping it (every answer reports
// usage: a dropped listing meant a read of every account per request).
func TestUsageWriteKeepsTheListing(t *testing.T) {
	eachTwoProcesses(t, store.Options{}, func(t *testing.T, one, other *store.Store, clk *clock) {
		ctx := context.Background()
		a, err := one.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "w"}, store.Credentials{AccessToken: "t"})
		require.NoError(t, err)
		_, err = one.Accounts(ctx)
		require.NoError(t, err)
		renamed := "renamed"
		_, err = other.UpdateAccount(ctx, a.ID, store.AccountPatch{Label: &renamed})
		require.NoError(t, err)

		clk.Add(300 * time.Millisecond)
		reset := clk.Now().Add(3*time.Hour + 123456789*time.Nanosecond)
		require.NoError(t, one.UpdateUsage(ctx, a.ID, store.Window{UsedPercent: 37.5, WindowMinutes: 300, ResetAt: reset, Known: true},
			store.Window{UsedPercent: 5, WindowMinutes: 10080, Known: true}))
		list, err := one.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, "a", list[0].Label, "the listing was kept, not read again")
		fresh, err := other.Account(ctx, a.ID)
		require.NoError(t, err)
		assert.Equal(t, fresh.Primary, list[0].Primary, "the windows as the database holds them")
		assert.Equal(t, fresh.Secondary, list[0].Secondary)
		assert.Equal(t, fresh.UsageUpdatedAt, list[0].UsageUpdatedAt)

		clk.Add(time.Second)
		list, err = one.Accounts(ctx)
		require.NoError(t, err)
		assert.Equal(t, "renamed", list[0].Label, "past its second the listing is read again")
	})
}

// The credentials the request path reads are reused for a second: a write
// through the same store (new tokens) drops them at once, a usage write
// does not, and a write by another process shows once the second has
// passed. TokenState always reads the database.
func TestCurrentCredentialsFollowWrites(t *testing.T) {
	eachTwoProcesses(t, store.Options{SecretKey: bytes.Repeat([]byte{7}, 32)}, func(t *testing.T, one, other *store.Store, clk *clock) {
		ctx := context.Background()
		a, err := one.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "w"},
			store.Credentials{AccessToken: "at-1", RefreshToken: "rt-1"})
		require.NoError(t, err)
		access := func(s *store.Store) string {
			t.Helper()
			c, _, err := s.CurrentCredentials(ctx, a.ID)
			require.NoError(t, err)
			return c.AccessToken
		}
		assert.Equal(t, "at-1", access(one))

		exp := clk.Now().Add(time.Hour)
		require.NoError(t, one.SetCredentials(ctx, a.ID, store.Credentials{AccessToken: "at-2", RefreshToken: "rt-2"}, exp))
		assert.Equal(t, "at-2", access(one), "a write through this store shows at once")
		_, gotExp, err := one.CurrentCredentials(ctx, a.ID)
		require.NoError(t, err)
		assert.True(t, exp.Truncate(time.Millisecond).Equal(gotExp))

		require.NoError(t, other.SetCredentials(ctx, a.ID, store.Credentials{AccessToken: "at-3", RefreshToken: "rt-3"}, exp))
		require.NoError(t, one.UpdateUsage(ctx, a.ID, store.Window{UsedPercent: 12, WindowMinutes: 300, Known: true}, store.Window{}))
		assert.Equal(t, "at-2", access(one), "another process's write is not seen within the second; a usage write drops nothing")
		fresh, _, err := one.TokenState(ctx, a.ID)
		require.NoError(t, err)
		assert.Equal(t, "at-3", fresh.AccessToken, "TokenState reads the database")
		clk.Add(time.Second)
		assert.Equal(t, "at-3", access(one), "past the second it is read again")

		require.NoError(t, one.DeleteAccount(ctx, a.ID))
		_, _, err = one.CurrentCredentials(ctx, a.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
}

// A usage report that repeats the stored one is not written again for 30
// seconds; a changed report is written at once.
func TestUpdateUsageSkipsRepeats(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "w"}, store.Credentials{AccessToken: "t"})
		require.NoError(t, err)
		reset := clk.Now().Add(3 * time.Hour)
		w := store.Window{UsedPercent: 10, WindowMinutes: 300, ResetAt: reset, Known: true}
		report := func(w store.Window) time.Time {
			t.Helper()
			_, err := s.Accounts(ctx) // the request path lists accounts before every report
			require.NoError(t, err)
			require.NoError(t, s.UpdateUsage(ctx, a.ID, w, store.Window{}))
			got, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			assert.InDelta(t, w.UsedPercent, got.Primary.UsedPercent, 0.001)
			return got.UsageUpdatedAt
		}
		first := report(w)
		assert.True(t, first.Equal(clk.Now()))

		clk.Add(10 * time.Second)
		drifted := w
		drifted.ResetAt = reset.Add(5 * time.Second) // a relative reset, read a little later
		assert.True(t, report(drifted).Equal(first), "a repeat is not written")

		clk.Add(time.Second)
		changed := w
		changed.UsedPercent = 11
		assert.True(t, report(changed).Equal(clk.Now()), "a change is written at once")

		clk.Add(31 * time.Second)
		assert.True(t, report(changed).Equal(clk.Now()), "a repeat is written after 30 seconds, to keep the time fresh")
	})
}
