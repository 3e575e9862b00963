package pricing_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/pricing"
)

// knownModels are the models the relay meets: the pinned Codex CLI's
// catalog (`codex debug models` of 0.171.0), the simulated upstream's
// (gpt-5.5-codex, gpt-5.4, gpt-5.4-mini; gpt-5.5-codex is also the
// README's), and the published models Codex users pick. Each is priced by
// the default table itself (its price per million tokens: input, cached
// input, output) or, with no published price, by the fallback (nil).
var knownModels = map[string]*[3]float64{
	// The pinned CLI's catalog.
	"gpt-5.5":                  {5, 0.5, 30},
	"gpt-5.6-sol":              {5, 0.5, 30},
	"gpt-5.6-terra":            {2.5, 0.25, 15},
	"gpt-5.6-luna":             {1, 0.1, 6},
	"gpt-6-sol":                nil,
	"gpt-6-luna":               nil,
	"gpt-6-astra":              nil,
	"gpt-6.1-sol":              nil,
	"gpt-6.1-terra":            nil,
	"gpt-6.2-sol":              nil,
	"gpt-6.2-astra":            nil,
	"gpt-daybreak-blue-latest": nil,
	"gpt-daybreak-red-latest":  nil,
	"codex-auto-review":        nil,
	// The sim's.
	"gpt-5.5-codex": nil,
	"gpt-5.4":       {2.5, 0.25, 15},
	"gpt-5.4-mini":  {0.75, 0.075, 4.5},
	// Published, and picked by Codex users.
	"gpt-5.4-nano":      {0.2, 0.02, 1.25},
	"gpt-5.3-codex":     {1.75, 0.175, 14},
	"gpt-5.2-codex":     {1.75, 0.175, 14},
	"gpt-5.2":           {1.75, 0.175, 14},
	"gpt-5.1-codex-max": {1.25, 0.125, 10},
	"gpt-5.1-codex":     {1.25, 0.125, 10},
	"gpt-5-codex":       {1.25, 0.125, 10},
}

// Every model the relay knows is priced: by its own entry, or by the
// fallback (gpt-5.5), marked not priced, so a cost limit counts it.
func TestEveryKnownModelIsPriced(t *testing.T) {
	t.Parallel()
	d := pricing.Default()
	fallback, ok := d.Lookup(d.FallbackModel, "")
	require.True(t, ok, "the fallback model has a price")
	for model, want := range knownModels {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			q := d.Quote(model, "")
			require.True(t, q.OK, "priced, by itself or by the fallback")
			if want == nil {
				assert.False(t, q.Priced, "no published price: priced by the fallback, marked so")
				assert.Equal(t, fallback, q.Entry)
				assert.Equal(t, []string{model}, d.Unpriced([]string{model}))
				return
			}
			assert.True(t, q.Priced)
			assert.Equal(t, [3]float64{q.Entry.Input, q.Entry.CachedInput, q.Entry.Output}, *want)
			assert.Empty(t, d.Unpriced([]string{model}))
		})
	}
	// Without a fallback an unpriced model costs nothing: Quote says so.
	bare := d
	bare.FallbackModel = ""
	assert.False(t, bare.Quote("gpt-6-sol", "").OK)
	// A dated snapshot is its model; a variant is another model.
	assert.True(t, d.Quote("gpt-5.4-2026-03-05", "").Priced)
	assert.False(t, d.Quote("gpt-5.4-codex", "").Priced)
}

// The pinned Codex CLI's own catalog holds no model the list above does
// not: a new pin with new models fails here until they are priced (or
// listed as unpublished).
func TestThePinnedCodexCatalogIsKnown(t *testing.T) {
	c := codexcli.New(t, codexcli.Provider{BaseURL: "http://127.0.0.1:9/backend-api/codex"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Binary, "debug", "models")
	cmd.Env = append(os.Environ(), "CODEX_HOME="+c.Home, "HOME="+c.UserHome)
	cmd.Dir = c.Dir
	out, err := cmd.Output()
	require.NoError(t, err)
	var catalog struct {
		Models []struct {
			Slug string `json:"slug"`
		} `json:"models"`
	}
	require.NoError(t, json.Unmarshal(out, &catalog), "%s", out)
	require.NotEmpty(t, catalog.Models)
	var unknown []string
	for _, m := range catalog.Models {
		if _, ok := knownModels[m.Slug]; !ok {
			unknown = append(unknown, m.Slug)
		}
	}
	sort.Strings(unknown)
	assert.Empty(t, unknown, "models of the pinned Codex CLI's catalog the price table test does not know")
}
