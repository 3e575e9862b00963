package oauth_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// usageStub is a usage endpoint that always answers body.
func usageStub(t testing.TB, body string) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/backend-api/wham/usage"
}

func TestRecover(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0).UTC()
	cases := []struct {
		name string
		a    store.Account
		want store.Status
		due  bool
	}{
		{"rate limited, reset passed", store.Account{Status: store.StatusRateLimited, StatusUntil: now.Add(-time.Second)}, store.StatusActive, true},
		{"rate limited, reset now", store.Account{Status: store.StatusRateLimited, StatusUntil: now}, store.StatusActive, true},
		{"rate limited, reset to come", store.Account{Status: store.StatusRateLimited, StatusUntil: now.Add(time.Second)}, store.StatusRateLimited, false},
		{"quota exceeded, reset passed", store.Account{Status: store.StatusQuotaExceeded, StatusUntil: now.Add(-time.Hour)}, store.StatusActive, true},
		{"quota exceeded, reset to come", store.Account{Status: store.StatusQuotaExceeded, StatusUntil: now.Add(time.Hour)}, store.StatusQuotaExceeded, false},
		{"limited without a reset time is probed", store.Account{Status: store.StatusRateLimited}, store.StatusActive, true},
		{"paused stays paused", store.Account{Status: store.StatusPaused, StatusUntil: now.Add(-time.Hour)}, store.StatusPaused, false},
		{"reauth stays", store.Account{Status: store.StatusReauthRequired}, store.StatusReauthRequired, false},
		{"active", store.Account{Status: store.StatusActive}, store.StatusActive, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, due := oauth.Recover(tc.a, now)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.due, due)
		})
	}
}

func TestUsageURL(t *testing.T) {
	t.Parallel()
	assert.Equal(t, oauth.DefaultUsageURL, oauth.UsageURL("https://chatgpt.com/backend-api/codex"))
	assert.Equal(t, "http://127.0.0.1:9/backend-api/wham/usage", oauth.UsageURL("http://127.0.0.1:9/backend-api/codex"))
	assert.Empty(t, oauth.UsageURL("https://api.openai.com/v1"), "no endpoint the operator named: nothing is polled")
	assert.Empty(t, oauth.UsageURL("http://127.0.0.1:9/codex"))
}

// usageEnv is a sim, a store and a poller sharing one clock.
type usageEnv struct {
	clk    *clock
	sim    *sim.Server
	st     *store.Store
	poller *oauth.UsagePoller
}

func newUsageEnv(t *testing.T, st *store.Store, clk *clock, accts ...sim.Account) *usageEnv {
	upstream := newSim(t, clk, accts...)
	hc := httpClient(t)
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: hc, TokenURL: upstream.TokenURL(), Now: clk.Now})
	t.Cleanup(r.Close)
	return &usageEnv{clk: clk, sim: upstream, st: st,
		poller: oauth.NewUsagePoller(oauth.UsagePollerConfig{Store: st, Tokens: r, HTTPClient: hc, Now: clk.Now})}
}

func TestPollOnceWritesWindows(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := t.Context()
			clk := newClock()
			st := openStore(t, b.URL(t), clk)
			sa := simAccount("a1", "")
			sa.Primary = sim.Window{UsedPercent: 42, ResetsIn: sim.Duration(90 * time.Minute)}
			sa.Secondary = sim.Window{UsedPercent: 7}
			env := newUsageEnv(t, st, clk, sa)
			acct := addAccount(t, st, env.sim, sa, time.Time{})

			got, err := env.poller.PollOnce(ctx, acct)
			require.NoError(t, err)
			assert.True(t, got.Primary.Known)
			assert.Equal(t, 42.0, got.Primary.UsedPercent)
			assert.Equal(t, 300, got.Primary.WindowMinutes)
			assert.Equal(t, clk.Now().Add(90*time.Minute), got.Primary.ResetAt)
			assert.Equal(t, 7.0, got.Secondary.UsedPercent)
			assert.Equal(t, 10080, got.Secondary.WindowMinutes)
			assert.Equal(t, clk.Now(), got.UsageUpdatedAt)
			assert.Equal(t, store.StatusActive, got.Status)
			recs := env.sim.Records(sim.RecordFilter{Route: sim.RouteUsage})
			require.Len(t, recs, 1)
			assert.Equal(t, "cg-a1", recs[0].ChatGPTAccountID, "the usage request names the workspace")
			assert.Equal(t, "a1", recs[0].Account)

			// API-key accounts have no usage endpoint: left alone.
			key, err := st.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "k"}, store.Credentials{APIKey: "sk"})
			require.NoError(t, err)
			_, err = env.poller.PollOnce(ctx, key)
			require.NoError(t, err)
			assert.Len(t, env.sim.Records(sim.RecordFilter{Route: sim.RouteUsage}), 1)

			// A chatgpt account on a base without a /backend-api root has no
			// usage endpoint anyone named: nothing is called (not chatgpt.com).
			bare := sa
			bare.ID = "a2"
			other := addAccount(t, st, env.sim, bare, time.Time{})
			other, err = st.UpdateAccount(ctx, other.ID, store.AccountPatch{BaseURL: new("http://127.0.0.1:9/codex")})
			require.NoError(t, err)
			assert.False(t, env.poller.Polls(other))
			got, err = env.poller.PollOnce(ctx, other)
			require.NoError(t, err, "no request was tried")
			assert.False(t, got.Primary.Known)
		})
	}
}

// A rate-limited account comes back at its reset time, after a successful
// probe, and not before; a failed probe leaves it limited for the next try;
// a probe that still finds the window used up keeps it limited until the
// new reset. An active account whose window is used up is limited.
func TestLimitedAccountComesBackAfterItsReset(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := t.Context()
			clk := newClock()
			st := openStore(t, b.URL(t), clk)
			sa := simAccount("a1", "")
			sa.Primary = sim.Window{UsedPercent: 100, ResetsIn: sim.Duration(time.Hour)}
			env := newUsageEnv(t, st, clk, sa)
			acct := addAccount(t, st, env.sim, sa, time.Time{})
			reset := clk.Now().Add(time.Hour)

			// The request path got a 429 usage_limit_reached and limited
			// the account until the reset it named.
			_, err := st.SetAccountStatus(ctx, acct.ID, store.StatusRateLimited, "usage_limit_reached", reset)
			require.NoError(t, err)
			got, err := env.poller.PollOnce(ctx, acct)
			require.NoError(t, err)
			assert.Equal(t, store.StatusRateLimited, got.Status)
			assert.Equal(t, reset, got.StatusUntil)
			assert.Equal(t, "usage_limit_reached", got.StatusReason, "a poll before the reset changes nothing")

			// Half-way: no probe may bring it back, whatever the usage says.
			clk.Advance(30 * time.Minute)
			sa.Primary = sim.Window{UsedPercent: 3}
			require.NoError(t, env.sim.AddAccounts(sa)) // the upstream's window already looks fresh
			got, err = env.poller.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusRateLimited, got.Status, "not before its reset time")
			assert.Equal(t, 3.0, got.Primary.UsedPercent, "the windows are still updated")

			// Past the reset, but the upstream is down: the probe fails and
			// the account stays limited, to be probed again.
			clk.Advance(30*time.Minute + time.Second)
			idle := oauth.NewRefresher(oauth.RefresherConfig{Store: st, Now: clk.Now})
			defer idle.Close()
			down := oauth.NewUsagePoller(oauth.UsagePollerConfig{Store: st, Tokens: idle,
				HTTPClient: httpClient(t), Now: clk.Now, UsageURL: deadURL(t)})
			_, err = down.PollOnce(ctx, got)
			require.Error(t, err)
			got, err = st.Account(ctx, acct.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusRateLimited, got.Status, "a failed probe changes nothing")

			// The upstream still says the limit is reached (its window not yet
			// rolled over): no return to active on that word.
			stale := oauth.NewUsagePoller(oauth.UsagePollerConfig{Store: st, Tokens: idle, HTTPClient: httpClient(t), Now: clk.Now,
				UsageURL: usageStub(t, `{"rate_limit":{"limit_reached":true,"primary_window":{"used_percent":100,"limit_window_seconds":18000,"reset_at":1}}}`)})
			got, err = stale.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusRateLimited, got.Status)

			// The probe succeeds: active again, with no restart and no operator.
			got, err = env.poller.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, got.Status)
			assert.True(t, got.StatusUntil.IsZero())
			assert.Contains(t, got.StatusReason, "probe")

			// Quota: the poller finds the weekly window used up on an active
			// account and limits it until that reset;
			// a due probe that finds it used up again moves the end.
			sa.Secondary = sim.Window{UsedPercent: 100, ResetsIn: sim.Duration(2 * time.Hour)}
			require.NoError(t, env.sim.AddAccounts(sa))
			got, err = env.poller.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusQuotaExceeded, got.Status)
			assert.Equal(t, clk.Now().Add(2*time.Hour), got.StatusUntil)
			clk.Advance(2 * time.Hour)
			sa.Secondary = sim.Window{UsedPercent: 100, ResetsIn: sim.Duration(24 * time.Hour)}
			require.NoError(t, env.sim.AddAccounts(sa))
			got, err = env.poller.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusQuotaExceeded, got.Status)
			assert.Equal(t, clk.Now().Add(24*time.Hour), got.StatusUntil, "limited until the new reset")

			// Operator states are never touched by the poller.
			_, err = st.SetAccountStatus(ctx, acct.ID, store.StatusPaused, "maintenance", time.Time{})
			require.NoError(t, err)
			clk.Advance(25 * time.Hour)
			got, err = env.poller.PollOnce(ctx, got)
			require.NoError(t, err)
			assert.Equal(t, store.StatusPaused, got.Status)
		})
	}
}

// The poller refreshes an expired token before polling, and once more after
// a 401.
func TestPollerUsesFreshTokens(t *testing.T) {
	ctx := t.Context()
	clk := newClock()
	st := openStore(t, storetest.SQLiteURL(t), clk)
	sa := simAccount("a1", "")
	sa.RevokeOldAccessToken = new(sim.Duration) // a refresh revokes the old token at once
	env := newUsageEnv(t, st, clk, sa)
	acct := addAccount(t, st, env.sim, sa, clk.Now().Add(-time.Minute))
	_, err := env.poller.PollOnce(ctx, acct)
	require.NoError(t, err)
	assert.Equal(t, 1, env.sim.RefreshCount("a1"), "expired: refreshed before polling")

	// Someone else refreshed behind the relay's back: the stored token is
	// refused (401), the poller refreshes... with a spent refresh token,
	// which marks the account reauth_required.
	cur, _, err := st.TokenState(ctx, acct.ID)
	require.NoError(t, err)
	status, _ := redeem(t, httpClient(t), env.sim, cur.RefreshToken)
	require.Equal(t, 200, status)
	_, err = env.poller.PollOnce(ctx, acct)
	var rej *oauth.RejectedError
	require.ErrorAs(t, err, &rej)
	got, err := st.Account(ctx, acct.ID)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReauthRequired, got.Status)
}

func TestRunPollsUntilCancelled(t *testing.T) {
	clk := newClock()
	st := openStore(t, storetest.SQLiteURL(t), clk)
	a1, a2 := simAccount("a1", ""), simAccount("a2", "")
	a1.Primary.UsedPercent, a2.Primary.UsedPercent = 10, 20
	env := newUsageEnv(t, st, clk, a1, a2)
	addAccount(t, st, env.sim, a1, time.Time{})
	addAccount(t, st, env.sim, a2, time.Time{})
	paused := addAccount(t, st, env.sim, simAccount("a3", ""), time.Time{})
	_, err := st.SetAccountStatus(t.Context(), paused.ID, store.StatusPaused, "", time.Time{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.poller.Run(ctx, 20*time.Millisecond)
		stopped.Store(true)
	}()
	require.Eventually(t, func() bool {
		return len(env.sim.Records(sim.RecordFilter{Route: sim.RouteUsage})) >= 4
	}, time.Minute, 10*time.Millisecond, "polled every account, more than once")
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop with its context")
	}
	assert.True(t, stopped.Load())
	accts, err := st.Accounts(t.Context())
	require.NoError(t, err)
	for _, a := range accts {
		if a.ID == paused.ID {
			assert.False(t, a.Primary.Known, "paused accounts are not polled")
			continue
		}
		assert.True(t, a.Primary.Known, a.Label)
	}
}
