package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
)

func simTestCLI(env map[string]string) (cli, *logbuf.Buffer, *logbuf.Buffer) {
	out, errOut := &logbuf.Buffer{}, &logbuf.Buffer{}
	return cli{stdout: out, stderr: errOut, getenv: func(k string) string { return env[k] }}, out, errOut
}

func TestSimHelpDocumentsEveryOption(t *testing.T) {
	t.Parallel()
	c, _, errOut := simTestCLI(nil)
	err := run(context.Background(), []string{"sim", "--help"}, c)
	require.ErrorIs(t, err, flag.ErrHelp)
	help := errOut.String()
	for _, want := range []string{
		"Usage: codex-relay sim", "-addr", "127.0.0.1:2456", "CODEX_RELAY_SIM_ADDR",
		"-accounts-file", "CODEX_RELAY_SIM_ACCOUNTS", "-account", "-fault", "-cipher-secret", "-models",
		"usage_limit", "refuse_websocket", "websocket_max_age", "seal-messages", "/_sim/", "[[sim:",
	} {
		assert.Contains(t, help, want)
	}
}

func TestSimServesUntilCancelled(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "accounts.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"accounts":[{"id":"filed","access_token":"at-filed","organization":"org-f"}]}`), 0o600))
	c, out, _ := simTestCLI(map[string]string{"CODEX_RELAY_SIM_ACCOUNTS": file})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, c, []string{"-addr", "127.0.0.1:0",
			"-account", "id=flagged,kind=openai,org=org-g,token=sk-flagged",
			"-fault", "kind=server_error,account=flagged,times=1"})
	}()

	urlRE := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)
	var base string
	// The banner is written in pieces: wait for its last line (the faults).
	require.Eventually(t, func() bool {
		m := urlRE.FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil && strings.Contains(out.String(), "server_error")
	}, time.Minute, 10*time.Millisecond, "banner: %s", out.String())
	banner := out.String()
	for _, want := range []string{"/backend-api/codex", "/v1", "/oauth/token", "/_sim/", "filed", "at-filed", "org-f", "flagged", "sk-flagged", "org-g", "server_error"} {
		assert.Contains(t, banner, want)
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(base + "/_sim/accounts")
	require.NoError(t, err)
	var accts []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&accts))
	resp.Body.Close()
	require.Len(t, accts, 2)
	assert.Equal(t, "filed", accts[0].ID)
	assert.Equal(t, "flagged", accts[1].ID)

	post := func() int {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/responses",
			strings.NewReader(`{"model":"m","input":[{"type":"message","role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk-flagged")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusInternalServerError, post(), "the fault given at start fires once")
	assert.Equal(t, http.StatusOK, post())

	// A stalled stream must not hold up the shutdown.
	resp, err = hc.Post(base+"/_sim/faults", "application/json", strings.NewReader(`{"kind":"stall"}`))
	require.NoError(t, err)
	resp.Body.Close()
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/responses", strings.NewReader(`{"input":[]}`))
		req.Header.Set("Authorization", "Bearer sk-flagged")
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("sim did not stop after its context was cancelled")
	}
	<-stalled
	assert.Contains(t, out.String(), "sim: stopped")
}

func TestSimRejectsBadOptions(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.json")
	for _, args := range [][]string{
		{"-addr", "127.0.0.1:0", "-account", "id=x"},
		{"-addr", "127.0.0.1:0", "-fault", "kind=nope"},
		{"-addr", "127.0.0.1:0", "-accounts-file", missing},
		{"-addr", "127.0.0.1:0", "stray"},
		{"-addr", "256.0.0.1:99999"},
	} {
		c, _, _ := simTestCLI(nil)
		err := runSim(context.Background(), c, args)
		require.Error(t, err, "%v", args)
		assert.False(t, errors.Is(err, flag.ErrHelp))
	}
}

// sim --help gives the prompt script in full: every directive the sim's
// parser knows (its own table), with its syntax and an example.
func TestSimHelpGivesThePromptScript(t *testing.T) {
	t.Parallel()
	c, _, errOut := simTestCLI(nil)
	require.ErrorIs(t, run(context.Background(), []string{"sim", "--help"}, c), flag.ErrHelp)
	help := errOut.String()
	assert.NotContains(t, help, "see the internal/sim package")
	for _, want := range []string{"Prompt script:", "Simulated reply to: PROMPT", "Tool results:", "compaction_trigger", "answered 400"} {
		assert.Contains(t, help, want)
	}
	directives := sim.Directives()
	require.NotEmpty(t, directives)
	for _, d := range directives {
		assert.Contains(t, help, "\n  "+d.Syntax()+"\n", d.Name)
		assert.Contains(t, help, "e.g. "+d.Example+"\n", d.Name)
		first := wrapText(d.Doc, 72)[0]
		assert.Contains(t, help, first, d.Name)
	}
}

func TestWrapText(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []string{"aa bb", "cc", "dddddddd", "e"}, wrapText("aa bb  cc dddddddd e", 5))
	assert.Empty(t, wrapText("  ", 5))
}
