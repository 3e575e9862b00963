package relay_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// appServerClient is the name the test's JSON-RPC client gives itself in
// initialize; Codex sends it upstream as the originator, as it sends
// codex_vscode for the IDE extension.
const appServerClient = "codex_relay_e2e"

// Codex Desktop and the IDE extension drive `codex app-server`, reading the
// same config.toml as the CLI: here README's block for them. Through the relay, over HTTP and over
// WebSocket: a thread, a turn whose answer calls a tool (the approval
// request, if Codex asks, answered over JSON-RPC), the turn's completion
// with the tool's output; then the thread resumed in a new app-server
// process, whose turn reaches the thread's account although the balancer
// would now prefer the other one.
func TestCodexAppServerThroughRelay(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			_, key, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "desktop"})
			require.NoError(t, err)
			setUsed := func(simID string, pct float64) {
				require.NoError(t, h.store.UpdateUsage(ctx, h.ids[simID], store.Window{UsedPercent: pct, WindowMinutes: 300,
					ResetAt: time.Now().Add(time.Hour), Known: true}, store.Window{}))
			}
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: key})
			writeREADMEDesktopConfig(t, codex.Home, h.codexBaseURL(), ws)

			setUsed("a2", 90) // the new thread goes to a1
			first := codex.StartAppServer(t, nil)
			_, err = first.Initialize(ctx, appServerClient)
			require.NoError(t, err)
			threadID := startThread(ctx, t, first, codex.Dir)
			turn := runTurn(ctx, t, first, threadID, `run it [[sim:tool exec_command {"cmd":"echo appserver-tool-ok"}]]`)
			assert.Equal(t, "completed", turn.status, "turn error: %s", turn.errorMessage)
			require.NotEmpty(t, turn.commands, "the tool call ran as a commandExecution item")
			assert.Contains(t, turn.commands[0].output, "appserver-tool-ok", "the command ran and its output was captured")
			assert.Contains(t, turn.agentText, "appserver-tool-ok", "the tool's output went upstream and the answer quotes it")
			if ws {
				codexcli.RequireWebSocket(t, &codexcli.Result{Stderr: first.Stderr()})
			}
			first.Close()

			recs := h.responseRecords(threadID)
			require.NotEmpty(t, recs, "the thread's requests reached the upstream with its thread-id")
			sawToolOutput := false
			for _, r := range recs {
				assert.Equal(t, "a1", r.Account, "precondition: the thread lives on a1")
				assert.False(t, r.ClientKey, "the client key never reaches the upstream")
				assert.Equal(t, appServerClient, r.Originator, "the app-server's client name arrives as the originator")
				for _, o := range r.ToolOutputs {
					sawToolOutput = sawToolOutput || strings.Contains(o.Output, "appserver-tool-ok")
				}
			}
			assert.True(t, sawToolOutput, "the follow-up request carried the tool output upstream")

			// The balancer now prefers a2; the resumed thread stays on a1.
			setUsed("a1", 90)
			setUsed("a2", 0)
			second := codex.StartAppServer(t, nil)
			_, err = second.Initialize(ctx, appServerClient)
			require.NoError(t, err)
			other := startThread(ctx, t, second, codex.Dir)
			turn = runTurn(ctx, t, second, other, "a new conversation")
			require.Equal(t, "completed", turn.status, "turn error: %s", turn.errorMessage)
			otherRecs := h.responseRecords(other)
			require.NotEmpty(t, otherRecs)
			require.Equal(t, "a2", otherRecs[0].Account, "precondition: a new thread goes to a2 now")
			res, err := second.Call(ctx, "thread/resume", map[string]any{"threadId": threadID})
			require.NoError(t, err)
			var resumed struct {
				Thread struct {
					ID string `json:"id"`
				} `json:"thread"`
			}
			require.NoError(t, json.Unmarshal(res, &resumed))
			require.Equal(t, threadID, resumed.Thread.ID)
			turn = runTurn(ctx, t, second, threadID, "what did it print?")
			assert.Equal(t, "completed", turn.status, "turn error: %s", turn.errorMessage)
			assert.Contains(t, turn.agentText, "what did it print?")
			second.Close()

			all := h.responseRecords(threadID)
			require.Greater(t, len(all), len(recs), "the resumed turn reached the upstream")
			for _, r := range all[len(recs):] {
				assert.Equal(t, "a1", r.Account, "the resumed thread's requests reached its account")
				assert.Equal(t, threadID, r.ThreadID)
				if ws {
					assert.Equal(t, sim.TransportWS, r.Transport)
				}
			}
			logged, _, err := h.store.Requests(ctx, store.RequestFilter{ThreadID: threadID})
			require.NoError(t, err)
			require.NotEmpty(t, logged, "the relay logged the thread's requests")
			for _, r := range logged {
				assert.Equal(t, h.ids["a1"], r.AccountID)
			}
		})
	}
}

// Image generation from Codex Desktop through the relay: Codex 0.171.0
// offers its image tool (namespace image_gen) only with a ChatGPT login, and
// when the model calls it posts {base_url}/images/generations itself (see
// docs/PROTOCOL.md, "Every route Codex calls"). The app-server, signed in
// with ChatGPT whose token is the relay's client key, runs a turn whose
// model calls the tool: the turn shows an image generation item, the image
// comes back to the model, and the relay made it on the thread's account
// and logged it on the thread.
func TestCodexAppServerImageGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	priceImages(ctx, t, h)
	_, key, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "desktop"})
	require.NoError(t, err)
	codex := chatGPTCodexTLS(t, h, key)
	app := codex.StartAppServer(t, nil)
	_, err = app.Initialize(ctx, appServerClient)
	require.NoError(t, err)
	threadID := startThread(ctx, t, app, codex.Dir)
	turn := runTurn(ctx, t, app, threadID, imagePrompt)
	assert.Equal(t, "completed", turn.status, "turn error: %s", turn.errorMessage)
	assert.Contains(t, turn.itemTypes, "imageGeneration", "the turn shows the image generation (items: %v)", turn.itemTypes)
	assert.Contains(t, turn.agentText, "[input_image]", "the image went back to the model")

	rows, _, err := h.store.Requests(ctx, store.RequestFilter{ThreadID: threadID})
	require.NoError(t, err)
	var routes []string
	for _, r := range rows {
		routes = append(routes, r.Route)
		if r.Route == "images.generations" {
			assert.Equal(t, h.ids["a1"], r.AccountID)
			assert.Equal(t, int64(imagePrice), r.CostNanos)
		}
	}
	assert.Contains(t, routes, "images.generations", "the image is on the thread's page of the request log")
	recs := h.sim.Records(sim.RecordFilter{Route: sim.RouteImagesGenerations})
	require.Len(t, recs, 1)
	assert.Equal(t, appServerClient, recs[0].Originator, "Codex's own request, with the app-server client's originator")
}

// readmeDesktopBaseURL is the relay address README's Desktop block names.
const readmeDesktopBaseURL = `base_url = "http://127.0.0.1:2455/backend-api/codex"`

// writeREADMEDesktopConfig makes README's config block for Codex Desktop and
// the IDE extension the CODEX_HOME's config.toml, as written but for the
// relay's address, the transport (the block says WebSocket) and what keeps
// a test quiet (no update check, no analytics).
func writeREADMEDesktopConfig(t *testing.T, home, baseURL string, ws bool) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n### Codex Desktop and the IDE extension\n")
	require.True(t, ok, "README has a section for Codex Desktop and the IDE extension")
	m := regexp.MustCompile("(?s)```toml\n(.*?)```").FindStringSubmatch(section)
	require.NotNil(t, m, "the section has a toml block")
	block := m[1]
	require.Contains(t, block, readmeDesktopBaseURL)
	require.Contains(t, block, `env_key = "`+codexcli.DefaultEnvKey+`"`, "the block reads the key the test passes")
	block = strings.Replace(block, readmeDesktopBaseURL, `base_url = "`+baseURL+`"`, 1)
	if !ws {
		block = strings.Replace(block, "supports_websockets = true", "supports_websockets = false", 1)
	}
	cfg := "check_for_update_on_startup = false\n" + block + "\n[analytics]\nenabled = false\n"
	require.NoError(t, os.WriteFile(filepath.Join(home, "config.toml"), []byte(cfg), 0o600))
}

// startThread starts a thread that runs tools without asking (approval
// policy never, full access: the sandbox may be unusable on the test
// machine) in dir, and returns its id.
func startThread(ctx context.Context, t *testing.T, s *codexcli.AppServer, dir string) string {
	t.Helper()
	res, err := s.Call(ctx, "thread/start", map[string]any{
		"cwd": dir, "approvalPolicy": "never", "sandbox": "danger-full-access",
	})
	require.NoError(t, err)
	var started struct {
		Thread struct {
			ID string `json:"id"`
		} `json:"thread"`
	}
	require.NoError(t, json.Unmarshal(res, &started))
	require.NotEmpty(t, started.Thread.ID, "thread/start answered %s", res)
	return started.Thread.ID
}

// turnOutcome is what one turn produced, read from its notifications.
type turnOutcome struct {
	status       string // turn/completed's turn.status
	errorMessage string
	agentText    string // the text of the agentMessage items, joined
	commands     []turnCommand
	itemTypes    []string // the type of every completed item, in order
}

type turnCommand struct {
	command string
	output  string
}

// runTurn starts a turn with prompt and reads notifications until the
// turn's turn/completed.
func runTurn(ctx context.Context, t *testing.T, s *codexcli.AppServer, threadID, prompt string) turnOutcome {
	t.Helper()
	res, err := s.Call(ctx, "turn/start", map[string]any{
		"threadId": threadID,
		"input":    []any{map[string]any{"type": "text", "text": prompt}},
	})
	require.NoError(t, err)
	var started struct {
		Turn struct {
			ID string `json:"id"`
		} `json:"turn"`
	}
	require.NoError(t, json.Unmarshal(res, &started))
	require.NotEmpty(t, started.Turn.ID, "turn/start answered %s", res)

	done, before, err := s.Wait(ctx, func(n codexcli.Notification) bool {
		if n.Method != "turn/completed" {
			return false
		}
		var p struct {
			ThreadID string `json:"threadId"`
			Turn     struct {
				ID string `json:"id"`
			} `json:"turn"`
		}
		return json.Unmarshal(n.Params, &p) == nil && p.ThreadID == threadID && p.Turn.ID == started.Turn.ID
	})
	require.NoError(t, err)
	var completed struct {
		Turn struct {
			Status string `json:"status"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		} `json:"turn"`
	}
	require.NoError(t, json.Unmarshal(done.Params, &completed))
	out := turnOutcome{status: completed.Turn.Status}
	if completed.Turn.Error != nil {
		out.errorMessage = completed.Turn.Error.Message
	}
	var texts []string
	for _, n := range before {
		if n.Method != "item/completed" {
			continue
		}
		var p struct {
			ThreadID string `json:"threadId"`
			TurnID   string `json:"turnId"`
			Item     struct {
				Type             string `json:"type"`
				Text             string `json:"text"`
				Command          string `json:"command"`
				AggregatedOutput string `json:"aggregatedOutput"`
			} `json:"item"`
		}
		if json.Unmarshal(n.Params, &p) != nil || p.ThreadID != threadID || p.TurnID != started.Turn.ID {
			continue
		}
		out.itemTypes = append(out.itemTypes, p.Item.Type)
		switch p.Item.Type {
		case "agentMessage":
			texts = append(texts, p.Item.Text)
		case "commandExecution":
			out.commands = append(out.commands, turnCommand{command: p.Item.Command, output: p.Item.AggregatedOutput})
		}
	}
	out.agentText = strings.Join(texts, "\n")
	return out
}
