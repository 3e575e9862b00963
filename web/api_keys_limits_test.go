package web

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// Keys take limits and a model policy on POST and PATCH; GET shows each
// limit with its use and reset, as the contract says.
func TestKeyLimitsAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv := newTestServer(t, s)
		code, k, raw := call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, map[string]any{
			"name": "budgeted",
			"limits": []map[string]any{
				{"metric": "tokens", "window": "5h", "max": 2000000},
				{"metric": "cost_usd", "window": "month", "max": 50},
				{"metric": "concurrent", "max": 2},
			},
			"model_aliases": map[string]string{"fast": "gpt-5.1-codex-mini"}, "max_reasoning_effort": "high", "priority_tier": "downgrade",
		})
		require.Equal(t, http.StatusCreated, code, raw)
		require.NotEmpty(t, k["id"])
		require.NotEmpty(t, k["key"], "the one-time key is kept in the answer")
		limits := k["limits"].([]any)
		require.Len(t, limits, 3)
		l0 := limits[0].(map[string]any)
		assert.Equal(t, "tokens", l0["metric"])
		assert.Equal(t, "5h", l0["window"])
		assert.EqualValues(t, 2000000, l0["max"])
		assert.EqualValues(t, 0, l0["used"])
		assert.Nil(t, l0["resets_at"], "an empty rolling window has no reset ahead")
		l1 := limits[1].(map[string]any)
		now := time.Now().UTC().Truncate(time.Second).Add(-500 * time.Millisecond) // mid-second: the reset rounds up
		monthEnd := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC).Unix()
		assert.EqualValues(t, monthEnd, l1["resets_at"], "a calendar window resets at its end (UTC by default)")
		l2 := limits[2].(map[string]any)
		_, hasWindow := l2["window"]
		assert.False(t, hasWindow, "concurrent takes no window")
		assert.Equal(t, map[string]any{"fast": "gpt-5.1-codex-mini"}, k["model_aliases"])
		assert.Equal(t, "high", k["max_reasoning_effort"])
		assert.Equal(t, "downgrade", k["priority_tier"])

		id := k["id"].(string)
		// Use settled in the 5h window shows in GET.
		require.NoError(t, s.RecordRequest(context.Background(), store.RequestRecord{ID: "req_1", ClientKeyID: id, Transport: "http",
			Path: "/v1/responses", Status: 200, StartedAt: now.Add(-time.Hour), TotalTokens: 1234, CostNanos: 2_500_000_000, Charged: true}, nil))
		code, got, raw := call(t, srv, http.MethodGet, "/api/v1/keys/"+id, testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		limits = got["limits"].([]any)
		assert.EqualValues(t, 1234, limits[0].(map[string]any)["used"])
		assert.EqualValues(t, now.Add(4*time.Hour).Add(time.Second).Unix(), limits[0].(map[string]any)["resets_at"],
			"a rolling window's use next falls when its oldest request leaves it")
		assert.EqualValues(t, 2.5, limits[1].(map[string]any)["used"])

		// PATCH replaces the limits and keeps what it does not name.
		code, changed, raw := call(t, srv, http.MethodPatch, "/api/v1/keys/"+id, testAdminToken, map[string]any{
			"limits": []map[string]any{{"metric": "requests", "window": "minute", "max": 60}}})
		require.Equal(t, http.StatusOK, code, raw)
		require.Len(t, changed["limits"], 1)
		assert.Equal(t, "requests", changed["limits"].([]any)[0].(map[string]any)["metric"])
		assert.Equal(t, "high", changed["max_reasoning_effort"], "kept")
		code, changed, raw = call(t, srv, http.MethodPatch, "/api/v1/keys/"+id, testAdminToken, map[string]any{"limits": []any{}, "priority_tier": "allow"})
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, []any{}, changed["limits"], "an empty list: unlimited")
		assert.Equal(t, "allow", changed["priority_tier"])

		for _, b := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"limits": []map[string]any{{"metric": "bytes", "window": "day", "max": 1}}}, "limits"},
			{map[string]any{"limits": []map[string]any{{"metric": "tokens", "window": "year", "max": 1}}}, "limits"},
			{map[string]any{"limits": []map[string]any{{"metric": "concurrent", "window": "day", "max": 1}}}, "limits"},
			{map[string]any{"limits": []map[string]any{{"metric": "tokens", "window": "day", "max": -5}}}, "limits"},
			{map[string]any{"limits": []map[string]any{{"metric": "tokens", "window": "day", "max": 1}, {"metric": "tokens", "window": "day", "max": 2}}}, "limits"},
			{map[string]any{"max_reasoning_effort": "extreme"}, "max_reasoning_effort"},
			{map[string]any{"priority_tier": "sometimes"}, "priority_tier"},
			{map[string]any{"model_aliases": map[string]string{"x": ""}}, "model_aliases"},
		} {
			code, body, raw := call(t, srv, http.MethodPatch, "/api/v1/keys/"+id, testAdminToken, b.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, b.field, field, "body %v", b.body)
		}
	})
}

// A cost_usd limit warns where the price table cannot cost a model the key
// may use: costed at the fallback and marked unpriced, or, with no
// fallback, not counted at all.
func TestCostKeyWarnings(t *testing.T) {
	table := pricing.Table{FallbackModel: "gpt-5.5", Entries: []pricing.Entry{
		{Model: "gpt-5.5", Tier: pricing.TierDefault, Input: 5, Output: 30},
		{Model: "gpt-5.4", Tier: pricing.TierDefault, Input: 2.5, Output: 15},
	}}
	bare := table
	bare.FallbackModel = ""
	cost := []budget.Limit{{Metric: budget.CostUSD, Window: budget.Day, Max: 1}}
	tokens := []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 1}}
	for _, c := range []struct {
		name  string
		key   store.ClientKey
		table pricing.Table
		want  []string // each warning's model, or "any" for the any-model hole
	}{
		{"no cost limit: nothing to say", store.ClientKey{Limits: tokens, Models: []string{"gpt-5.5-codex"}}, bare, nil},
		{"priced models", store.ClientKey{Limits: cost, Models: []string{"gpt-5.4", "gpt-5.5-2026-05-01"}}, bare, nil},
		{"any model with a fallback", store.ClientKey{Limits: cost}, table, nil},
		{"any model without a fallback", store.ClientKey{Limits: cost}, bare, []string{"any"}},
		{"an unpriced model at the fallback", store.ClientKey{Limits: cost, Models: []string{"gpt-5.5-codex", "gpt-5.4"}}, table, []string{"gpt-5.5-codex"}},
		{"an unpriced model without a fallback", store.ClientKey{Limits: cost, Models: []string{"gpt-5.5-codex"}}, bare, []string{"gpt-5.5-codex"}},
		{"an alias's model is what is priced", store.ClientKey{Limits: cost, Models: []string{"fast"},
			Policy: store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.4-mini"}}}, table, []string{"gpt-5.4-mini"}},
		{"an alias to a priced model", store.ClientKey{Limits: cost, Models: []string{"fast"},
			Policy: store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.4"}}}, table, nil},
		{"aliases beside any model", store.ClientKey{Limits: cost,
			Policy: store.KeyPolicy{ModelAliases: map[string]string{"b": "zz-2", "a": "zz-1"}}}, bare, []string{"zz-1", "zz-2", "any"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := costKeyWarnings(c.key, c.table)
			require.Len(t, got, len(c.want), "%q", got)
			for i, m := range c.want {
				switch {
				case m == "any":
					assert.Contains(t, got[i], "any model")
				case c.table.FallbackModel != "":
					assert.Contains(t, got[i], "does not price "+m+": the cost_usd limit counts its requests at "+c.table.FallbackModel+"'s prices")
				default:
					assert.Contains(t, got[i], "does not price "+m+" and has no fallback_model: its requests cost $0")
				}
			}
		})
	}
}

// The key's API answers carry the warnings: on create, patch and get.
func TestCostLimitWarningsInTheAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv := newTestServer(t, s)
		code, k, raw := call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, map[string]any{
			"name": "capped", "models": []string{"gpt-5.5-codex"},
			"limits": []map[string]any{{"metric": "cost_usd", "window": "day", "max": 1}},
		})
		require.Equal(t, http.StatusCreated, code, raw)
		require.Len(t, k["warnings"], 1, raw)
		assert.Contains(t, k["warnings"].([]any)[0], "does not price gpt-5.5-codex: the cost_usd limit counts its requests at gpt-5.5's prices")
		id := k["id"].(string)
		code, k, raw = call(t, srv, http.MethodPatch, "/api/v1/keys/"+id, testAdminToken, map[string]any{"models": []string{"gpt-5.4"}})
		require.Equal(t, http.StatusOK, code, raw)
		_, has := k["warnings"]
		assert.False(t, has, "a priced model: nothing to warn of (%s)", raw)
		code, k, raw = call(t, srv, http.MethodPatch, "/api/v1/keys/"+id, testAdminToken, map[string]any{"models": []string{"my-model"}})
		require.Equal(t, http.StatusOK, code, raw)
		require.Len(t, k["warnings"], 1, raw)
		code, k, raw = call(t, srv, http.MethodGet, "/api/v1/keys/"+id, testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		require.Len(t, k["warnings"], 1, raw)
		assert.Contains(t, k["warnings"].([]any)[0], "my-model")
	})
}
