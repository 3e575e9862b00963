package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
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

// Shutdown lets a request that ends within the grace time finish with its
// whole answer, and cuts one still open when the grace time is over, not
// before: a request that never ends cannot hold the process, and a stream
// about to end is not lost to a restart.
func TestShutdownCutsRequestsAfterTheGraceTime(t *testing.T) {
	t.Parallel()
	const grace = time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var open sync.WaitGroup // both requests are in their handlers
	open.Add(2)
	shuttingDown := make(chan struct{})
	cutAt := make(chan time.Time, 1)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first half;")
		w.(http.Flusher).Flush()
		open.Done()
		switch r.URL.Path {
		case "/ends-soon":
			// It ends after the shutdown began (Shutdown runs the
			// RegisterOnShutdown hooks; Close does not), well within the
			// grace time.
			select {
			case <-shuttingDown:
			case <-r.Context().Done():
				return // cut
			}
			select {
			case <-time.After(grace / 20):
			case <-r.Context().Done():
				return // cut
			}
			fmt.Fprint(w, "second half")
		case "/never-ends":
			<-r.Context().Done()
			cutAt <- time.Now()
		}
	})}
	hs.RegisterOnShutdown(func() { close(shuttingDown) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveUntilDone(ctx, hs, ln, grace, slog.New(slog.DiscardHandler), nil) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	type answer struct {
		body string
		err  error
	}
	get := func(path string) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			resp, err := client.Get("http://" + ln.Addr().String() + path)
			if err != nil {
				out <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			out <- answer{string(b), err}
		}()
		return out
	}
	endsSoon, neverEnds := get("/ends-soon"), get("/never-ends")
	open.Wait()
	shutdownAt := time.Now()
	cancel()

	select {
	case a := <-endsSoon:
		assert.NoError(t, a.err, "a request that ends within the grace time is not cut")
		assert.Equal(t, "first half;second half", a.body, "its whole answer reaches the client")
	case <-time.After(10 * time.Second):
		t.Fatal("the request that ends within the grace time never answered")
	}
	select {
	case at := <-cutAt:
		assert.GreaterOrEqual(t, at.Sub(shutdownAt), grace, "the open request was cut before the grace time was over")
	case <-time.After(10 * time.Second):
		t.Fatal("the open request was not cut")
	}
	select {
	case a := <-neverEnds:
		assert.Error(t, a.err, "the client of a cut request sees its answer broken off")
		assert.Equal(t, "first half;", a.body)
	case <-time.After(10 * time.Second):
		t.Fatal("the client of the cut request is still waiting")
	}
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown waited for a request that never ends")
	}
}
