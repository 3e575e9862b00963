package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/pricing"
)

// A table read before a save, and kept after it, is not reused: the save
// is newer than the read.
func TestPriceCacheKeepsNoReadOlderThanASave(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var c priceCache
	_, gen, ok := c.cached(now)
	assert.False(t, ok, "empty at first")
	c.changed() // a save lands while the read is under way
	c.keep(pricing.Default(), gen, now)
	_, _, ok = c.cached(now)
	assert.False(t, ok, "the read began before the save: not kept")

	_, gen, _ = c.cached(now)
	c.keep(pricing.Default(), gen, now)
	got, _, ok := c.cached(now.Add(pricesTTL - time.Millisecond))
	assert.True(t, ok, "a read after the save is kept")
	assert.True(t, got.IsDefault())
	_, _, ok = c.cached(now.Add(-time.Second))
	assert.False(t, ok, "a clock that went back does not extend it")
}
