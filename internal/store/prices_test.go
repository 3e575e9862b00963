package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func priceTable(source string, input float64) pricing.Table {
	return pricing.Table{Source: source, AsOf: "2026-01-02", Entries: []pricing.Entry{
		{Model: "gpt-5", Tier: "default", Input: input, CachedInput: 0.125, Output: 10},
		{Model: "gpt-5", Tier: "priority", Input: 2 * input, CachedInput: 0.25, Output: 20},
	}}
}

func TestPriceTableDefaultsUntilOneIsSaved(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		cur, err := s.PriceTable(ctx)
		require.NoError(t, err)
		assert.Equal(t, pricing.Default(), cur, "nothing stored: the embedded default")
		assert.Equal(t, pricing.DefaultID, cur.ID)
		hist, err := s.PriceTables(ctx, 0)
		require.NoError(t, err)
		assert.Empty(t, hist, "the default is never stored")

		c.Add(time.Minute)
		withFallback := priceTable("https://example.com/prices", 1.5)
		withFallback.FallbackModel = withFallback.Entries[0].Model
		saved, err := s.SavePriceTable(ctx, withFallback, "admin")
		require.NoError(t, err)
		assert.Equal(t, withFallback.FallbackModel, saved.FallbackModel)
		assert.True(t, strings.HasPrefix(saved.ID, "prc_"), saved.ID)
		assert.True(t, saved.CreatedAt.Equal(c.Now()), "created at the store's clock")
		assert.Equal(t, "admin", saved.CreatedBy)
		assert.Equal(t, "https://example.com/prices", saved.Source)
		assert.Equal(t, "2026-01-02", saved.AsOf)
		assert.Equal(t, priceTable("", 1.5).Entries, saved.Entries)

		cur, err = s.PriceTable(ctx)
		require.NoError(t, err)
		assert.Equal(t, saved, cur, "the saved table is current at once, read back as saved")
		assert.False(t, cur.IsDefault())
		nanos, ok := cur.Cost("gpt-5-2025-08-07", "priority", pricing.Usage{Input: 1_000_000})
		assert.True(t, ok)
		assert.Equal(t, int64(3_000_000_000), nanos)
	})
}

func TestPriceTablesKeepHistoryNewestFirst(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		var ids []string
		for i, input := range []float64{1, 2, 3} {
			if i == 2 {
				c.Add(time.Second)
			}
			// The first two are saved in the same millisecond: the second
			// is dated after the first all the same.
			saved, err := s.SavePriceTable(ctx, priceTable("s", input), "api")
			require.NoError(t, err)
			ids = append(ids, saved.ID)
		}
		hist, err := s.PriceTables(ctx, 0)
		require.NoError(t, err)
		require.Len(t, hist, 3)
		assert.Equal(t, []string{ids[2], ids[1], ids[0]}, []string{hist[0].ID, hist[1].ID, hist[2].ID}, "newest first")
		assert.Equal(t, 3.0, hist[0].Entries[0].Input)
		assert.Equal(t, 1.0, hist[2].Entries[0].Input, "old tables keep their prices")
		assert.True(t, hist[1].CreatedAt.After(hist[2].CreatedAt), "saved in one millisecond, dated apart")

		cur, err := s.PriceTable(ctx)
		require.NoError(t, err)
		assert.Equal(t, ids[2], cur.ID)

		hist, err = s.PriceTables(ctx, 2)
		require.NoError(t, err)
		require.Len(t, hist, 2, "limit")
		assert.Equal(t, ids[2], hist[0].ID)
		hist, err = s.PriceTables(ctx, 5000)
		require.NoError(t, err)
		assert.Len(t, hist, 3, "a limit out of range is the default")
	})
}

// The current table is reused for 10 seconds; a save through the same
// store drops it at once, and one through another store (a second replica)
// is seen once the 10 seconds are over.
func TestPriceTableCache(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			url := b.URL(t)
			s := storetest.Open(t, url, store.Options{Now: c.Now})
			other := storetest.Open(t, url, store.Options{Now: c.Now})

			cur, err := s.PriceTable(ctx)
			require.NoError(t, err)
			assert.True(t, cur.IsDefault())

			fromOther, err := other.SavePriceTable(ctx, priceTable("other", 2), "api")
			require.NoError(t, err)
			c.Add(9 * time.Second)
			cur, err = s.PriceTable(ctx)
			require.NoError(t, err)
			assert.True(t, cur.IsDefault(), "reused within 10 s")
			c.Add(time.Second)
			cur, err = s.PriceTable(ctx)
			require.NoError(t, err)
			assert.Equal(t, fromOther.ID, cur.ID, "read again after 10 s")

			c.Add(time.Second)
			own, err := s.SavePriceTable(ctx, priceTable("own", 3), "admin")
			require.NoError(t, err)
			cur, err = s.PriceTable(ctx)
			require.NoError(t, err)
			assert.Equal(t, own.ID, cur.ID, "a save here drops the reused table at once")
		})
	}
}

func TestSavePriceTableRefusesAnInvalidTable(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		bad := priceTable("s", 1)
		bad.Entries[1].Tier = "turbo"
		_, err := s.SavePriceTable(ctx, bad, "admin")
		var fe *pricing.FieldError
		require.True(t, errors.As(err, &fe), "the validation error, got %v", err)
		assert.Equal(t, "entries[1].tier", fe.Path())
		_, err = s.SavePriceTable(ctx, pricing.Table{}, "admin")
		assert.Error(t, err, "a table needs entries")

		hist, err := s.PriceTables(ctx, 0)
		require.NoError(t, err)
		assert.Empty(t, hist, "nothing stored")
		cur, err := s.PriceTable(ctx)
		require.NoError(t, err)
		assert.True(t, cur.IsDefault())
	})
}
