package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The HTTP server's limits in front of the relay (httpServer): headers
// within ReadHeaderTimeout and MaxHeaderBytes, idle kept-alive connections
// closed after IdleTimeout. MaxHeaderBytes bounds what the relay forwards
// upstream too (every header but those it drops passes): 64 KiB holds
// Codex's headers many times over (its turn metadata is the largest, a
// few hundred bytes) and refuses, with 431, the megabyte of headers a
// client could otherwise have the relay forward on every request.
const (
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 64 << 10
)

// httpServer is the HTTP server in front of the relay's handler, with the
// limits that keep hostile clients in bounds (ReadHeaderTimeout,
// MaxHeaderBytes, IdleTimeout).
func httpServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// drainer is what a graceful stop asks of the relay (*relay.Server): stop
// taking WebSocket sessions and end the open ones between turns, and wait
// for them.
type drainer interface {
	Drain()
	WaitSessions(ctx context.Context) error
}

// serveUntilDone serves until ctx ends, then drains within grace: readiness
// fails and WebSocket sessions end between turns (dr, when set), the HTTP
// server stops taking connections and lets running requests finish, and
// the WebSocket turns under way finish too; what is still running at the
// grace's end is cut.
func serveUntilDone(ctx context.Context, hs *http.Server, ln net.Listener, grace time.Duration, log *slog.Logger, dr drainer) error {
	errc := make(chan error, 1)
	go func() { errc <- serveHTTP(hs, ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", grace.String())
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if dr != nil {
		dr.Drain()
	}
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		hs.Close()
		err = nil
	}
	if dr != nil {
		if werr := dr.WaitSessions(sctx); werr != nil {
			log.Warn("WebSocket sessions still open at the end of the grace time", "err", werr)
		}
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
