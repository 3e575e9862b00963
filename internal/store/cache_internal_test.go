package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/singleflight"
)

// tempStore opens a store on a SQLite file of the test's own, closed when
// the test ends.
func tempStore(t *testing.T) *Store {
	t.Helper()
	loc, err := ParseLocation("sqlite:" + filepath.Join(t.TempDir(), "relay.db"))
	require.NoError(t, err)
	s, err := Open(context.Background(), loc, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Queries past the cache's bound still run (unprepared); the cache stays
// bounded; after Close nothing is prepared and queries fail cleanly.
func TestStatementCacheIsBounded(t *testing.T) {
	ctx := context.Background()
	s := tempStore(t)
	for i := range maxCachedStmts + 40 {
		var got int
		require.NoError(t, s.get(ctx, &got, fmt.Sprintf("SELECT ? + %d", i), 1))
		assert.Equal(t, i+1, got)
	}
	// The same text again is served by its cached statement.
	var got int
	require.NoError(t, s.get(ctx, &got, "SELECT ? + 5", 2))
	assert.Equal(t, 7, got)
	assert.Equal(t, maxCachedStmts, s.stmts.size())

	require.NoError(t, s.Close())
	assert.Error(t, s.get(ctx, &got, "SELECT ? + 5", 2), "a closed store answers with an error")
	assert.Error(t, s.get(ctx, &got, "SELECT 'never prepared'"))
}

// Many first uses of one query at once: each gets its answer (one
// prepares, the others run the query as is meanwhile), and the cache
// holds the query once.
func TestStatementCacheFirstUsesAtOnce(t *testing.T) {
	ctx := context.Background()
	s := tempStore(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			var got int
			if err := s.get(ctx, &got, "SELECT ? * 2", i); err != nil {
				errs <- err
			} else if got != 2*i {
				errs <- fmt.Errorf("SELECT %d * 2 = %d", i, got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, 1, s.stmts.size())
	st, known := s.stmts.lookup("SELECT ? * 2")
	assert.True(t, known)
	assert.NotNil(t, st, "the first use's statement is kept")
}

// A key found by its secret is remembered: found again without the
// database (here its row is gone behind the store's back), until a write
// to a key drops what the store remembers.
func TestAuthenticatedKeyIsRemembered(t *testing.T) {
	ctx := context.Background()
	s := tempStore(t)
	_, err := s.Migrate(ctx)
	require.NoError(t, err)
	k, secret, err := s.CreateClientKey(ctx, ClientKey{Name: "laptop"})
	require.NoError(t, err)
	_, err = s.AuthenticateClientKey(ctx, secret)
	require.NoError(t, err)
	_, err = s.db.ExecContext(ctx, `DELETE FROM client_keys WHERE id = ?`, k.ID)
	require.NoError(t, err)
	got, err := s.AuthenticateClientKey(ctx, secret)
	require.NoError(t, err, "remembered")
	assert.Equal(t, k.ID, got.ID)
	_, _, err = s.CreateClientKey(ctx, ClientKey{Name: "another"})
	require.NoError(t, err)
	_, err = s.AuthenticateClientKey(ctx, secret)
	assert.ErrorIs(t, err, ErrKeyRejected, "a write to a key drops what was remembered")
}

// Callers that miss one entry at once share one read; the first caller
// going away fails no one else; a caller stops waiting when its own ctx
// ends.
func TestSharedRead(t *testing.T) {
	var g singleflight.Group
	var reads atomic.Int32
	release := make(chan struct{})
	read := func(ctx context.Context) (int, error) {
		reads.Add(1)
		select {
		case <-release:
			return 42, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := shared(firstCtx, &g, "k", read)
		first <- err
	}()
	require.Eventually(t, func() bool { return reads.Load() == 1 }, time.Minute, time.Millisecond)
	got := make(chan int, 8)
	for range 8 {
		go func() {
			v, err := shared(context.Background(), &g, "k", read)
			assert.NoError(t, err)
			got <- v
		}()
	}
	impatient, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := shared(impatient, &g, "k", read)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a caller waits no longer than its own ctx")
	cancelFirst()
	assert.ErrorIs(t, <-first, context.Canceled)
	close(release)
	for range 8 {
		assert.Equal(t, 42, <-got, "the first caller's going did not end the read")
	}
	assert.EqualValues(t, 1, reads.Load(), "one read for every caller")
}
