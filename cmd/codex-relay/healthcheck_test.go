package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHealthURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, path, want string
	}{
		{"0.0.0.0:2455", "/healthz", "http://127.0.0.1:2455/healthz"},
		{":2455", "/healthz", "http://127.0.0.1:2455/healthz"},
		{"[::]:8080", "/readyz", "http://127.0.0.1:8080/readyz"},
		{"127.0.0.1:2455", "/healthz", "http://127.0.0.1:2455/healthz"},
		{"[::1]:2455", "/healthz", "http://[::1]:2455/healthz"},
		{"relay.internal:2455", "/healthz", "http://relay.internal:2455/healthz"},
	} {
		got, err := healthURL(tc.addr, tc.path)
		require.NoError(t, err, tc.addr)
		assert.Equal(t, tc.want, got, tc.addr)
	}
	for _, bad := range [][2]string{{"2455", "/healthz"}, {"127.0.0.1:0", "/healthz"}, {"127.0.0.1:2455", "healthz"}} {
		_, err := healthURL(bad[0], bad[1])
		assert.Error(t, err, "%v", bad)
	}
}

// healthcheck exits 0 only when the relay answers 200 at the path; a 503 or
// nobody listening is a failure (exit 1), which is what the image's
// HEALTHCHECK needs.
func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	var status = map[string]int{"/healthz": 200, "/readyz": 503}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, ok := status[r.URL.Path]
		if !ok {
			code = 404
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, http.StatusText(code))
	}))
	defer srv.Close()
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)

	// The address comes from CODEX_RELAY_ADDR, as in the image, with a
	// wildcard host asked on loopback.
	env := map[string]string{"CODEX_RELAY_ADDR": "0.0.0.0:" + port}
	var stderr strings.Builder
	c := cli{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string { return env[k] }}
	ctx := context.Background()
	assert.NoError(t, run(ctx, []string{"healthcheck"}, c))

	err = run(ctx, []string{"healthcheck", "-path", "/readyz"}, c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "503")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	assert.Error(t, run(ctx, []string{"healthcheck", "-addr", dead, "-timeout", "1s"}, c), "nobody listening")
}
