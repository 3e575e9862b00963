package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

type running struct {
	url    string
	stdout *logbuf.Buffer
	stderr *logbuf.Buffer
	stop   func() error
}

// start runs `codex-relay serve` in-process with env and waits until it listens.
func start(t *testing.T, env map[string]string) *running {
	t.Helper()
	env["CODEX_RELAY_ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	out, errOut := &logbuf.Buffer{}, &logbuf.Buffer{}
	c := cli{stdout: out, stderr: errOut, getenv: func(k string) string { return env[k] }, listening: func(a string) { addr <- a }}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, c) }()
	select {
	case a := <-addr:
		var once sync.Once
		var stopErr error
		stop := func() error {
			once.Do(func() {
				cancel()
				select {
				case stopErr = <-done:
				case <-time.After(30 * time.Second):
					stopErr = errors.New("serve did not stop within 30s")
				}
			})
			return stopErr
		}
		t.Cleanup(func() { _ = stop() })
		return &running{url: "http://" + a, stdout: out, stderr: errOut, stop: stop}
	case err := <-done:
		cancel()
		t.Fatalf("serve ended before listening: %v\nstderr: %s", err, errOut.String())
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("serve did not listen within 60s\nstderr: %s", errOut.String())
	}
	return nil
}

func request(t *testing.T, method, url, token string, body any) (int, map[string]any, string) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, string(raw)
}

var generatedToken = regexp.MustCompile(`Admin token \(shown once[^)]*\): (cra_[0-9A-Za-z]{32})`)

// The checks a user runs on a fresh start, and that a second start on the
// same database keeps accounts, keys and the admin token.
func exerciseServe(t *testing.T, env map[string]string, wantGeneratedToken bool) {
	r := start(t, env)
	token := env["CODEX_RELAY_ADMIN_TOKEN"]
	if wantGeneratedToken {
		m := generatedToken.FindStringSubmatch(r.stdout.String())
		require.NotNil(t, m, "a generated admin token is printed: %q", r.stdout.String())
		token = m[1]
		assert.NotContains(t, r.stderr.String(), token, "the admin token is never logged")
	}

	code, body, _ := request(t, "GET", r.url+"/healthz", "", nil)
	assert.Equal(t, 200, code)
	assert.Equal(t, "ok", body["status"])
	code, body, _ = request(t, "GET", r.url+"/readyz", "", nil)
	assert.Equal(t, 200, code)
	assert.Equal(t, "ready", body["status"])

	newAccount := map[string]any{"label": "k1", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "organization": "org-a", "api_key": "sk-persist-me"}
	code, _, _ = request(t, "POST", r.url+"/api/v1/accounts", "", newAccount)
	assert.Equal(t, 401, code, "no token, no account")
	code, _, _ = request(t, "POST", r.url+"/api/v1/keys", "wrong-token", map[string]any{"name": "x"})
	assert.Equal(t, 401, code, "wrong token, no key")
	code, acc, raw := request(t, "POST", r.url+"/api/v1/accounts", token, newAccount)
	require.Equal(t, 201, code, raw)
	code, key, raw := request(t, "POST", r.url+"/api/v1/keys", token, map[string]any{"name": "laptop"})
	require.Equal(t, 201, code, raw)
	require.True(t, strings.HasPrefix(key["key"].(string), "crk_"))

	code, _, metrics := request(t, "GET", r.url+"/metrics", "", nil)
	assert.Equal(t, 200, code)
	assert.Contains(t, metrics, "go_goroutines")
	assert.Contains(t, metrics, "process_cpu_seconds_total")
	assert.Contains(t, metrics, `codex_relay_http_requests_total{code="201",method="POST",route="/api/v1/accounts"} 1`)
	require.NoError(t, r.stop())

	again := start(t, env)
	if wantGeneratedToken {
		assert.NotContains(t, again.stdout.String(), "Admin token", "the token is printed once, not on every start")
	}
	code, list, raw := request(t, "GET", again.url+"/api/v1/accounts", token, nil)
	require.Equal(t, 200, code, raw)
	require.Len(t, list["accounts"], 1)
	assert.Equal(t, acc["id"], list["accounts"].([]any)[0].(map[string]any)["id"])
	code, keys, _ := request(t, "GET", again.url+"/api/v1/keys", token, nil)
	require.Equal(t, 200, code)
	require.Len(t, keys["keys"], 1)
	// The credentials still decrypt after a restart: rotating through PATCH reads them first.
	code, _, raw = request(t, "PATCH", again.url+"/api/v1/accounts/"+acc["id"].(string), token, map[string]any{"label": "renamed"})
	require.Equal(t, 200, code, raw)
	require.NoError(t, again.stop())
}

func TestServeSQLite(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "db", "relay.db")
	exerciseServe(t, map[string]string{"CODEX_RELAY_DATABASE_URL": db}, true)

	st, err := os.Stat(filepath.Join(dir, "db", secretKeyFile))
	require.NoError(t, err, "a secret key file is generated beside the SQLite database")
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	key, err := os.ReadFile(filepath.Join(dir, "db", secretKeyFile))
	require.NoError(t, err)

	// The stored credentials open with that key file and with nothing else.
	loc, err := store.ParseLocation(db)
	require.NoError(t, err)
	s, err := store.Open(context.Background(), loc, store.Options{SecretKey: []byte(strings.TrimSpace(string(key)))})
	require.NoError(t, err)
	defer s.Close()
	accounts, err := s.Accounts(context.Background())
	require.NoError(t, err)
	require.Len(t, accounts, 1)
	cred, err := s.Credentials(context.Background(), accounts[0].ID)
	require.NoError(t, err)
	assert.Equal(t, "sk-persist-me", cred.APIKey)
}

func TestServePostgres(t *testing.T) {
	url := storetest.PostgresURL(t)
	exerciseServe(t, map[string]string{
		"CODEX_RELAY_DATABASE_URL": url,
		"CODEX_RELAY_SECRET_KEY":   "a-postgres-secret-key-for-tests",
		"CODEX_RELAY_ADMIN_TOKEN":  "an-admin-token-from-the-env",
	}, false)
}

func TestServeRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"postgres without a secret key", map[string]string{"CODEX_RELAY_DATABASE_URL": "postgres://127.0.0.1:1/x"}, nil, "CODEX_RELAY_SECRET_KEY is required"},
		{"short secret key", map[string]string{"CODEX_RELAY_DATABASE_URL": filepath.Join(t.TempDir(), "r.db"), "CODEX_RELAY_SECRET_KEY": "short"}, nil, "at least 16"},
		{"unknown scheme", map[string]string{"CODEX_RELAY_DATABASE_URL": "mysql://x"}, nil, "unsupported scheme"},
		{"bad log format", map[string]string{}, []string{"serve", "-log-format", "xml"}, "log-format"},
		{"stray argument", map[string]string{}, []string{"serve", "extra"}, "unexpected argument"},
		{"bad retention", map[string]string{"CODEX_RELAY_RETENTION": "a month"}, nil, "CODEX_RELAY_RETENTION"},
		{"negative retention", map[string]string{}, []string{"serve", "-retention", "-1h"}, "-retention"},
		{"unknown command", map[string]string{}, []string{"frobnicate"}, "unknown command"},
		{"zero stream idle timeout", map[string]string{"CODEX_RELAY_STREAM_IDLE_TIMEOUT": "0s"}, nil, "CODEX_RELAY_STREAM_IDLE_TIMEOUT"},
		{"unknown client compression", map[string]string{"CODEX_RELAY_WS_COMPRESSION": "gzip"}, nil, "CODEX_RELAY_WS_COMPRESSION"},
		{"unknown upstream compression", map[string]string{}, []string{"serve", "-upstream-ws-compression", "yes"}, "want pooled, takeover or off"},
		{"zero compression threshold", map[string]string{"CODEX_RELAY_WS_COMPRESSION_THRESHOLD": "0"}, nil, "CODEX_RELAY_WS_COMPRESSION_THRESHOLD"},
		{"compression threshold not a number", map[string]string{}, []string{"serve", "-ws-compression-threshold", "1k"}, "size in bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut logbuf.Buffer
			err := run(context.Background(), tc.args, cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return tc.env[k] }})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHelpForEveryCommand(t *testing.T) {
	var out, errOut logbuf.Buffer
	require.NoError(t, run(context.Background(), []string{"--help"}, cli{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}))
	for name := range commands() {
		assert.Contains(t, out.String(), name)
		t.Run(name, func(t *testing.T) {
			var out, errOut logbuf.Buffer
			err := run(context.Background(), []string{name, "--help"}, cli{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
			assert.ErrorIs(t, err, flag.ErrHelp)
			assert.Contains(t, errOut.String(), "Usage: codex-relay "+name)
		})
	}
}

func TestMigrateCommand(t *testing.T) {
	db := filepath.Join(t.TempDir(), "m.db")
	var out, errOut logbuf.Buffer
	err := run(context.Background(), []string{"migrate", "-database-url", "sqlite:" + db}, cli{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
	require.NoError(t, err, errOut.String())
	assert.Regexp(t, `schema version (\d+) of (\d+)`, out.String())
	m := regexp.MustCompile(`version (\d+) of (\d+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m)
	assert.Equal(t, m[2], m[1], "fully migrated")
	_, err = os.Stat(filepath.Join(filepath.Dir(db), secretKeyFile))
	assert.ErrorIs(t, err, os.ErrNotExist, "migrate needs and makes no secret key")
}

// A console session survives a restart: its cookie is signed with a key
// derived from the secret key, not one made up per process.
func TestConsoleSessionSurvivesRestart(t *testing.T) {
	env := map[string]string{"CODEX_RELAY_DATABASE_URL": filepath.Join(t.TempDir(), "relay.db"), "CODEX_RELAY_ADMIN_TOKEN": "admin-token-for-the-console"}
	r := start(t, env)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(r.url + "/admin/login")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="_csrf" value="([^"]+)"`).FindSubmatch(page)
	require.NotNil(t, m, "%s", page)
	resp, err = client.PostForm(r.url+"/admin/login", url.Values{"token": {env["CODEX_RELAY_ADMIN_TOKEN"]}, "_csrf": {string(m[1])}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	signedIn := func(base string) int {
		resp, err := client.Get(base + "/admin/accounts")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, signedIn(r.url))
	require.NoError(t, r.stop())

	again := start(t, env)
	assert.Equal(t, http.StatusOK, signedIn(again.url), "the same session cookie works after a restart")
}

// Two replica processes of the real binary on one PostgreSQL, started as an
// operator starts them (environment only): a thread's requests alternate
// between them (a round-robin balancer), and the one not holding the
// thread's lane forwards to the one that does, so a single upstream lane
// carries the thread with deltas. Both stop cleanly on SIGTERM.
func TestTwoReplicaProcessesShareAThread(t *testing.T) {
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{{ID: "k1", Kind: sim.KindOpenAI, AccessToken: "sk-sim-k1"}}})
	t.Cleanup(upstream.Close)
	pg := storetest.PostgresURL(t)
	bin := buildBinary(t)
	const token = "admin-token-of-both"
	env := []string{"CODEX_RELAY_DATABASE_URL=" + pg, "CODEX_RELAY_SECRET_KEY=a-secret-the-replicas-share",
		"CODEX_RELAY_ADMIN_TOKEN=" + token, "CODEX_RELAY_LOG_LEVEL=info", "CODEX_RELAY_ADDR=127.0.0.1:0"}
	a := startProcess(t, bin, env)
	b := startProcess(t, bin, env)
	code, _, raw := request(t, "POST", a.url+"/api/v1/accounts", token, map[string]any{"label": "k1", "kind": "openai", "base_url": upstream.OpenAIBaseURL(), "api_key": "sk-sim-k1"})
	require.Equal(t, 201, code, raw)
	code, key, raw := request(t, "POST", b.url+"/api/v1/keys", token, map[string]any{"name": "codex"})
	require.Equal(t, 201, code, raw)

	var history []any
	for turn := range 4 {
		history = append(history, map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": fmt.Sprintf("turn %d", turn)}}})
		body, err := json.Marshal(map[string]any{"model": "gpt-5.4", "stream": true, "store": false, "input": history})
		require.NoError(t, err)
		base := []string{a.url, b.url}[turn%2]
		req, err := http.NewRequest(http.MethodPost, base+"/v1/responses", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key["key"].(string))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("session_id", "019a2222-0000-7000-8000-000000000001")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		sse, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(sse))
		m := regexp.MustCompile(`(?m)^event: response\.completed\ndata: (.*)$`).FindSubmatch(sse)
		require.NotNil(t, m, "turn %d ends completed: %s", turn, sse)
		var done struct {
			Response struct {
				Output []any `json:"output"`
			} `json:"response"`
		}
		require.NoError(t, json.Unmarshal(m[1], &done))
		history = append(history, done.Response.Output...)
	}
	recs := upstream.Requests(sim.RecordFilter{})
	require.Len(t, recs, 4)
	for i, r := range recs {
		assert.Equal(t, recs[0].ConnID, r.ConnID, "turn %d on the one lane", i)
		if i > 0 {
			assert.Equal(t, recs[i-1].ResponseID, r.PreviousResponseID, "turn %d went as a delta", i)
		}
	}
	code, reps, raw := request(t, "GET", a.url+"/api/v1/replicas", token, nil)
	require.Equal(t, 200, code, raw)
	assert.Len(t, reps["replicas"], 2, "each process registered")
	for _, p := range []*process{a, b} {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-p.done:
			assert.NoError(t, err, "a clean exit on SIGTERM")
		case <-time.After(30 * time.Second):
			t.Fatal("the process did not stop on SIGTERM")
		}
	}
}

// buildBinary builds codex-relay once per test run, with the race detector
// when the tests have it (so it reuses their compiled packages).
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "codex-relay")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds the binary for process tests")
	out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// process is a running codex-relay process.
type process struct {
	cmd    *exec.Cmd
	url    string
	stderr *logbuf.Buffer
	done   chan error
}

var listeningLine = regexp.MustCompile(`"msg":"codex-relay listening","addr":"([^"]+)"`)

// startProcess runs bin serve with env and waits until it listens; it is
// killed at the end of the test if still running.
func startProcess(t *testing.T, bin string, env []string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin), stderr: &logbuf.Buffer{}, done: make(chan error, 1)}
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("process log:\n%s", p.stderr.String())
		}
	})
	deadline := time.After(60 * time.Second)
	for {
		if m := listeningLine.FindStringSubmatch(p.stderr.String()); m != nil {
			p.url = "http://" + m[1]
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("codex-relay exited before listening: %v\n%s", err, p.stderr.String())
		case <-deadline:
			t.Fatalf("codex-relay did not listen within 60s:\n%s", p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
