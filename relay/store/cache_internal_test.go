package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Queries past the cache's bound still run (unprepared); the cache stays
// bounded; after Close nothing is prepared and queries fail cleanly.
func TestStatementCacheIsBounded(t *testing.T) {
	ctx := context.Background()
	loc, err := ParseLocation("sqlite:" + filepath.Join(t.TempDir(), "relay.db"))
	require.NoError(t, err)
	s, err := Open(ctx, loc, Options{})
	require.NoError(t, err)
	for i := range maxCachedStmts + 40 {
		var got int
		require.NoError(t, s.get(ctx, &got, fmt.Sprintf("SELECT ? + %d", i), 1))
		assert.Equal(t, i+1, got)
	}
	// The same text again is served by its cached statement.
	var got int
	require.NoError(t, s.get(ctx, &got, "SELECT ? + 5", 2))
	assert.Equal(t, 7, got)
	s.stmts.mu.Lock()
	n := len(s.stmts.stmts)
	s.stmts.mu.Unlock()
	assert.Equal(t, maxCachedStmts, n)

	require.NoError(t, s.Close())
	assert.Error(t, s.get(ctx, &got, "SELECT ? + 5", 2), "a closed store answers with an error")
	assert.Error(t, s.get(ctx, &got, "SELECT 'never prepared'"))
}
