package relay

import (
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goroutineStacks is every goroutine's stack, as text.
func goroutineStacks(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 2))
	return b.String()
}

// A wait for the sessions that ends with its context leaves nothing behind
// (a goroutine blocked on the sessions for as long as they last, before).
func TestWaitSessionsEndsWithItsContextAndLeavesNoGoroutine(t *testing.T) {
	var c sessionCount
	require.True(t, c.start())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, c.wait(ctx), context.Canceled)
	assert.NotContains(t, goroutineStacks(t), "sessionCount", "no goroutine waits on after the wait ended")
	c.end()
	assert.NoError(t, c.wait(context.Background()), "no session left")
}

// A session that starts while another goroutine waits for the sessions to
// end is waited for too (a sync.WaitGroup forbids that Add); once stopped,
// no session starts.
func TestSessionCountStartsDuringAWaitAndNotAfterStop(t *testing.T) {
	var c sessionCount
	require.True(t, c.start())
	waited := make(chan error, 1)
	go func() { waited <- c.wait(context.Background()) }()
	require.True(t, c.start(), "a session starts while the wait is under way")
	c.end()
	select {
	case err := <-waited:
		t.Fatalf("the wait ended with a session live: %v", err)
	default:
	}
	c.end()
	select {
	case err := <-waited:
		assert.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the wait did not end when the last session did")
	}
	c.stop()
	assert.False(t, c.start(), "no session starts once stopped")
	assert.NoError(t, c.wait(context.Background()))
}
