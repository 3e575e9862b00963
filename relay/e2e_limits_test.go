package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay"
)

// loudAccount is a sim account whose upstream reports distinctive usage
// windows and credits on every answer (headers, and codex.rate_limits
// events over WebSocket): figures the client must never see.
func loudAccount(id string) sim.Account {
	a := simAccount(id, "org-a")
	a.Primary = sim.Window{UsedPercent: 73, WindowMinutes: 300}
	a.Secondary = sim.Window{UsedPercent: 81, WindowMinutes: 10080}
	a.Credits = &wire.Credits{HasCredits: true, Balance: "987"}
	return a
}

// requireNoAccountFigures fails when an answer's headers carry the loud
// account's figures or any of its limit headers.
func requireNoAccountFigures(t *testing.T, h http.Header) {
	t.Helper()
	for k, vs := range h {
		lk := strings.ToLower(k)
		assert.False(t, strings.HasPrefix(lk, "x-codex-credits-") || lk == "x-codex-plan-type" || lk == "x-codex-active-limit" ||
			strings.HasPrefix(lk, "x-ratelimit-"), "the upstream's %s reached the client", k)
		for _, v := range vs {
			assert.NotContains(t, []string{"73", "81", "987"}, v, "the upstream's figure in %s reached the client", k)
		}
	}
}

// rateLimitEvents are the codex.rate_limits events among events.
func rateLimitEvents(events []map[string]any) []map[string]any {
	var out []map[string]any
	for _, ev := range events {
		if ev["type"] == wire.EventRateLimits {
			out = append(out, ev)
		}
	}
	return out
}

// A key with a tokens/day limit is told that limit, and how much of it is
// used (settled and reserved, as its admission counts it), on every answer:
// HTTP headers in Codex's names, and over WebSocket a codex.rate_limits
// event before the response. The serving account's own figures (headers,
// its codex.rate_limits events, its credits) never reach the client.
func TestKeyLimitsReachTheClient(t *testing.T) {
	t.Parallel()
	clk := newTestClock(time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC))
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now = clk.Now }, loudAccount("a1"))
	_, secret, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "daily",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 100000}, {Metric: budget.Requests, Window: budget.Minute, Max: 100}}})
	require.NoError(t, err)
	midnight := strconv.FormatInt(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix(), 10)

	resp, body := h.post(sessionS, rootT, spendRequest("first"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "0", resp.Header.Get(wire.HeaderPrimaryUsedPercent), "nothing used yet")
	assert.Equal(t, "1440", resp.Header.Get(wire.HeaderPrimaryWindowMinutes))
	assert.Equal(t, midnight, resp.Header.Get(wire.HeaderPrimaryResetAt), "a day resets at midnight in the relay's time zone")
	assert.Empty(t, resp.Header.Get(wire.HeaderSecondaryUsedPercent), "one window of one length: no secondary")
	requireNoAccountFigures(t, resp.Header)
	assert.NotContains(t, body, wire.EventRateLimits)
	recs := h.responseRecords("")
	require.Len(t, recs, 1)
	require.NotNil(t, recs[0].Usage)
	first := recs[0].Usage.TotalTokens
	require.Positive(t, first)

	resp, body = h.post(sessionS, rootT, spendRequest("second"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	pct, err := strconv.ParseFloat(resp.Header.Get(wire.HeaderPrimaryUsedPercent), 64)
	require.NoError(t, err)
	assert.InDelta(t, float64(first)/100000*100, pct, 1e-9, "the first turn's tokens, of the day's 100000")
	requireNoAccountFigures(t, resp.Header)
	recs = h.responseRecords("")
	require.Len(t, recs, 2)
	both := first + recs[1].Usage.TotalTokens

	c := h.dialWSWith(sessionS, childT, bearer(secret))
	events := c.turn(spendRequest("over the socket"))
	typ, _ := lastEvent(events)
	require.Equal(t, wire.EventResponseCompleted, typ)
	require.Equal(t, wire.EventRateLimits, events[0]["type"], "the relay's event comes before the response: %v", events)
	require.Len(t, rateLimitEvents(events), 1, "the upstream's own event is dropped")
	limits := events[0]["rate_limits"].(map[string]any)
	primary := limits["primary"].(map[string]any)
	assert.InDelta(t, float64(both)/100000*100, primary["used_percent"], 1e-9)
	assert.EqualValues(t, 1440, primary["window_minutes"])
	assert.Equal(t, midnight, strconv.FormatInt(int64(primary["reset_at"].(float64)), 10))
	assert.Nil(t, limits["secondary"])
	assert.Nil(t, events[0]["credits"], "the relay reports no credits")
	raw, err := json.Marshal(events)
	require.NoError(t, err)
	for _, figure := range []string{`"used_percent":73`, `"used_percent":81`, `987`} {
		assert.NotContains(t, string(raw), figure, "the upstream's figures reached the client")
	}

	// A refused request is told its limit is used up, on both transports.
	_, secret2, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "spent",
		Limits: []budget.Limit{{Metric: budget.CostUSD, Window: budget.Week, Max: 0}}})
	require.NoError(t, err)
	resp, body = h.post(sessionS, "019a0000-0000-7000-8000-00000000f00d", spendRequest("refused"), bearer(secret2))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "100", resp.Header.Get(wire.HeaderPrimaryUsedPercent))
	assert.Equal(t, "10080", resp.Header.Get(wire.HeaderPrimaryWindowMinutes))
	c2 := h.dialWSWith(sessionS, "019a0000-0000-7000-8000-00000000f00e", bearer(secret2))
	events = c2.turn(spendRequest("refused over the socket"))
	require.Len(t, events, 2, "the limits, then the refusal: %v", events)
	assert.Equal(t, wire.EventRateLimits, events[0]["type"])
	assert.EqualValues(t, 100, events[0]["rate_limits"].(map[string]any)["primary"].(map[string]any)["used_percent"])
	assert.Equal(t, "error", events[1]["type"])
}

// A key without a tokens or cost_usd limit is told the pool's room for it:
// the windows the relay stored for the account in its scope with the most
// room, whichever account serves. The serving account's figures do not
// reach the client.
func TestPoolHeadroomReachesTheClient(t *testing.T) {
	t.Parallel()
	h := newHarness(t, loudAccount("a1"), simAccount("a2", "org-a"), simAccount("a3", "org-a"))
	ctx := context.Background()
	prio := 10
	_, err := h.store.UpdateAccount(ctx, h.ids["a1"], store.AccountPatch{Priority: &prio}) // a1 serves
	require.NoError(t, err)
	reset5h, resetWeek := time.Now().Add(2*time.Hour).Truncate(time.Second), time.Now().Add(50*time.Hour).Truncate(time.Second)
	require.NoError(t, h.store.UpdateUsage(ctx, h.ids["a2"], store.Window{UsedPercent: 20, WindowMinutes: 300, ResetAt: reset5h, Known: true},
		store.Window{UsedPercent: 35, WindowMinutes: 10080, ResetAt: resetWeek, Known: true}))
	// a3 has more room, but is paused: it cannot serve the key.
	require.NoError(t, h.store.UpdateUsage(ctx, h.ids["a3"], store.Window{UsedPercent: 1, WindowMinutes: 300, ResetAt: reset5h, Known: true}, store.Window{}))
	h.pause("a3")
	_, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "pooled",
		Limits: []budget.Limit{{Metric: budget.Requests, Window: budget.Day, Max: 100}}})
	require.NoError(t, err)

	for _, thread := range []string{rootT, childT} {
		resp, body := h.post(sessionS, thread, spendRequest("hello"), bearer(secret))
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, "20", resp.Header.Get(wire.HeaderPrimaryUsedPercent))
		assert.Equal(t, "300", resp.Header.Get(wire.HeaderPrimaryWindowMinutes))
		assert.Equal(t, strconv.FormatInt(reset5h.Unix(), 10), resp.Header.Get(wire.HeaderPrimaryResetAt))
		assert.Equal(t, "35", resp.Header.Get(wire.HeaderSecondaryUsedPercent))
		assert.Equal(t, "10080", resp.Header.Get(wire.HeaderSecondaryWindowMinutes))
		assert.Equal(t, strconv.FormatInt(resetWeek.Unix(), 10), resp.Header.Get(wire.HeaderSecondaryResetAt))
		requireNoAccountFigures(t, resp.Header)
	}
	for _, r := range h.responseRecords("") {
		assert.Equal(t, "a1", r.Account, "the loud account served")
	}

	c := h.dialWSWith(sessionS, "019a0000-0000-7000-8000-00000000beef", bearer(secret))
	events := c.turn(spendRequest("over the socket"))
	require.Len(t, rateLimitEvents(events), 1)
	require.Equal(t, wire.EventRateLimits, events[0]["type"])
	limits := events[0]["rate_limits"].(map[string]any)
	assert.EqualValues(t, 20, limits["primary"].(map[string]any)["used_percent"])
	assert.EqualValues(t, 35, limits["secondary"].(map[string]any)["used_percent"])
	assert.EqualValues(t, 10080, limits["secondary"].(map[string]any)["window_minutes"])
}

// Codex's /status asks its usage at chatgpt_base_url (/wham/usage, or
// /api/codex/usage); the relay answers it itself, for the client key, with
// the figures its answers carry, in the ChatGPT backend's shape. A wrong key
// is refused as on the other client routes.
func TestUsageRoutesAnswerTheKeysLimits(t *testing.T) {
	t.Parallel()
	clk := newTestClock(time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC))
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now = clk.Now }, loudAccount("a1"))
	ctx := context.Background()
	_, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "daily",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 1000}, {Metric: budget.CostUSD, Window: budget.Month, Max: 1000}}})
	require.NoError(t, err)
	resp, body := h.post(sessionS, rootT, spendRequest("spend some"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords("")
	require.Len(t, recs, 1)
	spent := recs[0].Usage.TotalTokens
	require.Less(t, spent, int64(1000))
	midnight := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix()
	monthEnd := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).Unix()

	type window struct {
		UsedPercent        int   `json:"used_percent"`
		LimitWindowSeconds int   `json:"limit_window_seconds"`
		ResetAfterSeconds  int64 `json:"reset_after_seconds"`
		ResetAt            int64 `json:"reset_at"`
	}
	var payload struct {
		PlanType  string `json:"plan_type"`
		RateLimit *struct {
			Allowed         bool    `json:"allowed"`
			LimitReached    bool    `json:"limit_reached"`
			PrimaryWindow   *window `json:"primary_window"`
			SecondaryWindow *window `json:"secondary_window"`
		} `json:"rate_limit"`
		Credits any `json:"credits"`
	}
	for _, path := range []string{"/backend-api/wham/usage", "/backend-api/api/codex/usage"} {
		code, _, raw := h.raw(http.MethodGet, path, bearer(secret), nil)
		require.Equal(t, http.StatusOK, code, raw)
		require.NoError(t, json.Unmarshal([]byte(raw), &payload), raw)
		assert.Equal(t, "team", payload.PlanType)
		require.NotNil(t, payload.RateLimit, raw)
		assert.True(t, payload.RateLimit.Allowed)
		assert.False(t, payload.RateLimit.LimitReached)
		// The day's window is the tightest; the month's is of another length.
		assert.Equal(t, &window{UsedPercent: int(float64(spent)/10 + 0.5), LimitWindowSeconds: 86400, ResetAfterSeconds: 9 * 3600, ResetAt: midnight},
			payload.RateLimit.PrimaryWindow, raw)
		require.NotNil(t, payload.RateLimit.SecondaryWindow, raw)
		assert.Equal(t, 31*86400, payload.RateLimit.SecondaryWindow.LimitWindowSeconds)
		assert.Equal(t, monthEnd, payload.RateLimit.SecondaryWindow.ResetAt)
		assert.Nil(t, payload.Credits, "the relay keeps no credits for a key")
		for _, figure := range []string{"73", "81", "987"} {
			assert.NotContains(t, raw, `:`+figure+`,`, "the upstream's figures reached the client")
		}
	}

	code, _, raw := h.raw(http.MethodGet, "/backend-api/wham/usage", bearer("crk_wrong"), nil)
	assert.Equal(t, http.StatusUnauthorized, code, raw)
	code, _, raw = h.raw(http.MethodGet, "/backend-api/wham/usage", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, code, raw)
	code, _, raw = h.raw(http.MethodPost, "/backend-api/wham/usage", bearer(secret), nil)
	assert.Equal(t, http.StatusMethodNotAllowed, code, raw)
}

// A ChatGPT-login Codex discovers its workspace's routing before it reads
// its account (wham/accounts/check, or api/codex/accounts/check): the
// relay answers it itself, listing the one workspace Codex names, with no
// residency constraint, so Codex stays at the relay's URLs. Nothing goes
// upstream; a wrong key is refused.
func TestAccountsCheckNamesTheRelayWorkspace(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	_, secret, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "desktop"})
	require.NoError(t, err)
	type entry struct {
		ID       string `json:"id"`
		Name     string `json:"name"`
		Origin   string `json:"workspace_backend_origin"`
		Override string `json:"account_routing_override"`
	}
	var got struct {
		Accounts []entry  `json:"accounts"`
		Ordering []string `json:"account_ordering"`
		Default  string   `json:"default_account_id"`
	}
	for _, tc := range []struct{ path, workspace, want string }{
		{"/backend-api/wham/accounts/check", "acct-123", "acct-123"},
		{"/backend-api/api/codex/accounts/check", "acct-123", "acct-123"},
		{"/backend-api/wham/accounts/check", "", "relay"},
		{"/backend-api/wham/accounts/check", "not an id <script>", "relay"},
	} {
		hdr := bearer(secret)
		if tc.workspace != "" {
			hdr.Set("ChatGPT-Account-Id", tc.workspace)
		}
		code, _, raw := h.raw(http.MethodGet, tc.path, hdr, nil)
		require.Equal(t, http.StatusOK, code, raw)
		require.NoError(t, json.Unmarshal([]byte(raw), &got), raw)
		assert.Equal(t, []entry{{ID: tc.want, Name: "Codex Relay", Origin: "NO_CONSTRAINT", Override: "NO_CONSTRAINT"}}, got.Accounts, raw)
		assert.Equal(t, []string{tc.want}, got.Ordering)
		assert.Equal(t, tc.want, got.Default)
	}
	assert.Empty(t, h.sim.Records(sim.RecordFilter{}), "nothing went upstream")
	code, _, raw := h.raw(http.MethodGet, "/backend-api/wham/accounts/check", bearer("crk_wrong"), nil)
	assert.Equal(t, http.StatusUnauthorized, code, raw)
	code, _, raw = h.raw(http.MethodPost, "/backend-api/wham/accounts/check", bearer(secret), nil)
	assert.Equal(t, http.StatusMethodNotAllowed, code, raw)
}

// The client's limits ride on every answer of a client route, not only a
// Responses one: the model lists, a goal, an object route (an image, a
// refusal of one), each with the key's day and none of the account's own.
func TestKeyLimitsOnEveryAnswer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, loudAccount("a1"))
	_, secret, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "daily",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 100000}}})
	require.NoError(t, err)
	hdr := bearer(secret)
	hdr.Set("Content-Type", "application/json")
	for _, tc := range []struct {
		method, path string
		body         string
	}{
		{http.MethodGet, "/v1/models", ""},
		{http.MethodGet, "/backend-api/codex/models?client_version=0.171.0", ""},
		{http.MethodPost, "/backend-api/codex/thread/goal/get", `{"threadId":"` + rootT + `"}`},
		{http.MethodPost, "/backend-api/codex/images/generations", `{"prompt":"a fox","model":"gpt-image-2"}`},
		{http.MethodGet, "/v1/files/file-never-made", ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			code, got, raw := h.raw(tc.method, tc.path, hdr, body)
			require.NotZero(t, code, raw)
			assert.Equal(t, "1440", got.Get(wire.HeaderPrimaryWindowMinutes), "the key's day on a %d answer: %s", code, raw)
			assert.NotEmpty(t, got.Get(wire.HeaderPrimaryUsedPercent))
			assert.NotEqual(t, "73", got.Get(wire.HeaderPrimaryUsedPercent), "the account's figure")
			requireNoAccountFigures(t, got)
		})
	}
}
