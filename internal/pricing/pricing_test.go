package pricing_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/pricing"
)

// table is a small table with look-alike model names and every tier.
var table = pricing.Table{Entries: []pricing.Entry{
	{Model: "gpt-5", Tier: "default", Input: 1.25, CachedInput: 0.125, Output: 10},
	{Model: "gpt-5", Tier: "flex", Input: 0.625, CachedInput: 0.0625, Output: 5},
	{Model: "gpt-5-codex", Tier: "default", Input: 1.5, CachedInput: 0.15, Output: 12},
	{Model: "gpt-5-codex", Tier: "priority", Input: 3, CachedInput: 0.3, Output: 24},
	{Model: "gpt-5.1-codex", Tier: "default", Input: 2, CachedInput: 0.2, Output: 16},
	{Model: "gpt-5.1-codex-mini", Tier: "default", Input: 0.25, CachedInput: 0.025, Output: 2},
	{Model: "O3", Tier: "default", Input: 2, CachedInput: 0.5, Output: 8},
	{Model: "o3", Tier: "flex", Input: 1, CachedInput: 0.25, Output: 4},
}}

func TestLookup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, model, tier string
		want              string // "model tier" of the entry found; "" for none
	}{
		{"exact", "gpt-5", "default", "gpt-5 default"},
		{"exact, other tier", "gpt-5", "flex", "gpt-5 flex"},
		{"empty tier is default", "gpt-5", "", "gpt-5 default"},
		{"auto tier is default", "gpt-5", "auto", "gpt-5 default"},
		{"tier without case", "gpt-5", " FLEX ", "gpt-5 flex"},
		{"tier without an entry falls back to default", "gpt-5", "priority", "gpt-5 default"},
		{"unknown tier falls back to default", "gpt-5", "scale", "gpt-5 default"},
		{"exact beats prefix", "gpt-5-codex", "default", "gpt-5-codex default"},
		{"dated snapshot prices as its model", "gpt-5-codex-2025-09-15", "default", "gpt-5-codex default"},
		{"dated snapshot keeps its tier", "gpt-5-codex-2025-09-15", "priority", "gpt-5-codex priority"},
		{"longest prefix wins", "gpt-5.1-codex-mini-2025-11-01", "default", "gpt-5.1-codex-mini default"},
		{"a longer model is not its prefix", "gpt-5.1-codex-mini", "default", "gpt-5.1-codex-mini default"},
		{"prefix fallback to the prefix model's default", "gpt-5-2025-08-07", "priority", "gpt-5 default"},
		{"model without case", "GPT-5-Codex", "priority", "gpt-5-codex priority"},
		{"entry model without case", "o3-2025-04-16", "", "O3 default"},
		{"entries of one model in different cases", "o3", "flex", "o3 flex"},
		{"entries of one model in different cases, fallback", "O3", "priority", "O3 default"},
		{"prefix needs a dash", "gpt-5x", "default", ""},
		{"prefix needs a dash (dot)", "gpt-5.2", "default", ""},
		{"a shorter name is not priced", "gpt", "default", ""},
		{"unknown model", "claude", "default", ""},
		{"empty model", "", "default", ""},
		{"spaces around the model", " gpt-5 ", "", "gpt-5 default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The order of the entries does not matter.
			reversed := pricing.Table{Entries: slices.Clone(table.Entries)}
			slices.Reverse(reversed.Entries)
			for _, tb := range []pricing.Table{table, reversed} {
				e, ok := tb.Lookup(tc.model, tc.tier)
				if tc.want == "" {
					assert.False(t, ok, "found %+v", e)
					assert.Equal(t, pricing.Entry{}, e)
					continue
				}
				if assert.True(t, ok) {
					assert.Equal(t, tc.want, e.Model+" "+e.Tier)
				}
			}
		})
	}
}

// A model whose only entries are for other tiers is not priced: Validate
// refuses such a table, but Lookup does not guess either.
func TestLookupWithoutDefaultTier(t *testing.T) {
	t.Parallel()
	tb := pricing.Table{Entries: []pricing.Entry{{Model: "m", Tier: "priority", Input: 1}}}
	_, ok := tb.Lookup("m", "default")
	assert.False(t, ok)
	e, ok := tb.Lookup("m", "priority")
	assert.True(t, ok)
	assert.Equal(t, 1.0, e.Input)
}

func TestCost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		entry pricing.Entry
		usage pricing.Usage
		want  int64
	}{
		{"a million input tokens stay exact", pricing.Entry{Input: 1.25}, pricing.Usage{Input: 1_000_000}, 1_250_000_000},
		{"a million output tokens", pricing.Entry{Output: 10}, pricing.Usage{Output: 1_000_000}, 10_000_000_000},
		{"prices that are not binary fractions stay exact", pricing.Entry{Input: 1.75, CachedInput: 0.175, Output: 14},
			pricing.Usage{Input: 3_000_000, CachedInput: 1_000_000, Output: 1_000_000}, 3_500_000_000 + 175_000_000 + 14_000_000_000},
		{"one token", pricing.Entry{Input: 1.25}, pricing.Usage{Input: 1}, 1250},
		{"cached tokens at their own price", pricing.Entry{Input: 1.25, CachedInput: 0.125, Output: 10},
			pricing.Usage{Input: 1000, CachedInput: 800, Output: 100}, 200*1250 + 800*125 + 100*10000},
		{"rounds half up", pricing.Entry{Input: 0.0005}, pricing.Usage{Input: 1}, 1},
		{"rounds down below half", pricing.Entry{Input: 0.0004}, pricing.Usage{Input: 1}, 0},
		{"rounds the sum, not each part", pricing.Entry{Input: 0.0004, Output: 0.0004}, pricing.Usage{Input: 1, Output: 1}, 1},
		{"rounds to nearest", pricing.Entry{Input: 0.0375}, pricing.Usage{Input: 3}, 113}, // 112.5
		{"cached above input clamps to input", pricing.Entry{Input: 1, CachedInput: 0.5}, pricing.Usage{Input: 100, CachedInput: 500}, 100 * 500},
		{"negative cached clamps to 0", pricing.Entry{Input: 1, CachedInput: 0.5}, pricing.Usage{Input: 100, CachedInput: -5}, 100 * 1000},
		{"negative counts are 0", pricing.Entry{Input: 1, Output: 1}, pricing.Usage{Input: -1, Output: -1}, 0},
		{"no usage is free", pricing.Entry{Input: 1, Output: 1}, pricing.Usage{}, 0},
		{"huge usage does not wrap", pricing.Entry{Input: pricing.MaxPrice, Output: pricing.MaxPrice},
			pricing.Usage{Input: math.MaxInt64, Output: math.MaxInt64}, math.MaxInt64},
		{"a price past the bound is clamped", pricing.Entry{Input: 1e300}, pricing.Usage{Input: 1}, pricing.MaxPrice * 1000},
		{"a NaN price is 0", pricing.Entry{Input: math.NaN()}, pricing.Usage{Input: 1}, 0},
		{"images at their price", pricing.Entry{PerImage: 0.042}, pricing.Usage{Images: 3}, 126_000_000},
		{"images and tokens add up", pricing.Entry{Input: 5, Output: 40, PerImage: 0.01},
			pricing.Usage{Input: 1000, Output: 4000, Images: 2}, 1000*5000 + 4000*40000 + 20_000_000},
		{"an image with no price per image is free", pricing.Entry{Input: 5}, pricing.Usage{Images: 1}, 0},
		{"negative images are 0", pricing.Entry{PerImage: 1}, pricing.Usage{Images: -4}, 0},
		{"many images at the highest price do not wrap", pricing.Entry{PerImage: pricing.MaxImagePrice},
			pricing.Usage{Images: math.MaxInt64}, math.MaxInt64},
		{"a price per image past the bound is clamped", pricing.Entry{PerImage: 1e9}, pricing.Usage{Images: 1}, pricing.MaxImagePrice * 1e9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, tc.entry.Cost(tc.usage))
		})
	}
}

func TestTableCost(t *testing.T) {
	t.Parallel()
	nanos, ok := table.Cost("gpt-5-codex-2025-09-15", "priority", pricing.Usage{Input: 2_000_000, CachedInput: 1_000_000, Output: 500_000})
	require.True(t, ok)
	assert.Equal(t, int64(3_000_000_000+300_000_000+12_000_000_000), nanos)

	nanos, ok = table.Cost("claude", "", pricing.Usage{Input: 1_000_000})
	assert.False(t, ok)
	assert.Zero(t, nanos)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := pricing.Entry{Model: "gpt-5", Tier: "default", Input: 1.25, CachedInput: 0.125, Output: 10}
	with := func(f func(e *pricing.Entry)) []pricing.Entry {
		e := ok
		f(&e)
		return []pricing.Entry{ok, e}
	}
	many := make([]pricing.Entry, pricing.MaxEntries+1)
	for i := range many {
		many[i] = pricing.Entry{Model: "m" + strings.Repeat("x", i%150) + string(rune('a'+i/150)), Tier: "default"}
	}
	for _, tc := range []struct {
		name      string
		table     pricing.Table
		index     int    // -1: the table's own field
		field     string // "" for a valid table
		inMessage string
	}{
		{"valid", pricing.Table{Source: "https://example.com", AsOf: "2026-01-01", Entries: []pricing.Entry{ok}}, 0, "", ""},
		{"free entries are valid", pricing.Table{Entries: []pricing.Entry{{Model: "m", Tier: "default"}}}, 0, "", ""},
		{"the bounds are valid", pricing.Table{Source: strings.Repeat("é", pricing.MaxSource), AsOf: strings.Repeat("x", pricing.MaxAsOf),
			Entries: []pricing.Entry{{Model: strings.Repeat("m", pricing.MaxModelLength), Tier: "default", Input: pricing.MaxPrice}}}, 0, "", ""},
		{"as many entries as allowed", pricing.Table{Entries: many[:pricing.MaxEntries]}, 0, "", ""},
		{"every tier", pricing.Table{Entries: []pricing.Entry{ok, {Model: "gpt-5", Tier: "flex"}, {Model: "GPT-5", Tier: "priority"}}}, 0, "", ""},

		{"no entries", pricing.Table{}, -1, "entries", "at least one entry"},
		{"too many entries", pricing.Table{Entries: many}, -1, "entries", "at most 2000 entries"},
		{"long source", pricing.Table{Source: strings.Repeat("x", pricing.MaxSource+1), Entries: []pricing.Entry{ok}}, -1, "source", "at most 500"},
		{"long as-of", pricing.Table{AsOf: strings.Repeat("x", pricing.MaxAsOf+1), Entries: []pricing.Entry{ok}}, -1, "as_of", "at most 50"},
		{"no model", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model = "" })}, 1, "model", "entry 2: the model is required"},
		{"long model", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model = strings.Repeat("m", pricing.MaxModelLength+1) })}, 1, "model", "at most 200"},
		{"model with a space", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model = "gpt 5" })}, 1, "model", "spaces"},
		{"model with a control character", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model = "gpt\x005" })}, 1, "model", "control"},
		{"empty tier", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model, e.Tier = "x", "" })}, 1, "tier", "must be default, flex or priority"},
		{"unknown tier", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Tier = "scale" })}, 1, "tier", `not "scale"`},
		{"tier in capitals", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Tier = "Flex" })}, 1, "tier", "must be default"},
		{"negative input", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Input = -1 })}, 1, "input_per_million", "entry 2 (gpt-5): the input price must be 0 or more"},
		{"NaN cached input", pricing.Table{Entries: with(func(e *pricing.Entry) { e.CachedInput = math.NaN() })}, 1, "cached_input_per_million", "cached input price must be a finite number"},
		{"infinite output", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Output = math.Inf(1) })}, 1, "output_per_million", "finite"},
		{"output too high", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Output = pricing.MaxPrice + 0.01 })}, 1, "output_per_million", "at most 100000"},
		{"price per image too high", pricing.Table{Entries: with(func(e *pricing.Entry) { e.PerImage = pricing.MaxImagePrice + 1 })}, 1, "per_image", "at most 1000 (US dollars per image)"},
		{"negative price per image", pricing.Table{Entries: with(func(e *pricing.Entry) { e.PerImage = -0.5 })}, 1, "per_image", "0 or more"},
		{"duplicate", pricing.Table{Entries: with(func(e *pricing.Entry) {})}, 1, "tier", "entry 1 already prices this model at the default tier"},
		{"duplicate without case", pricing.Table{Entries: with(func(e *pricing.Entry) { e.Model = "GPT-5" })}, 1, "tier", "already prices"},
		{"no default tier", pricing.Table{Entries: []pricing.Entry{ok, {Model: "o3", Tier: "flex"}}}, 1, "tier", "no default-tier price"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.table.Validate()
			if tc.field == "" {
				assert.NoError(t, err)
				return
			}
			var fe *pricing.FieldError
			require.True(t, errors.As(err, &fe), "a *FieldError, got %v", err)
			assert.Equal(t, tc.index, fe.Index)
			assert.Equal(t, tc.field, fe.Field)
			assert.Contains(t, err.Error(), tc.inMessage)
			if tc.index >= 0 {
				assert.Equal(t, "entries["+string(rune('0'+tc.index))+"]."+tc.field, fe.Path())
			} else {
				assert.Equal(t, tc.field, fe.Path())
			}
		})
	}
}

func TestNormalizeTier(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "default", "auto": "default", " Auto ": "default", "default": "default",
		"FLEX": "flex", "priority": "priority", "scale": "scale"} {
		assert.Equal(t, want, pricing.NormalizeTier(in), in)
	}
}

// The embedded default is a valid table with its source and date, and
// prices Codex's models as OpenAI publishes them.
func TestDefault(t *testing.T) {
	t.Parallel()
	d := pricing.Default()
	require.NoError(t, d.Validate())
	assert.True(t, d.IsDefault())
	assert.Equal(t, pricing.DefaultID, d.ID)
	assert.Equal(t, "https://openai.com/api/pricing/", d.Source)
	assert.Equal(t, "2026-06-28", d.AsOf)
	assert.Equal(t, "gpt-5.5", d.FallbackModel)

	// 1M uncached input + 1M cached input + 1M output of gpt-5.1-codex:
	// 1.25 + 0.125 + 10 dollars.
	u := pricing.Usage{Input: 2_000_000, CachedInput: 1_000_000, Output: 1_000_000}
	nanos, ok := d.Cost("gpt-5.1-codex", "", u)
	require.True(t, ok)
	assert.Equal(t, int64(11_375_000_000), nanos)
	nanos, ok = d.Cost("gpt-5.1-codex", "priority", u)
	require.True(t, ok)
	assert.Equal(t, int64(22_750_000_000), nanos, "priority is twice the price")
	nanos, ok = d.Cost("gpt-5.1-codex", "flex", u)
	require.True(t, ok)
	assert.Equal(t, int64(11_375_000_000), nanos, "no flex price: the default tier's")

	for _, tc := range []struct {
		model, tier           string
		in, cached, out       float64
		matchedModel, matched string
	}{
		{"gpt-5", "default", 1.25, 0.125, 10, "gpt-5", "default"},
		{"gpt-5-codex", "priority", 2.5, 0.25, 20, "gpt-5-codex", "priority"},
		{"gpt-5.1-codex-max", "", 1.25, 0.125, 10, "gpt-5.1-codex-max", "default"},
		{"gpt-5.1-codex-mini", "", 0.25, 0.025, 2, "gpt-5.1-codex-mini", "default"},
		{"gpt-5-mini", "priority", 0.45, 0.045, 3.6, "gpt-5-mini", "priority"},
		{"gpt-5-mini", "flex", 0.125, 0.0125, 1, "gpt-5-mini", "flex"},
		{"gpt-5-nano", "flex", 0.025, 0.0025, 0.2, "gpt-5-nano", "flex"},
		{"gpt-5.2-codex", "priority", 3.5, 0.35, 28, "gpt-5.2-codex", "priority"},
		{"gpt-5.2", "", 1.75, 0.175, 14, "gpt-5.2", "default"},
		{"gpt-5-pro", "", 15, 15, 120, "gpt-5-pro", "default"},
		{"gpt-4.1-mini", "", 0.4, 0.1, 1.6, "gpt-4.1-mini", "default"},
		{"o3", "flex", 1, 0.25, 4, "o3", "flex"},
		{"o4-mini", "flex", 0.55, 0.1375, 2.2, "o4-mini", "flex"},
		{"codex-mini-latest", "", 1.5, 0.375, 6, "codex-mini-latest", "default"},
		{"gpt-5-codex-2025-09-15", "", 1.25, 0.125, 10, "gpt-5-codex", "default"},
	} {
		e, ok := d.Lookup(tc.model, tc.tier)
		if assert.True(t, ok, tc.model) {
			assert.Equal(t, pricing.Entry{Model: tc.matchedModel, Tier: tc.matched, Input: tc.in, CachedInput: tc.cached, Output: tc.out}, e, tc.model+" "+tc.tier)
		}
	}

	d.Entries[0].Input = 999
	assert.NotEqual(t, 999.0, pricing.Default().Entries[0].Input, "each call has its own entries")
}

func FuzzCost(f *testing.F) {
	f.Add(int64(1_000_000), int64(0), int64(0), 1.25, 0.125, 10.0)
	f.Add(int64(-5), int64(9), int64(math.MaxInt64), 0.0005, 0.0, 100000.0)
	f.Fuzz(func(t *testing.T, in, cached, out int64, pin, pcached, pout float64) {
		e := pricing.Entry{Input: pin, CachedInput: pcached, Output: pout}
		got := e.Cost(pricing.Usage{Input: in, CachedInput: cached, Output: out})
		if got < 0 {
			t.Fatalf("negative cost %d", got)
		}
		// Compare with the float formula where float64 is exact enough.
		inBounds := func(p float64) bool { return p >= 0 && p <= 1000 }
		if in > 1<<30 || out > 1<<30 || !inBounds(pin) || !inBounds(pcached) || !inBounds(pout) {
			return
		}
		m := func(p float64) float64 { return math.Round(p*1e6) / 1e6 }
		c := min(max(cached, 0), max(in, 0))
		want := (float64(max(in, 0)-c)*m(pin) + float64(c)*m(pcached) + float64(max(out, 0))*m(pout)) * 1000
		if math.Abs(float64(got)-want) > 1+want*1e-12 {
			t.Fatalf("cost %d, float formula %f", got, want)
		}
	})
}
