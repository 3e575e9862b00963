package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

func runHealthcheck(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "healthcheck", "Ask the relay on this host whether it is up (GET /healthz) and exit 0 when it answers 200, 1 otherwise.\n"+
		"It is the container image's HEALTHCHECK: the image has no shell and no curl.")
	addr := fs.String("addr", envOr(c, "CODEX_RELAY_ADDR", DefaultAddr), "the relay's listen address (env CODEX_RELAY_ADDR); a wildcard host (0.0.0.0, ::, none) is asked on 127.0.0.1")
	path := fs.String("path", "/healthz", "what to ask: /healthz (the process serves) or /readyz (the database answers, takes writes and is migrated)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("healthcheck: unexpected argument %q", fs.Arg(0))
	}
	u, err := healthURL(*addr, *path)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	// Never through HTTP_PROXY: the relay is on this host.
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s", u, resp.Status)
	}
	return nil
}

// healthURL is the URL of path on the relay listening on addr, as seen from
// the same host: a wildcard or empty host becomes 127.0.0.1.
func healthURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(addr))
	if err != nil {
		return "", fmt.Errorf("-addr %q: want host:port: %w", addr, err)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("-addr %q: no fixed port to ask", addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("-path %q: want an absolute path such as /healthz", path)
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
