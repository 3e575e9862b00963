package codexcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigTOML(t *testing.T) {
	t.Parallel()
	got := ConfigTOML(Provider{
		BaseURL: "http://127.0.0.1:1/backend-api/codex", WebSockets: true,
		Headers:           map[string]string{"ChatGPT-Account-Id": "acct-1", "A": `q"uote`},
		RequestMaxRetries: new(0), StreamMaxRetries: new(1), StreamIdleTimeout: 1500 * time.Millisecond,
	})
	assert.Equal(t, `model = "gpt-5.5-codex"
model_provider = "relay"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.relay]
name = "relay"
base_url = "http://127.0.0.1:1/backend-api/codex"
wire_api = "responses"
env_key = "CODEX_RELAY_KEY"
supports_websockets = true
request_max_retries = 0
stream_max_retries = 1
stream_idle_timeout_ms = 1500

[model_providers.relay.http_headers]
"A" = "q\"uote"
"ChatGPT-Account-Id" = "acct-1"
`, got)

	minimal := ConfigTOML(Provider{BaseURL: "http://x/v1", Model: "m", EnvKey: "K"})
	assert.Contains(t, minimal, "model = \"m\"\n")
	assert.Contains(t, minimal, "env_key = \"K\"\n")
	assert.Contains(t, minimal, "supports_websockets = false\n")
	assert.NotContains(t, minimal, "http_headers")
	assert.NotContains(t, minimal, "retries")
}

func TestResultParse(t *testing.T) {
	t.Parallel()
	r := &Result{Stdout: strings.Join([]string{
		`Reading additional input from stdin...`,
		`{"type":"thread.started","thread_id":"th-1"}`,
		`{"type":"turn.started"}`,
		`{"type":"item.completed","item":{"id":"i0","type":"reasoning","text":"thinking"}}`,
		`{"type":"item.completed","item":{"id":"i1","type":"command_execution","command":"echo x","aggregated_output":"x\n","exit_code":0,"status":"completed"}}`,
		`{"type":"item.completed","item":{"id":"i2","type":"agent_message","text":"first"}}`,
		`{"type":"item.completed","item":{"id":"i3","type":"agent_message","text":"final answer"}}`,
		`{"type":"error","message":"stream disconnected"}`,
		`{"type":"turn.failed","error":{"message":"usage limit"}}`,
		`{not json`,
		``,
	}, "\n")}
	r.parse()
	assert.Equal(t, "th-1", r.ThreadID)
	assert.Equal(t, "final answer", r.FinalMessage)
	assert.Equal(t, []string{"stream disconnected", "usage limit"}, r.Errors)
	require.Len(t, r.Commands, 1)
	assert.Equal(t, "x\n", r.Commands[0].Output)
	require.NotNil(t, r.Commands[0].ExitCode)
	assert.Equal(t, 0, *r.Commands[0].ExitCode)
	assert.Len(t, r.Events, 8)
	assert.Equal(t, "thread.started", r.Events[0].Type)
	assert.JSONEq(t, `{"type":"turn.started"}`, string(r.Events[1].Raw))
}

func TestWebSocketFallback(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		stderr string
		want   bool
	}{
		{"", false},
		{"warning: unknown model\nall good\n", false},
		{"2026 ERROR codex_api: failed to connect to Responses WebSocket stage=Unknown\n", true},
		{"x\nWARN Falling back from WebSockets to HTTPS transport\n", true},
	} {
		r := &Result{Stderr: tt.stderr}
		assert.Equal(t, tt.want, r.WebSocketFallback() != "", tt.stderr)
	}
}

// fakeCodex writes a script standing in for Codex: it prints its arguments
// and environment as JSONL, and does what the prompt argument says.
func fakeCodex(t *testing.T) *Codex {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "codex")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
last=""
for a in "$@"; do last="$a"; done
printf '{"type":"thread.started","thread_id":"fake-thread"}\n'
i=0
for a in "$@"; do printf '{"type":"arg","i":%d,"v":"%s"}\n' "$i" "$a"; i=$((i+1)); done
env | sort | while IFS= read -r kv; do printf '{"type":"env","kv":"%s"}\n' "$kv"; done
stdin=$(cat)
printf '{"type":"stdin","bytes":%d}\n' "${#stdin}"
case "$last" in
  sleep) sleep 30 & echo $! > "$PWD/child.pid"; sleep 30 ;;
  fail) echo "boom" >&2; exit 3 ;;
esac
printf '{"type":"item.completed","item":{"type":"agent_message","text":"done: %s"}}\n' "$last"
`), 0o755))
	return &Codex{Binary: script, Home: filepath.Join(dir, "home"), Dir: dir, UserHome: filepath.Join(dir, "user-home"), envKey: "CODEX_RELAY_KEY", key: "secret-key"}
}

func eventsOf(r *Result, typ string) []string {
	var out []string
	for _, e := range r.Events {
		if e.Type != typ {
			continue
		}
		s := string(e.Raw)
		for _, k := range []string{`"v":"`, `"kv":"`, `"bytes":`} {
			if i := strings.Index(s, k); i >= 0 {
				out = append(out, strings.TrimRight(s[i+len(k):], `"}`))
			}
		}
	}
	return out
}

func TestRunArgumentsEnvironmentAndStdin(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "must-not-leak")
	t.Setenv("HTTPS_PROXY", "http://proxy.invalid")
	c := fakeCodex(t)
	ctx := context.Background()

	res, err := c.Exec(ctx, "hello", RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, []string{"exec", "--skip-git-repo-check", "--json", "--dangerously-bypass-approvals-and-sandbox", "hello"}, eventsOf(res, "arg"))
	assert.Equal(t, "fake-thread", res.ThreadID)
	assert.Equal(t, "done: hello", res.FinalMessage)
	assert.Equal(t, []string{"0"}, eventsOf(res, "stdin"), "standard input is empty (/dev/null)")

	var names []string
	for _, kv := range eventsOf(res, "env") {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	for _, n := range names {
		assert.Contains(t, []string{"PATH", "HOME", "CODEX_HOME", "CODEX_RELAY_KEY", "PWD", "SHLVL", "_", "OLDPWD",
			"CODEX_REFRESH_TOKEN_URL_OVERRIDE", "CODEX_REVOKE_TOKEN_URL_OVERRIDE"}, n,
			"only PATH, HOME, CODEX_HOME, the key and the dead token URLs reach Codex (the shell adds PWD, SHLVL, _)")
	}
	assert.Contains(t, eventsOf(res, "env"), "CODEX_REFRESH_TOKEN_URL_OVERRIDE=http://127.0.0.1:9/oauth/token",
		"a token refresh could not leave the machine")
	assert.Contains(t, eventsOf(res, "env"), "CODEX_RELAY_KEY=secret-key")
	assert.Contains(t, eventsOf(res, "env"), "CODEX_HOME="+c.Home)
	assert.Contains(t, eventsOf(res, "env"), "HOME="+c.UserHome, "a home of its own: the user's dotfiles do not run in Codex's tool shell")

	res, err = c.Resume(ctx, "th-9", "again", RunOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"exec", "resume", "--skip-git-repo-check", "--json", "th-9", "again"}, eventsOf(res, "arg"))

	res, err = c.Exec(ctx, "fail", RunOptions{})
	require.NoError(t, err, "a non-zero exit is a result, not an error")
	assert.Equal(t, 3, res.ExitCode)
	assert.Contains(t, res.Stderr, "boom")
}

func TestRunTimeoutKillsTheProcessGroup(t *testing.T) {
	t.Parallel()
	c := fakeCodex(t)
	start := time.Now()
	res, err := c.Exec(context.Background(), "sleep", RunOptions{Timeout: 300 * time.Millisecond})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Equal(t, "fake-thread", res.ThreadID, "what was printed before the timeout is kept")

	b, err := os.ReadFile(filepath.Join(c.Dir, "child.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	deadline := time.Now().Add(time.Minute)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the timed-out run is still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fakeTB records Skip and Fatal, which New calls when Codex is missing.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

type stopTest struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	panic(stopTest{})
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(stopTest{})
}

func newExpectingStop(tb *fakeTB) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopTest); !ok {
				panic(r)
			}
		}
	}()
	New(tb, Provider{BaseURL: "http://x"})
}

func TestNewWithoutCodex(t *testing.T) {
	t.Chdir(t.TempDir()) // no node_modules here or above
	t.Setenv(RequireEnv, "")
	tb := &fakeTB{TB: t}
	newExpectingStop(tb)
	assert.Contains(t, tb.skipped, "node_modules/.bin/codex not found")
	assert.Empty(t, tb.failed)

	t.Setenv(RequireEnv, "1")
	tb = &fakeTB{TB: t}
	newExpectingStop(tb)
	assert.Contains(t, tb.failed, "CODEX_RELAY_REQUIRE_E2E=1 requires it")
	assert.Empty(t, tb.skipped)
}

func TestNewWritesHomeUnderTestOutput(t *testing.T) {
	if _, err := Binary(); err != nil {
		t.Skip("the Codex CLI is not installed; TestNewWithoutCodex covers this case")
	}
	dir, err := homesDir()
	require.NoError(t, err)
	var home string
	t.Run("use", func(t *testing.T) {
		c := New(t, Provider{BaseURL: "http://127.0.0.1:9/v1", Key: "k"})
		home = c.Home
		assert.True(t, strings.HasPrefix(home, filepath.Join(dir, "codex-home-")), home)
		assert.False(t, underTempDir(home), "Codex refuses helper binaries under the temp dir")
		b, err := os.ReadFile(filepath.Join(home, "config.toml"))
		require.NoError(t, err)
		assert.Contains(t, string(b), `base_url = "http://127.0.0.1:9/v1"`)
		assert.True(t, filepath.IsAbs(c.Binary))
	})
	_, err = os.Stat(home)
	assert.True(t, os.IsNotExist(err), "CODEX_HOME is removed when the test ends")
}

func TestUnderTempDir(t *testing.T) {
	t.Parallel()
	tmp := os.TempDir()
	assert.True(t, underTempDir(filepath.Join(tmp, "a", "b")))
	assert.True(t, underTempDir(tmp))
	assert.False(t, underTempDir(filepath.Join(filepath.Dir(tmp), "not-"+filepath.Base(tmp)+"-x")))
	assert.False(t, underTempDir(filepath.Join(tmp, "..", "elsewhere")))
}
