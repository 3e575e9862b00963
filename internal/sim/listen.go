package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Listen serves a simulated upstream of cfg on addr (port 0 picks a free
// one), as codex-relay's sim, demo and bench run it; URL is set to where it
// listens. stop closes its streams and connections and shuts its server
// down, within 5 seconds, logging to log a server that did not end cleanly.
func Listen(cfg Config, addr string, log *slog.Logger) (upstream *Server, stop func(), err error) {
	upstream, err = New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("sim: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		upstream.Close()
		return nil, nil, fmt.Errorf("sim listen: %w", err)
	}
	upstream.URL = "http://" + ln.Addr().String()
	srv := &http.Server{Handler: upstream, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return upstream, func() {
		upstream.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("sim stopped", "err", err)
		}
	}, nil
}
