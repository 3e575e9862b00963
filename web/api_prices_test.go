package web

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func priceBody(source string, input float64) map[string]any {
	return map[string]any{"source": source, "as_of": "2026-02-03", "entries": []map[string]any{
		{"model": "gpt-5.1-codex", "tier": "default", "input_per_million": input, "cached_input_per_million": 0.125, "output_per_million": 10},
		{"model": "gpt-5.1-codex", "tier": "priority", "input_per_million": 2 * input, "cached_input_per_million": 0.25, "output_per_million": 20},
		{"model": "o3", "input_per_million": 2, "cached_input_per_million": 0.5, "output_per_million": 8}, // no tier: default
		{"model": "gpt-image-2", "input_per_million": 5, "cached_input_per_million": 1.25, "output_per_million": 40, "per_image": 0.04},
	}}
}

func TestPricesAPINeedsTheAdminToken(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newTestServer(t, s)
	for _, r := range []struct {
		method, path string
		body         any
	}{{http.MethodGet, "/api/v1/prices", nil}, {http.MethodPut, "/api/v1/prices", priceBody("x", 1)}, {http.MethodGet, "/api/v1/prices/history", nil}} {
		code, body, _ := call(t, srv, r.method, r.path, "", r.body)
		assert.Equal(t, http.StatusUnauthorized, code, r.method+" "+r.path)
		c, _ := errorOf(t, body)
		assert.Equal(t, "unauthorized", c)
	}
	hist, err := s.PriceTables(context.Background(), 0)
	require.NoError(t, err)
	assert.Empty(t, hist, "nothing stored without the token")
}

func TestPricesAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv := newTestServer(t, s)

		code, cur, raw := call(t, srv, http.MethodGet, "/api/v1/prices", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, true, cur["default"])
		assert.Equal(t, "default", cur["id"])
		assert.Equal(t, "https://openai.com/api/pricing/", cur["source"])
		assert.Equal(t, "2026-06-28", cur["as_of"])
		assert.Nil(t, cur["created_at"], "the built-in table was never created")
		assert.Equal(t, "gpt-5.5", cur["fallback_model"], "the built-in table prices an unknown model as gpt-5.5")
		assert.Len(t, cur["entries"], len(pricing.Default().Entries))
		assert.Contains(t, raw, `{"model":"gpt-5.1-codex","tier":"default","input_per_million":1.25,"cached_input_per_million":0.125,"output_per_million":10}`)

		code, hist, raw := call(t, srv, http.MethodGet, "/api/v1/prices/history", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, []any{}, hist["tables"], "the default is never stored")

		code, saved, raw := call(t, srv, http.MethodPut, "/api/v1/prices", testAdminToken, priceBody(" https://example.com/p ", 1.5))
		require.Equal(t, http.StatusOK, code, raw)
		id, _ := saved["id"].(string)
		assert.True(t, strings.HasPrefix(id, "prc_"), id)
		assert.Equal(t, false, saved["default"])
		assert.Equal(t, "https://example.com/p", saved["source"], "trimmed")
		assert.Equal(t, "2026-02-03", saved["as_of"])
		assert.Equal(t, "admin-token", saved["created_by"])
		assert.NotNil(t, saved["created_at"])
		require.Len(t, saved["entries"], 4)
		assert.Equal(t, 0.04, saved["entries"].([]any)[3].(map[string]any)["per_image"], "an image model's price per image")
		assert.NotContains(t, saved["entries"].([]any)[2], "per_image", "a model priced by tokens alone has none")
		assert.Equal(t, "default", saved["entries"].([]any)[2].(map[string]any)["tier"], "a missing tier is the default tier")

		code, cur, raw = call(t, srv, http.MethodGet, "/api/v1/prices", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, saved, cur, "the saved table is current")
		table, err := s.PriceTable(ctx)
		require.NoError(t, err)
		img, ok := table.Cost("gpt-image-2", "", pricing.Usage{Images: 2})
		assert.True(t, ok)
		assert.Equal(t, int64(80_000_000), img, "two images at 0.04 dollars")
		nanos, ok := table.Cost("gpt-5.1-codex", "priority", pricing.Usage{Input: 1_000_000})
		assert.True(t, ok)
		assert.Equal(t, int64(3_000_000_000), nanos, "requests are priced with it")

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "prices.replace"})
		require.NoError(t, err)
		require.Len(t, entries, 1, "the replacement is audited")
		assert.Equal(t, "admin-token", entries[0].Actor)
		assert.Equal(t, "prices:"+id, entries[0].Target)
		assert.Contains(t, entries[0].Detail, "4 entries")
		assert.Contains(t, entries[0].Detail, "https://example.com/p")

		assert.Equal(t, "", saved["fallback_model"], "none given: none")
		withFallback := priceBody("fallback", 1)
		withFallback["fallback_model"] = "gpt-5.1-codex"
		code, fb, raw := call(t, srv, http.MethodPut, "/api/v1/prices", testAdminToken, withFallback)
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, "gpt-5.1-codex", fb["fallback_model"])
		table, err = s.PriceTable(ctx)
		require.NoError(t, err)
		q := table.Quote("my-model", "default")
		assert.True(t, q.OK && !q.Priced, "an unknown model is priced by the fallback, marked so: %+v", q)
		withFallback["fallback_model"] = "no-such-model"
		code, bad, raw := call(t, srv, http.MethodPut, "/api/v1/prices", testAdminToken, withFallback)
		require.Equal(t, http.StatusBadRequest, code, raw)
		_, field := errorOf(t, bad)
		assert.Equal(t, "fallback_model", field)
		code, second, raw := call(t, srv, http.MethodPut, "/api/v1/prices", testAdminToken, priceBody("second", 2))
		require.Equal(t, http.StatusOK, code, raw)
		code, hist, raw = call(t, srv, http.MethodGet, "/api/v1/prices/history", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		tables := hist["tables"].([]any)
		require.Len(t, tables, 3)
		assert.Equal(t, second["id"], tables[0].(map[string]any)["id"], "newest first")
		assert.Equal(t, fb["id"], tables[1].(map[string]any)["id"])
		assert.Equal(t, id, tables[2].(map[string]any)["id"])
		assert.Equal(t, 1.5, tables[2].(map[string]any)["entries"].([]any)[0].(map[string]any)["input_per_million"], "old tables keep their prices")

		code, hist, raw = call(t, srv, http.MethodGet, "/api/v1/prices/history?limit=1", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.Len(t, hist["tables"], 1)
		for _, limit := range []string{"0", "1001", "x"} {
			code, body, _ := call(t, srv, http.MethodGet, "/api/v1/prices/history?limit="+limit, testAdminToken, nil)
			assert.Equal(t, http.StatusBadRequest, code, limit)
			_, field := errorOf(t, body)
			assert.Equal(t, "limit", field)
		}
	})
}

// An invalid table is refused with a 400 naming the field; nothing is
// stored or audited, and the current table stays.
func TestPricesAPIRefusesInvalidTables(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv := newTestServer(t, s)
		with := func(f func(b map[string]any, e []map[string]any)) map[string]any {
			b := priceBody("s", 1)
			f(b, b["entries"].([]map[string]any))
			return b
		}
		for _, tc := range []struct {
			name      string
			body      any
			code      string
			field     string
			inMessage string
		}{
			{"unknown tier", with(func(_ map[string]any, e []map[string]any) { e[1]["tier"] = "turbo" }),
				"invalid_field", "entries[1].tier", "entry 2 (gpt-5.1-codex): the tier must be default, flex or priority"},
			{"negative price", with(func(_ map[string]any, e []map[string]any) { e[0]["output_per_million"] = -1 }),
				"invalid_field", "entries[0].output_per_million", "must be 0 or more"},
			{"price per image too high", with(func(_ map[string]any, e []map[string]any) { e[3]["per_image"] = 5000 }),
				"invalid_field", "entries[3].per_image", "at most 1000"},
			{"missing price", with(func(_ map[string]any, e []map[string]any) { delete(e[2], "cached_input_per_million") }),
				"invalid_field", "entries[2].cached_input_per_million", "required"},
			{"duplicate", with(func(_ map[string]any, e []map[string]any) { e[2]["model"] = "GPT-5.1-codex" }),
				"invalid_field", "entries[2].tier", "already prices"},
			{"no model", with(func(_ map[string]any, e []map[string]any) { e[2]["model"] = " " }),
				"invalid_field", "entries[2].model", "the model is required"},
			{"no entries", map[string]any{"source": "s", "entries": []any{}}, "invalid_field", "entries", "at least one entry"},
			{"entries left out", map[string]any{"source": "s"}, "invalid_field", "entries", "at least one entry"},
			{"long source", with(func(b map[string]any, _ []map[string]any) { b["source"] = strings.Repeat("s", 501) }),
				"invalid_field", "source", "at most 500"},
			{"unknown field", with(func(b map[string]any, _ []map[string]any) { b["currency"] = "EUR" }), "invalid_field", "currency", "unknown field"},
			{"unknown entry field", with(func(_ map[string]any, e []map[string]any) { e[0]["per_token"] = 1 }), "invalid_field", "per_token", "unknown field"},
			{"price as a string", with(func(_ map[string]any, e []map[string]any) { e[0]["input_per_million"] = "1.25" }),
				"invalid_field", "entries.input_per_million", "must be a number"},
			{"not JSON", "{", "invalid_json", "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, body, raw := call(t, srv, http.MethodPut, "/api/v1/prices", testAdminToken, tc.body)
				require.Equal(t, http.StatusBadRequest, code, raw)
				c, field := errorOf(t, body)
				assert.Equal(t, tc.code, c)
				assert.Equal(t, tc.field, field)
				assert.Contains(t, raw, tc.inMessage)
			})
		}
		hist, err := s.PriceTables(ctx, 0)
		require.NoError(t, err)
		assert.Empty(t, hist, "nothing stored")
		_, cur, _ := call(t, srv, http.MethodGet, "/api/v1/prices", testAdminToken, nil)
		assert.Equal(t, true, cur["default"])
		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "prices.replace"})
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing audited")
	})
}
