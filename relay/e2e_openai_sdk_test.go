package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/store"
)

// The official OpenAI SDKs, as users' scripts call them, against the relay
// in front of the sim, over a ChatGPT account and an API-key account:
// Responses (JSON and stream), the model list, Chat Completions (JSON,
// stream, a tool round trip, the SDKs' own stream helpers) and an error.
// The scripts (testdata/openai-sdk) print what they saw as JSON lines.
//
// The JS SDK is the npm package openai pinned in package.json; the Python
// SDK is PyPI's openai in the virtual environment scripts/test.sh makes
// (test-output/openai-python, or CODEX_RELAY_OPENAI_PYTHON). Either missing
// skips, or fails with CODEX_RELAY_REQUIRE_E2E=1, unless
// CODEX_RELAY_OPENAI_PYTHON_UNAVAILABLE says why the Python SDK could not
// be installed on this machine (scripts/test.sh sets it when no Python
// package index answers).
func TestOpenAISDKs(t *testing.T) {
	t.Parallel()
	sdks := []struct {
		name string
		cmd  func(t *testing.T) []string
	}{
		{"js", nodeSDK},
		{"python", pythonSDK},
	}
	for _, sdk := range sdks {
		t.Run(sdk.name, func(t *testing.T) {
			t.Parallel()
			argv := sdk.cmd(t)
			for _, kind := range accountKinds {
				t.Run(kind.name, func(t *testing.T) {
					t.Parallel()
					h := newHarness(t, kind.account)
					_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "sdk"})
					require.NoError(t, err)
					lines := runSDK(t, argv, h.srv.URL+"/v1", key)
					checkSDKCases(t, lines)
					for _, rec := range h.responseRecords("") {
						assert.True(t, rec.Stream, "the upstream is always asked for a stream")
						assert.False(t, rec.ClientKey, "the client key never goes upstream")
					}
				})
			}
		})
	}
}

// sdkLine is one case's result as a script printed it.
type sdkLine struct {
	Case  string         `json:"case"`
	Error map[string]any `json:"error"`
	// Responses, chat.
	ID           string         `json:"id"`
	Object       string         `json:"object"`
	Status       string         `json:"status"`
	Text         string         `json:"text"`
	Last         string         `json:"last"`
	Role         string         `json:"role"`
	FinishReason string         `json:"finish_reason"`
	Usage        map[string]any `json:"usage"`
	Chunks       int            `json:"chunks"`
	// Models.
	IDs []string `json:"ids"`
	// Tools.
	Call                 sdkCall `json:"call"`
	StreamedFinishReason string  `json:"streamed_finish_reason"`
	StreamedCall         sdkCall `json:"streamed_call"`
	Answer               string  `json:"answer"`
}

type sdkCall struct {
	ID, Name, Arguments string
}

func checkSDKCases(t *testing.T, lines map[string]sdkLine) {
	t.Helper()
	ok := func(name string) sdkLine {
		t.Helper()
		l, found := lines[name]
		require.True(t, found, "case %s printed nothing", name)
		require.Nil(t, l.Error, "case %s failed: %v", name, l.Error)
		return l
	}
	r := ok("responses_json")
	assert.True(t, strings.HasPrefix(r.ID, "resp_"), r.ID)
	assert.Equal(t, "response", r.Object)
	assert.Equal(t, "completed", r.Status)
	assert.Equal(t, "Simulated reply to: Say hello.", r.Text, "the SDK's output_text")

	r = ok("responses_stream")
	assert.Equal(t, "Simulated reply to: Stream this.", r.Text)
	assert.Equal(t, "response.completed", r.Last)
	assert.True(t, strings.HasPrefix(r.ID, "resp_"), r.ID)

	r = ok("models_list")
	assert.Contains(t, r.IDs, "gpt-5.5-codex")

	r = ok("chat_json")
	assert.True(t, strings.HasPrefix(r.ID, "chatcmpl-"), r.ID)
	assert.Equal(t, "chat.completion", r.Object)
	assert.Equal(t, "Simulated reply to: Say hello.", r.Text)
	assert.Equal(t, "stop", r.FinishReason)
	assert.Positive(t, r.Usage["prompt_tokens"])
	assert.Positive(t, r.Usage["completion_tokens"])
	assert.Positive(t, r.Usage["total_tokens"])

	r = ok("chat_stream")
	assert.Equal(t, "Simulated reply to: Stream please.", r.Text)
	assert.Equal(t, "assistant", r.Role)
	assert.Equal(t, "stop", r.FinishReason)
	require.NotNil(t, r.Usage, "include_usage gave a usage chunk")
	assert.Positive(t, r.Usage["total_tokens"])
	assert.Greater(t, r.Chunks, 3)

	r = ok("chat_tools")
	assert.Equal(t, "tool_calls", r.FinishReason)
	assert.True(t, strings.HasPrefix(r.Call.ID, "call_"), r.Call.ID)
	assert.Equal(t, "get_weather", r.Call.Name)
	assert.JSONEq(t, `{"city":"Paris"}`, r.Call.Arguments)
	assert.Equal(t, "tool_calls", r.StreamedFinishReason)
	assert.Equal(t, "get_weather", r.StreamedCall.Name)
	assert.JSONEq(t, `{"city":"Paris"}`, r.StreamedCall.Arguments)
	assert.True(t, strings.HasPrefix(r.StreamedCall.ID, "call_"), r.StreamedCall.ID)
	assert.Equal(t, "Tool results:\nsunny, 24 degrees", r.Answer)

	e, found := lines["chat_error"]
	require.True(t, found)
	require.NotNil(t, e.Error, "an empty messages list is refused")
	assert.EqualValues(t, 400, e.Error["status"])
	assert.Equal(t, "BadRequestError", e.Error["name"])
	assert.Contains(t, e.Error["message"], "messages must hold at least one message")
	assert.Equal(t, "messages", e.Error["param"])
}

// runSDK runs a script against baseURL with key and returns its lines by
// case.
func runSDK(t *testing.T, argv []string, baseURL, key string) map[string]sdkLine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// Only what the SDK needs: no proxy, no user's OpenAI settings.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "OPENAI_BASE_URL=" + baseURL,
		"OPENAI_API_KEY=" + key, "MODEL=gpt-5.5-codex", "NO_PROXY=*", "PYTHONDONTWRITEBYTECODE=1"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	require.NoError(t, err, "%s\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), stdout.String(), stderr.String())
	lines := map[string]sdkLine{}
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var l sdkLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "%s", sc.Bytes())
		lines[l.Case] = l
	}
	if stderr.Len() > 0 {
		t.Logf("%s stderr:\n%s", argv[0], stderr.String())
	}
	return lines
}

// repoFile is the path of rel in the repository (the nearest folder above
// the working directory that holds go.mod).
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, rel)
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the working directory")
		dir = parent
	}
}

// missingSDK skips the test, or fails it when the suite requires every
// end-to-end client (CODEX_RELAY_REQUIRE_E2E=1) and nothing explains the
// absence.
func missingSDK(t *testing.T, what, explained string) {
	t.Helper()
	switch {
	case explained != "":
		t.Skipf("%s: %s", what, explained)
	case os.Getenv(codexcli.RequireEnv) == "1":
		t.Fatalf("%s (%s=1 requires it; run ./scripts/test.sh, which installs it)", what, codexcli.RequireEnv)
	default:
		t.Skipf("%s (./scripts/test.sh installs it)", what)
	}
}

// nodeSDK is the command that runs the JS SDK's script.
func nodeSDK(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(repoFile(t, filepath.Join("node_modules", "openai", "package.json"))); err != nil {
		missingSDK(t, "the OpenAI JS SDK is not installed (node_modules/openai)", "")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missingSDK(t, "node is not on the PATH", "")
	}
	return []string{node, repoFile(t, filepath.Join("relay", "testdata", "openai-sdk", "client.mjs"))}
}

// pythonSDK is the command that runs the Python SDK's script.
func pythonSDK(t *testing.T) []string {
	t.Helper()
	py := os.Getenv("CODEX_RELAY_OPENAI_PYTHON")
	if py == "" {
		py = repoFile(t, filepath.Join("test-output", "openai-python", "bin", "python"))
	}
	explained := os.Getenv("CODEX_RELAY_OPENAI_PYTHON_UNAVAILABLE")
	if _, err := os.Stat(py); err != nil {
		missingSDK(t, "the OpenAI Python SDK's virtual environment is missing ("+py+")", explained)
	}
	out, err := exec.Command(py, "-c", "import openai; print(openai.__version__)").CombinedOutput()
	var exitErr *exec.ExitError
	if err != nil && (errors.As(err, &exitErr) || errors.Is(err, exec.ErrNotFound)) {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		missingSDK(t, "the OpenAI Python SDK is not importable in "+py+": "+lines[len(lines)-1], explained)
	}
	require.NoError(t, err)
	t.Logf("openai (Python) %s", strings.TrimSpace(string(out)))
	return []string{py, repoFile(t, filepath.Join("relay", "testdata", "openai-sdk", "client.py"))}
}
