package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/logbuf"
)

// The demo prints what a person needs; pasting it into Codex works, over
// WebSocket, through the relay and the simulated upstream.
func TestDemoServesCodex(t *testing.T) {
	env := map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0"}
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &logbuf.Buffer{}, &logbuf.Buffer{}
	listening := make(chan string, 1)
	c := cli{stdout: out, stderr: errOut, getenv: func(k string) string { return env[k] }, listening: func(a string) { listening <- a }}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"demo"}, c) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("demo did not stop within 30s")
		}
	}()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("demo ended early: %v\n%s", err, errOut.String())
	case <-time.After(60 * time.Second):
		t.Fatal("demo did not start within 60s")
	}
	banner := out.String()
	key := regexp.MustCompile(`export CODEX_RELAY_KEY=(crk_[0-9A-Za-z]+)`).FindStringSubmatch(banner)
	require.NotNil(t, key, banner)
	base := regexp.MustCompile(`base_url = "([^"]+)"`).FindStringSubmatch(banner)
	require.NotNil(t, base, banner)
	assert.True(t, strings.HasSuffix(base[1], "/backend-api/codex"))
	assert.Contains(t, banner, `supports_websockets = true`)
	assert.Contains(t, banner, "/api/v1/")
	assert.Regexp(t, `Admin token \(shown once`, banner)
	assert.Contains(t, banner, "/admin/", "the console URL")

	codex := codexcli.New(t, codexcli.Provider{BaseURL: base[1], WebSockets: true, Key: key[1]})
	res, err := codex.Exec(context.Background(), "hello from the demo", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Contains(t, res.FinalMessage, "hello from the demo")
	assert.Empty(t, res.WebSocketFallback())
}
