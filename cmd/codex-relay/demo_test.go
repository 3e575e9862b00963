package main

import (
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/store"
)

// The demo prints what a person needs; pasting it into Codex works, over
// WebSocket, through the relay and the simulated upstream.
func TestDemoServesCodex(t *testing.T) {
	out, errOut := &logbuf.Buffer{}, &logbuf.Buffer{}
	startDemo(t, map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0"}, out, errOut)
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

// startDemo runs codex-relay demo with env and args, its standard output on
// out and its standard error on errOut, and returns once it listens (its
// banner written); the test's end stops it.
func startDemo(t *testing.T, env map[string]string, out, errOut *logbuf.Buffer, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan string, 1)
	c := cli{stdout: out, stderr: errOut, getenv: func(k string) string { return env[k] }, listening: func(a string) { listening <- a }}
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"demo"}, args...), c) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("demo did not stop within 30s")
		}
	})
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("demo ended early: %v\n%s", err, errOut.String())
	case <-time.After(60 * time.Second):
		t.Fatal("demo did not start within 60s")
	}
}

// The demo's banner, the last thing it prints at start-up (after the log
// lines, on a terminal where both streams meet), gives the console URL and
// the admin token to sign in with, the relay URL and the Codex config; the
// token it shows opens the admin API. A token of the environment is named,
// not echoed; a kept database's token is said to be the one printed before.
func TestDemoBannerRepeatsTheAdminToken(t *testing.T) {
	t.Run("generated", func(t *testing.T) {
		term := &logbuf.Buffer{} // stdout and stderr on one terminal
		startDemo(t, map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0"}, term, term)
		all := term.String()
		first := regexp.MustCompile(`Admin token \(shown once[^:]*: (cra_[0-9A-Za-z]+)`).FindStringSubmatch(all)
		require.NotNil(t, first, all)
		at := strings.Index(all, "Codex Relay demo is running.")
		require.GreaterOrEqual(t, at, 0, all)
		banner := all[at:]
		for _, startup := range []string{`"msg":"database migrated"`, `"msg":"codex-relay listening"`, first[0]} {
			i := strings.Index(all, startup)
			require.GreaterOrEqual(t, i, 0, "%s in %s", startup, all)
			assert.Less(t, i, at, "the banner comes after %s", startup)
		}
		assert.Regexp(t, `(?m)^  admin token  `+first[1]+`$`, banner, "the banner repeats the token")
		console := regexp.MustCompile(`(?m)^  console      (http://\S+/admin/)`).FindStringSubmatch(banner)
		require.NotNil(t, console, banner)
		relayURL := regexp.MustCompile(`(?m)^  relay        (http://\S+)`).FindStringSubmatch(banner)
		require.NotNil(t, relayURL, banner)
		assert.Equal(t, relayURL[1]+"/admin/", console[1])
		assert.Contains(t, banner, `base_url = "`+relayURL[1]+`/backend-api/codex"`)
		assert.Regexp(t, `export CODEX_RELAY_KEY=crk_`, banner)

		req, err := http.NewRequest(http.MethodGet, relayURL[1]+"/api/v1/accounts", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+first[1])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var accounts struct {
			Accounts []map[string]any `json:"accounts"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&accounts))
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Len(t, accounts.Accounts, 3, "the banner's token opens the admin API")
	})
	t.Run("from the environment", func(t *testing.T) {
		const token = "cra_demo_token_from_the_environment"
		term := &logbuf.Buffer{}
		startDemo(t, map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0", "CODEX_RELAY_ADMIN_TOKEN": token}, term, term)
		assert.Regexp(t, `(?m)^  admin token  the value of CODEX_RELAY_ADMIN_TOKEN$`, term.String())
		assert.NotContains(t, term.String(), token, "a secret of the environment is not echoed")
	})
	t.Run("a kept database", func(t *testing.T) {
		dbURL := "sqlite:" + filepath.Join(t.TempDir(), "kept.db")
		env := map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0", "CODEX_RELAY_DATABASE_URL": dbURL}
		t.Run("first start", func(t *testing.T) {
			term := &logbuf.Buffer{}
			startDemo(t, env, term, term)
			assert.Regexp(t, `(?m)^  admin token  cra_`, term.String())
		})
		term := &logbuf.Buffer{}
		startDemo(t, env, term, term)
		assert.Regexp(t, `(?m)^  admin token  the one printed at this database's first start`, term.String())
		assert.NotContains(t, term.String(), "cra_")
	})
}

// demo --help names the database the demo really uses when none is
// configured (a new temp folder's relay.db), not serve's.
func TestDemoHelpNamesItsDefaultDatabase(t *testing.T) {
	_, errOut, err := runCLI(t, cliEnv{}, "demo", "--help")
	require.ErrorIs(t, err, flag.ErrHelp)
	stated := regexp.MustCompile(`CODEX_RELAY_DATABASE_URL; default sqlite:(\S+?),`).FindStringSubmatch(errOut)
	require.NotNil(t, stated, errOut)
	assert.Equal(t, "sqlite:"+stated[1], demoDefaultDatabase())
	assert.NotContains(t, errOut, store.DefaultSQLitePath, "serve's default is not the demo's")

	out := &logbuf.Buffer{}
	startDemo(t, map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0"}, out, &logbuf.Buffer{})
	used := regexp.MustCompile(`\(database sqlite:(\S+)\)`).FindStringSubmatch(out.String())
	require.NotNil(t, used, out.String())
	ok, err := filepath.Match(stated[1], used[1])
	require.NoError(t, err)
	assert.True(t, ok, "the demo uses %s, its help says %s", used[1], stated[1])
	_, err = os.Stat(used[1])
	assert.NoError(t, err, "the database is there")
}
