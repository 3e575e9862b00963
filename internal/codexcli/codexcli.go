// Package codexcli runs the real Codex CLI (the pinned npm package in
// node_modules) in tests: it finds the binary, writes a CODEX_HOME whose
// config.toml points Codex at a given base URL, runs `codex exec` with a
// scrubbed environment and a deadline, and parses its JSONL events.
//
// Tests that need Codex call New, which skips the test when the binary is
// missing, unless CODEX_RELAY_REQUIRE_E2E=1 (set by the suite's test
// command), which makes a missing binary a failure.
package codexcli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/codexrelay/codex-relay/internal/codexauth"
)

// RequireEnv is the environment variable that turns a missing Codex binary
// from a skip into a failure.
const RequireEnv = "CODEX_RELAY_REQUIRE_E2E"

// DefaultEnvKey is the variable Codex reads the bearer token from.
const DefaultEnvKey = "CODEX_RELAY_KEY"

// DefaultTimeout bounds one Codex run when the caller's context has no
// earlier deadline.
const DefaultTimeout = 2 * time.Minute

// Provider is where Codex is pointed: the model provider block of its
// config.toml and the key it sends.
type Provider struct {
	// BaseURL is the provider's base_url; Codex calls {BaseURL}/responses.
	BaseURL string
	// WebSockets sets supports_websockets.
	WebSockets bool
	// Key is the bearer token, passed in the EnvKey variable.
	Key string
	// EnvKey is the variable name; default DefaultEnvKey.
	EnvKey string
	// Model is the model slug; default gpt-5.5-codex (unknown to Codex's
	// catalog, so it offers exec_command with {"cmd": ...}).
	Model string
	// Headers are static http_headers sent on every request (for example
	// ChatGPT-Account-Id when pointing Codex straight at a ChatGPT backend).
	Headers map[string]string
	// RequestMaxRetries and StreamMaxRetries, when set, bound Codex's own
	// retries (request_max_retries, stream_max_retries), so a fault test
	// does not wait through thirty retries.
	RequestMaxRetries *int
	StreamMaxRetries  *int
	// StreamIdleTimeout, when positive, is stream_idle_timeout_ms.
	StreamIdleTimeout time.Duration
	// Name is the provider's name; default "relay". Codex compacts remotely
	// (a request whose input ends in compaction_trigger, answered with one
	// compaction item) only for a provider named "OpenAI"; for any other it
	// summarises the history itself with an ordinary request.
	Name string
	// ModelContextWindow and AutoCompactTokenLimit, when positive, are
	// model_context_window and model_auto_compact_token_limit: small values
	// drive Codex past its auto-compaction threshold.
	ModelContextWindow    int
	AutoCompactTokenLimit int
	// ChatGPTLogin makes Codex believe it is signed in with ChatGPT, as a
	// Codex Desktop or IDE user is: the provider says requires_openai_auth
	// instead of env_key, and CODEX_HOME gets an auth.json whose access
	// token is Key (the relay's client key) and whose ID token is an
	// unsigned JWT naming a Plus plan. Codex then offers what only a ChatGPT
	// login gets (its image tool, the usage and analytics calls) and sends
	// them to ChatGPTBaseURL (chatgpt_base_url). Codex never verifies the ID
	// token's signature; a token refresh would go to a dead loopback port.
	ChatGPTLogin   bool
	ChatGPTBaseURL string
	// CACertFile, when set, is a PEM file of the certificate authority
	// Codex trusts beside the system's (CODEX_CA_CERTIFICATE): a ChatGPT
	// login's chatgpt_base_url must be HTTPS, so such a test serves the
	// relay over TLS with a certificate of its own.
	CACertFile string
}

// ChatGPTAccountID is the ChatGPT-Account-Id a ChatGPTLogin Codex sends.
const ChatGPTAccountID = codexauth.Workspace

// Codex is one configured Codex installation for a test: the binary, a
// CODEX_HOME and a working directory. Runs are sequential by nature (one
// CODEX_HOME), but Codex values are independent of each other.
type Codex struct {
	// Binary is the path of node_modules/.bin/codex (or of the previous
	// pin's, see NewPrevious).
	Binary string
	// Home is the CODEX_HOME folder, under <repo>/test-output/ (or the user's
	// cache folder when the checkout is under the temp dir).
	Home string
	// Dir is the working directory of every run.
	Dir string
	// UserHome is the HOME of every run: an empty folder of its own, so the
	// shell Codex runs its tools in starts clean, whatever the machine's
	// dotfiles do (a version manager's start-up hooks, under the load of a
	// parallel test run, made tool calls time out).
	UserHome string

	envKey string
	key    string
	caCert string
}

// New prepares Codex for test t: it locates the binary (skipping or failing
// the test when it is missing, see RequireEnv), writes CODEX_HOME under
// <repo>/test-output/codex-home-* with the provider's config.toml, makes a
// temporary working directory, and removes both when the test ends.
func New(t testing.TB, p Provider) *Codex {
	t.Helper()
	return newWith(t, p, Binary)
}

// NewPrevious is New with the previous pinned Codex CLI (package.json's
// codex-previous): the smoke set runs on it too, so a regression on
// either shows.
func NewPrevious(t testing.TB, p Provider) *Codex {
	t.Helper()
	return newWith(t, p, PreviousBinary)
}

func newWith(t testing.TB, p Provider, binary func() (string, error)) *Codex {
	t.Helper()
	bin, err := binary()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("codexcli: %v (%s=1 requires it; run `npm ci`)", err, RequireEnv)
		}
		t.Skipf("codexcli: %v (run `npm ci` to install the Codex CLI)", err)
	}
	out, err := homesDir()
	if err != nil {
		t.Fatalf("codexcli: %v", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatalf("codexcli: %v", err)
	}
	home, err := os.MkdirTemp(out, "codex-home-*")
	if err != nil {
		t.Fatalf("codexcli: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(home) })
	if p.EnvKey == "" {
		p.EnvKey = DefaultEnvKey
	}
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(ConfigTOML(p)), 0o600); err != nil {
		t.Fatalf("codexcli: write config.toml: %v", err)
	}
	if p.ChatGPTLogin {
		auth, err := AuthJSON(p.Key, time.Now())
		if err == nil {
			err = os.WriteFile(filepath.Join(home, "auth.json"), auth, 0o600)
		}
		if err != nil {
			t.Fatalf("codexcli: write auth.json: %v", err)
		}
	}
	userHome := filepath.Join(home, "user-home")
	if err := os.Mkdir(userHome, 0o700); err != nil {
		t.Fatalf("codexcli: %v", err)
	}
	return &Codex{Binary: bin, Home: home, Dir: t.TempDir(), UserHome: userHome, envKey: p.EnvKey, key: p.Key, caCert: p.CACertFile}
}

// ConfigTOML renders the config.toml for p: the provider is named "relay"
// unless p names it (not "OpenAI" by default, which would switch on remote
// compaction), update checks and analytics are off.
func ConfigTOML(p Provider) string {
	model := p.Model
	if model == "" {
		model = "gpt-5.5-codex"
	}
	envKey := p.EnvKey
	if envKey == "" {
		envKey = DefaultEnvKey
	}
	name := p.Name
	if name == "" {
		name = "relay"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "model = %s\n", strconv.Quote(model))
	b.WriteString("model_provider = \"relay\"\n")
	b.WriteString("check_for_update_on_startup = false\n")
	if p.ModelContextWindow > 0 {
		fmt.Fprintf(&b, "model_context_window = %d\n", p.ModelContextWindow)
	}
	if p.AutoCompactTokenLimit > 0 {
		fmt.Fprintf(&b, "model_auto_compact_token_limit = %d\n", p.AutoCompactTokenLimit)
	}
	if p.ChatGPTBaseURL != "" {
		fmt.Fprintf(&b, "chatgpt_base_url = %s\n", strconv.Quote(p.ChatGPTBaseURL))
	}
	b.WriteString("\n[analytics]\nenabled = false\n\n")
	b.WriteString("[model_providers.relay]\n")
	fmt.Fprintf(&b, "name = %s\n", strconv.Quote(name))
	fmt.Fprintf(&b, "base_url = %s\n", strconv.Quote(p.BaseURL))
	b.WriteString("wire_api = \"responses\"\n")
	if p.ChatGPTLogin {
		b.WriteString("requires_openai_auth = true\n")
	} else {
		fmt.Fprintf(&b, "env_key = %s\n", strconv.Quote(envKey))
	}
	fmt.Fprintf(&b, "supports_websockets = %t\n", p.WebSockets)
	if p.RequestMaxRetries != nil {
		fmt.Fprintf(&b, "request_max_retries = %d\n", *p.RequestMaxRetries)
	}
	if p.StreamMaxRetries != nil {
		fmt.Fprintf(&b, "stream_max_retries = %d\n", *p.StreamMaxRetries)
	}
	if p.StreamIdleTimeout > 0 {
		fmt.Fprintf(&b, "stream_idle_timeout_ms = %d\n", p.StreamIdleTimeout.Milliseconds())
	}
	if len(p.Headers) > 0 {
		b.WriteString("\n[model_providers.relay.http_headers]\n")
		for _, k := range slices.Sorted(maps.Keys(p.Headers)) {
			fmt.Fprintf(&b, "%s = %s\n", strconv.Quote(k), strconv.Quote(p.Headers[k]))
		}
	}
	return b.String()
}

// RunOptions adjusts one run.
type RunOptions struct {
	// BypassSandbox passes --dangerously-bypass-approvals-and-sandbox, so a
	// scripted exec_command runs without depending on the sandbox.
	BypassSandbox bool
	// Timeout bounds the run; default DefaultTimeout (an earlier deadline of
	// the context wins).
	Timeout time.Duration
}

// Exec runs `codex exec --skip-git-repo-check --json PROMPT </dev/null`.
func (c *Codex) Exec(ctx context.Context, prompt string, o RunOptions) (*Result, error) {
	return c.run(ctx, o, "exec", prompt)
}

// Resume runs `codex exec resume ... THREAD PROMPT`, which resends the whole
// history of the thread with the same session and thread ids.
func (c *Codex) Resume(ctx context.Context, threadID, prompt string, o RunOptions) (*Result, error) {
	return c.run(ctx, o, "exec", "resume", threadID, prompt)
}

func (c *Codex) run(ctx context.Context, o RunOptions, args ...string) (*Result, error) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Flags go right after the subcommand words, before the positionals.
	var words, positional []string
	for i, a := range args {
		if a != "exec" && a != "resume" {
			positional = args[i:]
			break
		}
		words = append(words, a)
	}
	argv := append(words, "--skip-git-repo-check", "--json")
	if o.BypassSandbox {
		argv = append(argv, "--dangerously-bypass-approvals-and-sandbox")
	}
	argv = append(argv, positional...)

	cmd := exec.CommandContext(ctx, c.Binary, argv...)
	cmd.Dir = c.Dir
	cmd.Env = c.env()
	cmd.Stdin = nil // /dev/null: without it Codex waits to read standard input
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	configureProcess(cmd)
	cmd.WaitDelay = 5 * time.Second

	start := time.Now()
	err := cmd.Run()
	reapProcessGroup(cmd)
	res := &Result{Stdout: stdout.String(), Stderr: stderr.String(), Duration: time.Since(start), ExitCode: -1}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	res.parse()
	if ctx.Err() != nil {
		return res, fmt.Errorf("codex %s: %w (stderr: %s)", strings.Join(words, " "), ctx.Err(), tail(res.Stderr, 2000))
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return res, fmt.Errorf("codex %s: %w", strings.Join(words, " "), err)
	}
	return res, nil
}

// Env is the environment a run of Codex gets (see env), for a test that
// starts Codex itself (the interactive TUI under tmux).
func (c *Codex) Env() []string { return c.env() }

// env is the whole environment of a run: nothing of the test process leaks
// in (no OPENAI_API_KEY, no proxy settings, not the user's home), only what
// Codex needs. The token refresh and revocation URLs point at a dead
// loopback port, so a ChatGPT login's refresh, were Codex to try one, could
// not leave the machine.
func (c *Codex) env() []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + c.UserHome,
		"CODEX_HOME=" + c.Home,
		c.envKey + "=" + c.key,
		"CODEX_REFRESH_TOKEN_URL_OVERRIDE=" + deadURL + "/oauth/token",
		"CODEX_REVOKE_TOKEN_URL_OVERRIDE=" + deadURL + "/oauth/revoke",
	}
	if c.caCert != "" {
		env = append(env, "CODEX_CA_CERTIFICATE="+c.caCert)
	}
	return env
}

// deadURL is a loopback address nothing listens on (the discard port).
const deadURL = "http://127.0.0.1:9"

// AuthJSON is the auth.json of a ChatGPT login whose access token is
// token: codexauth's, which `codex-relay keys codex-auth` prints.
func AuthJSON(token string, now time.Time) ([]byte, error) { return codexauth.AuthJSON(token, now) }

// Event is one JSONL event of `codex exec --json`.
type Event struct {
	Type string          `json:"type"`
	Raw  json.RawMessage `json:"-"`
}

// Result is what one run produced.
type Result struct {
	ExitCode int
	Stdout   string
	Stderr   string
	Duration time.Duration
	// Events are the JSONL events of stdout, in order; lines that are not
	// JSON objects are skipped.
	Events []Event
	// ThreadID is the thread_id of the thread.started event.
	ThreadID string
	// FinalMessage is the text of the last agent_message item.
	FinalMessage string
	// Errors are the messages of error and turn.failed events.
	Errors []string
	// Commands are the command_execution items that completed, with their
	// output: proof that a scripted tool call really ran.
	Commands []Command
}

// Command is one completed command_execution item.
type Command struct {
	Command  string `json:"command"`
	Output   string `json:"aggregated_output"`
	ExitCode *int   `json:"exit_code"`
}

func (r *Result) parse() {
	sc := bufio.NewScanner(strings.NewReader(r.Stdout))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			ThreadID string `json:"thread_id"`
			Message  string `json:"message"`
			Error    *struct {
				Message string `json:"message"`
			} `json:"error"`
			Item *struct {
				Type string `json:"type"`
				Text string `json:"text"`
				Command
			} `json:"item"`
		}
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		r.Events = append(r.Events, Event{Type: ev.Type, Raw: json.RawMessage(bytes.Clone(line))})
		switch ev.Type {
		case "thread.started":
			r.ThreadID = ev.ThreadID
		case "error":
			r.Errors = append(r.Errors, ev.Message)
		case "turn.failed":
			if ev.Error != nil {
				r.Errors = append(r.Errors, ev.Error.Message)
			}
		case "item.completed":
			if ev.Item == nil {
				continue
			}
			switch ev.Item.Type {
			case "agent_message":
				r.FinalMessage = ev.Item.Text
			case "command_execution":
				r.Commands = append(r.Commands, ev.Item.Command)
			}
		}
	}
}

// Fallback strings: the only trace of a WebSocket session that fell back to
// HTTP is one of these lines on stderr.
var webSocketFailures = []string{
	"failed to connect to Responses WebSocket",
	"Falling back from WebSockets to HTTPS transport",
}

// WebSocketFallback returns the stderr line showing that Codex could not use
// the WebSocket (and fell back to HTTP), or "" when there is none.
func (r *Result) WebSocketFallback() string {
	for _, line := range strings.Split(r.Stderr, "\n") {
		for _, s := range webSocketFailures {
			if strings.Contains(line, s) {
				return line
			}
		}
	}
	return ""
}

// RequireWebSocket fails the test when the run shows a WebSocket failure
// or fallback.
func RequireWebSocket(t testing.TB, r *Result) {
	t.Helper()
	if line := r.WebSocketFallback(); line != "" {
		t.Fatalf("codex did not stay on the WebSocket: %s", line)
	}
}

// RequireSuccess fails the test, showing Codex's output, unless the run
// exited 0.
func RequireSuccess(t testing.TB, r *Result) {
	t.Helper()
	if r.ExitCode != 0 {
		t.Fatalf("codex exited %d\nerrors: %q\nstdout:\n%s\nstderr:\n%s", r.ExitCode, r.Errors, tail(r.Stdout, 4000), tail(r.Stderr, 4000))
	}
}

// Binary returns the path of node_modules/.bin/codex (the newest pinned
// Codex CLI) in the working directory or the nearest folder above it that
// has one.
func Binary() (string, error) { return findUp(filepath.Join("node_modules", ".bin", "codex")) }

// PreviousBinary returns the path of the previous pinned Codex CLI,
// installed under the alias codex-previous.
func PreviousBinary() (string, error) {
	return findUp(filepath.Join("node_modules", "codex-previous", "bin", "codex.js"))
}

// findUp returns the path of the file rel in the working directory or the
// nearest folder above it that has one.
func findUp(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New(rel + " not found in the working directory or above")
		}
		dir = parent
	}
}

// repoRoot returns the nearest folder at or above the working directory
// that holds go.mod.
// homesDir is where CODEX_HOME folders go: <repo>/test-output, unless the
// checkout itself lies under the system temp folder (CI may clone there),
// where Codex refuses to create its helper binaries; then the user's cache
// folder.
func homesDir() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "test-output")
	if !underTempDir(dir) {
		return dir, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil || underTempDir(cache) {
		home, herr := os.UserHomeDir()
		if herr != nil {
			return "", fmt.Errorf("no folder outside the temp dir for CODEX_HOME: %v", herr)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "codex-relay-tests"), nil
}

func underTempDir(p string) bool {
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		tmp = os.TempDir()
	}
	if rp, err := filepath.EvalSymlinks(p); err == nil {
		p = rp
	} else if rp, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		p = filepath.Join(rp, filepath.Base(p))
	}
	rel, err := filepath.Rel(tmp, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found in the working directory or above")
		}
		dir = parent
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
