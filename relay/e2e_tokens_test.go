package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

func withRefresher(h *harness, c *relay.Config) {
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: c.Store, TokenURL: h.sim.TokenURL(), Logger: testLogger(h.t)})
	h.t.Cleanup(r.Close)
	c.Tokens = r
}

// An upstream 401 before any work refreshes the account's token once and
// retries the same account, with no penalty; a refresh the auth server
// rejects marks the account reauth_required and the request moves on.
func TestTokenRefreshAfter401(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, withRefresher, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	// The relay holds a stale access token for a1 (the sim no longer knows it).
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a1"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-a1"}, time.Time{}))
	h.setUsed("a2", 90)

	resp, body := h.post(sessionS, rootT, responseRequest("hello"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords(rootT)
	assert.Equal(t, "a1", recs[len(recs)-1].Account, "the same account, with the refreshed token")
	atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{ThreadID: rootT})
	require.NoError(t, err)
	require.Len(t, atts, 2)
	assert.Equal(t, "token_refresh", atts[1].Recovery, "the 401 attempt, oldest last")
	assert.Equal(t, http.StatusUnauthorized, atts[1].Status)
	assert.Equal(t, 1, h.sim.RefreshCount("a1"))
	assert.Equal(t, store.StatusActive, statusOf(t, h, "a1"), "no penalty")
	var cred store.Credentials
	cred, err = h.store.Credentials(ctx, h.ids["a1"])
	require.NoError(t, err)
	assert.NotEqual(t, "stale", cred.AccessToken)
	assert.NotEqual(t, "rt-a1", cred.RefreshToken, "the rotated refresh token is stored")

	// a2 now holds a stale token and a refresh token the auth server rejects.
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a2"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-revoked"}, time.Time{}))
	h.setUsed("a2", 0)
	h.setUsed("a1", 90)
	resp, body = h.post("019a7777-0000-7000-8000-000000000001", childT, responseRequest("hello"), nil) // a session of its own
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	child := h.responseRecords(childT)
	assert.Equal(t, "a1", child[len(child)-1].Account, "the request moved on")
	catts, _, err := h.store.Attempts(ctx, store.AttemptFilter{ThreadID: childT})
	require.NoError(t, err)
	require.NotEmpty(t, catts)
	assert.Equal(t, h.ids["a2"], catts[len(catts)-1].AccountID, "a2 was tried first")
	assert.Equal(t, "auth", catts[len(catts)-1].Class)
	a2, err := h.store.Account(ctx, h.ids["a2"])
	require.NoError(t, err)
	assert.Equal(t, store.StatusReauthRequired, a2.Status)
	assert.NotEmpty(t, a2.StatusReason)
}

// Usage windows reported in a WebSocket stream (codex.rate_limits) update
// the account: a second turn on the same lane sends no new upgrade headers,
// only the event with the usage the first turn spent.
func TestRateLimitsEventsFoldIntoTheAccount(t *testing.T) {
	t.Parallel()
	a1 := simAccount("a1", "org-a")
	a1.Primary.UsedPercent = 30
	a1.UsagePerRequest = 10
	h := newHarness(t, a1)
	c := h.dialWS(sessionS, rootT)
	typ, _ := lastEvent(c.turn(responseRequest("one")))
	require.Equal(t, "response.completed", typ)
	typ, _ = lastEvent(c.turn(responseRequest("two")))
	require.Equal(t, "response.completed", typ)
	// Usage is written behind the turn.
	require.Eventually(t, func() bool {
		acc, err := h.store.Account(context.Background(), h.ids["a1"])
		require.NoError(t, err)
		return acc.Primary.Known && acc.Primary.UsedPercent > 39.99 && acc.Primary.UsedPercent < 40.01
	}, time.Minute, 5*time.Millisecond, "the second turn's codex.rate_limits reached the account")
	assert.Equal(t, 1, len(h.relay.Lanes()), "one lane: no new upgrade headers")
}

// Fifty concurrent requests with an expired token: exactly one refresh, and
// every request is served.
func TestConcurrentRequestsRefreshOnce(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, withRefresher, simAccount("a1", "org-a"))
	require.NoError(t, h.store.SetCredentials(context.Background(), h.ids["a1"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-a1"}, time.Time{}))
	const n = 50
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := h.post(sessionS, fmt.Sprintf("019a8888-0000-7000-8000-%012d", i), responseRequest("hi"), nil)
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		assert.Equal(t, http.StatusOK, code)
	}
	assert.Equal(t, 1, h.sim.RefreshCount("a1"), "single-flight: one refresh for fifty requests")
	assert.Equal(t, store.StatusActive, statusOf(t, h, "a1"))
}

// When no account can serve, Codex gets 429 usage_limit_reached with the
// earliest reset in scope and shows "try again at".
func TestCodexSeesTheEarliestResetOfAnExhaustedPool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	soon := time.Now().Add(20 * time.Minute).Truncate(time.Second)
	_, err := h.store.SetAccountStatus(ctx, h.ids["a1"], store.StatusRateLimited, "usage_limit_reached", time.Now().Add(3*time.Hour))
	require.NoError(t, err)
	_, err = h.store.SetAccountStatus(ctx, h.ids["a2"], store.StatusQuotaExceeded, "usage_limit_reached", soon)
	require.NoError(t, err)

	resp, body := h.post(sessionS, rootT, responseRequest("hi"), nil)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Contains(t, body, `"usage_limit_reached"`)
	assert.Contains(t, body, fmt.Sprintf(`"resets_at":%d`, soon.Unix()), "the earliest reset in scope")

	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused"})
	res, err := codex.Exec(ctx, "hello", codexcli.RunOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, 0, res.ExitCode)
	assert.Contains(t, strings.ToLower(strings.Join(res.Errors, " ")), "try again at")
	assert.Empty(t, h.responseRecords(""), "nothing went upstream")
}

// A fresh lane's upgrade answer carries the account's usage windows, as an
// HTTP answer's headers do: they reach the account even when the request
// then fails before any event (none of its codex.rate_limits arrived).
func TestLaneUpgradeHeadersFoldIntoTheAccount(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			a1 := simAccount("a1", "org-a")
			a1.Primary.UsedPercent = 55
			h := newHarness(t, a1)
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultCutStream, Events: 0})
			require.NoError(t, err)
			if transport == "http" {
				resp, body := h.post(sessionS, rootT, responseRequest("cut"), nil)
				require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
			} else {
				typ, _ := lastEvent(h.dialWS(sessionS, rootT).turn(responseRequest("cut")))
				require.Equal(t, "error", typ)
			}
			require.Eventually(t, func() bool {
				acc, err := h.store.Account(context.Background(), h.ids["a1"])
				require.NoError(t, err)
				return acc.Primary.Known && acc.Primary.UsedPercent > 54.99 && acc.Primary.UsedPercent < 55.01
			}, time.Minute, 5*time.Millisecond, "the upgrade's rate-limit headers reached the account")
		})
	}
}
