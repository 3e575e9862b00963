package relay

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

func lim(m budget.Metric, w budget.Window, max float64) budget.Limit {
	return budget.Limit{Metric: m, Window: w, Max: max}
}

func win(pct float64, minutes int, reset time.Time) *wire.RateLimitWindow {
	w := &wire.RateLimitWindow{UsedPercent: pct, WindowMinutes: minutes}
	if !reset.IsZero() {
		w.ResetAt = reset.Unix()
	}
	return w
}

func windows(p, s store.Window) func(*store.Account) {
	return func(a *store.Account) { a.Primary, a.Secondary = p, s }
}

func known(pct float64, minutes int, reset time.Time) store.Window {
	return store.Window{UsedPercent: pct, WindowMinutes: minutes, ResetAt: reset, Known: true}
}

// TestReportLimits: what Codex is told of its limits, from the key's
// limits and their use, or else from the pool's room for the key.
func TestReportLimits(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	tomorrow := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) // now is Monday 30 November 2026, noon UTC
	nextWeek := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	nextMonth := tomorrow
	h5 := 5 * time.Hour
	cases := []struct {
		name string
		loc  *time.Location
		key  []limitUse
		pool []store.Account
		want wire.RateLimits
	}{
		{name: "one day limit", key: []limitUse{{Limit: lim(budget.Tokens, budget.Day, 1000), Used: 250}},
			want: wire.RateLimits{Primary: win(25, 1440, tomorrow)}},
		{name: "the tightest window is primary, the next of another length secondary",
			key: []limitUse{
				{Limit: lim(budget.Tokens, budget.Week, 1000), Used: 100},
				{Limit: lim(budget.CostUSD, budget.Day, 10), Used: 7.5},
				{Limit: lim(budget.Tokens, budget.Day, 100), Used: 90},
				{Limit: lim(budget.CostUSD, budget.Month, 100), Used: 20},
			},
			want: wire.RateLimits{Primary: win(90, 1440, tomorrow), Secondary: win(20, 43200, nextMonth)}},
		{name: "a tie goes to the longer window",
			key:  []limitUse{{Limit: lim(budget.Tokens, budget.Day, 100)}, {Limit: lim(budget.Tokens, budget.Week, 100)}},
			want: wire.RateLimits{Primary: win(0, 10080, nextWeek), Secondary: win(0, 1440, tomorrow)}},
		{name: "requests and concurrent limits are not reported: the pool is",
			key:  []limitUse{{Limit: lim(budget.Requests, budget.Minute, 10), Used: 9}, {Limit: budget.Limit{Metric: budget.Concurrent, Max: 1}, Used: 1}},
			pool: []store.Account{acct("a", used(40, now.Add(time.Hour)))},
			want: wire.RateLimits{Primary: win(40, 300, now.Add(time.Hour))}},
		{name: "overshoot shows as 100, a max of 0 too",
			key:  []limitUse{{Limit: lim(budget.Tokens, budget.Minute, 10), Used: 15}, {Limit: lim(budget.CostUSD, budget.Week, 0)}},
			want: wire.RateLimits{Primary: win(100, 10080, nextWeek), Secondary: win(100, 1, now.Add(time.Minute))}},
		{name: "a rolling window resets when its oldest use leaves",
			key:  []limitUse{{Limit: lim(budget.Tokens, budget.FiveHours, 1000), Used: 500, Oldest: now.Add(-4 * time.Hour)}},
			want: wire.RateLimits{Primary: win(50, 300, now.Add(time.Hour))}},
		{name: "a rolling window with no known use resets a window from now",
			key:  []limitUse{{Limit: lim(budget.Tokens, budget.FiveHours, 1000), Used: 500}},
			want: wire.RateLimits{Primary: win(50, 300, now.Add(h5))}},
		{name: "a month is the month's length in the relay's time zone", loc: berlin,
			key: []limitUse{{Limit: lim(budget.CostUSD, budget.Month, 4), Used: 1}},
			// 30 November 2026 in Berlin: the month ends at midnight there.
			want: wire.RateLimits{Primary: win(25, 43200, time.Date(2026, 12, 1, 0, 0, 0, 0, berlin))}},
		{name: "the pool: the account in scope with the most room, both its windows",
			pool: []store.Account{
				acct("full", windows(known(95, 300, now.Add(time.Hour)), known(10, 10080, now.Add(48*time.Hour)))),
				acct("roomy", windows(known(30, 300, now.Add(2*time.Hour)), known(60, 10080, now.Add(72*time.Hour)))),
				acct("paused", windows(known(1, 300, now.Add(time.Hour)), known(1, 10080, now.Add(time.Hour))), status(store.StatusPaused, time.Time{})),
				acct("unknown"),
			},
			want: wire.RateLimits{Primary: win(30, 300, now.Add(2*time.Hour)), Secondary: win(60, 10080, now.Add(72*time.Hour))}},
		{name: "a pool window past its reset is empty until its next",
			pool: []store.Account{acct("a", windows(known(80, 300, now.Add(-time.Hour)), store.Window{}))},
			want: wire.RateLimits{Primary: win(0, 300, now.Add(4*time.Hour))}},
		{name: "a pool that knows nothing tells nothing", pool: []store.Account{acct("a"), acct("b")}},
		{name: "no key limit and no pool", want: wire.RateLimits{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			loc := tc.loc
			if loc == nil {
				loc = time.UTC
			}
			got := reportLimits(limitsInput{Now: now, Location: loc, Key: tc.key, Pool: tc.pool})
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestAccountLimitHeadersAreDropped: the upstream's limit headers, in every
// family Codex parses, stay with the relay; its other headers pass.
func TestAccountLimitHeadersAreDropped(t *testing.T) {
	t.Parallel()
	up := http.Header{}
	for _, k := range []string{"X-Codex-Primary-Used-Percent", "X-Codex-Primary-Window-Minutes", "X-Codex-Primary-Reset-At",
		"X-Codex-Primary-Reset-After-Seconds", "X-Codex-Secondary-Used-Percent", "X-Codex-Secondary-Reset-At",
		"X-Codex-Primary-Over-Secondary-Limit-Percent", "X-Codex-Credits-Has-Credits", "X-Codex-Credits-Unlimited",
		"X-Codex-Credits-Balance", "X-Codex-Active-Limit", "X-Codex-Plan-Type", "X-Codex-Other-Primary-Used-Percent",
		"X-Codex-Other-Limit-Name", "X-Codex-Promo-Message", "X-Ratelimit-Remaining-Tokens"} {
		up.Set(k, "77")
	}
	up.Set("X-Codex-Turn-State", "ts")
	up.Set("X-Request-Id", "req")
	up.Set("Openai-Processing-Ms", "5")
	got := http.Header{}
	(&head{upstream: up, limits: &wire.RateLimits{Primary: win(12.5, 1440, tomorrowOf(now))}}).setHeaders(got)
	assert.Equal(t, http.Header{
		"X-Codex-Turn-State": {"ts"}, "X-Request-Id": {"req"}, "Openai-Processing-Ms": {"5"},
		"X-Codex-Primary-Used-Percent": {"12.5"}, "X-Codex-Primary-Window-Minutes": {"1440"},
		"X-Codex-Primary-Reset-At": {"1796083200"},
	}, got)
}

func tomorrowOf(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, t.Location())
}

// TestScrubErrorEvent: an upstream error event keeps its error and other
// headers; its limit headers become the client's.
func TestScrubErrorEvent(t *testing.T) {
	t.Parallel()
	ev := []byte(`{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_at":5},` +
		`"headers":{"x-codex-primary-used-percent":"77","x-codex-plan-type":"pro","x-request-id":"r1"}}`)
	got := scrubErrorEvent(ev, &wire.RateLimits{Primary: win(40, 300, time.Unix(9, 0))})
	var m map[string]any
	require.NoError(t, json.Unmarshal(got, &m))
	assert.Equal(t, map[string]any{"x-codex-primary-used-percent": "40", "x-codex-primary-window-minutes": "300",
		"x-codex-primary-reset-at": "9", "x-request-id": "r1"}, m["headers"])
	assert.Equal(t, map[string]any{"type": "usage_limit_reached", "resets_at": 5.0}, m["error"])
	other := []byte(`{"type":"response.failed","response":{"id":"r"}}`)
	assert.Equal(t, other, scrubErrorEvent(other, nil))
}
