package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeDrainer stands in for the relay: its sessions end when ended is
// closed.
type fakeDrainer struct {
	drained atomic.Bool
	ended   chan struct{}
}

func (f *fakeDrainer) Drain() { f.drained.Store(true) }

func (f *fakeDrainer) WaitSessions(ctx context.Context) error {
	select {
	case <-f.ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A stop drains the relay first (readiness fails, sessions end between
// turns) and waits for its WebSocket sessions, which the HTTP server's
// Shutdown does not see, within the grace time.
func TestServeUntilDoneDrainsWebSocketSessions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		endAfter  time.Duration // when the sessions end; 0: never
		grace     time.Duration
		waitsLong bool
	}{
		{"sessions end within the grace", 300 * time.Millisecond, 10 * time.Second, true},
		{"the grace ends first", 0, 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			hs := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
			dr := &fakeDrainer{ended: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- serveUntilDone(ctx, hs, ln, tc.grace, slog.New(slog.DiscardHandler), dr) }()
			stopped := time.Now()
			cancel()
			if tc.endAfter > 0 {
				time.AfterFunc(tc.endAfter, func() { close(dr.ended) })
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("serveUntilDone did not return")
			}
			assert.True(t, dr.drained.Load(), "the relay was drained")
			if tc.waitsLong {
				assert.GreaterOrEqual(t, time.Since(stopped), tc.endAfter, "it waited for the sessions")
			} else {
				assert.GreaterOrEqual(t, time.Since(stopped), tc.grace, "it waited the grace time out")
			}
		})
	}
}
