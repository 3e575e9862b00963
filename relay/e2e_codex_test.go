package relay_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// The real Codex CLI through the relay, over HTTP and over WebSocket: a plain
// turn and a tool-call turn, with the client's key never sent upstream and
// prompt_cache_key arriving unchanged.
func TestCodexThroughRelay(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ws       bool // Codex uses a WebSocket
		noBridge bool // the relay serves HTTP clients over upstream HTTP
		upstream sim.Transport
	}{
		{"http bridged", false, false, sim.TransportWS},
		{"http without bridge", false, true, sim.TransportHTTP},
		{"websocket", true, false, sim.TransportWS},
	} {
		ws := tc.ws
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.DisableBridge = tc.noBridge },
				simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("b1", "org-b"))
			ctx := context.Background()
			_, key, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "e2e"})
			require.NoError(t, err)
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: key})

			res, err := codex.Exec(ctx, "say hello", codexcli.RunOptions{})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
			assert.NotEmpty(t, res.FinalMessage)
			if ws {
				assert.Empty(t, res.WebSocketFallback(), "Codex must stay on WebSocket")
			}

			res, err = codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo relay-tool-ok"}]]`, codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
			assert.Contains(t, res.FinalMessage, "relay-tool-ok", "the tool ran and its output came back through the relay")
			if ws {
				assert.Empty(t, res.WebSocketFallback())
			}

			recs := h.responseRecords("")
			require.NotEmpty(t, recs)
			sawToolOutput := false
			for _, r := range recs {
				assert.False(t, r.ClientKey, "the relay client key must never reach the upstream")
				assert.Equal(t, tc.upstream, r.Transport)
				if r.SessionID != "" && r.PromptCacheKey != "" {
					assert.Equal(t, r.SessionID, r.PromptCacheKey, "prompt_cache_key is Codex's session id, forwarded unchanged")
				}
				for _, o := range r.ToolOutputs {
					if strings.Contains(o.Output, "relay-tool-ok") {
						sawToolOutput = true
					}
				}
			}
			assert.True(t, sawToolOutput, "the follow-up request carried the tool output upstream")

			reqs, total, err := h.store.Requests(ctx, store.RequestFilter{})
			require.NoError(t, err)
			assert.GreaterOrEqual(t, total, 3, "every request is logged")
			for _, r := range reqs {
				assert.NotEmpty(t, r.AccountID)
				assert.NotEmpty(t, r.ThreadID)
			}
		})
	}
}

// A resumed thread stays on its account even when the balancer would now
// prefer another one.
func TestCodexResumeStaysOnItsAccount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	setUsed := func(simID string, pct float64) {
		require.NoError(t, h.store.UpdateUsage(ctx, h.ids[simID], store.Window{UsedPercent: pct, WindowMinutes: 300,
			ResetAt: time.Now().Add(time.Hour), Known: true}, store.Window{}))
	}
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused"})

	setUsed("a2", 90) // the first thread goes to a1
	first, err := codex.Exec(ctx, "remember the word teal", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, first.Stderr)
	require.NotEmpty(t, first.ThreadID)
	recs := h.responseRecords(first.ThreadID)
	require.NotEmpty(t, recs)
	require.Equal(t, "a1", recs[0].Account)

	setUsed("a1", 90) // now the balancer prefers a2...
	setUsed("a2", 0)
	other, err := codex.Exec(ctx, "a new conversation", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, other.ExitCode, other.Stderr)
	otherRecs := h.responseRecords(other.ThreadID)
	require.NotEmpty(t, otherRecs)
	require.Equal(t, "a2", otherRecs[0].Account, "precondition: a new thread goes to a2 now")

	// ...but the resumed thread stays where its history is.
	setUsed("a1", 90)
	resumed, err := codex.Resume(ctx, first.ThreadID, "what was the word?", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)
	all := h.responseRecords(first.ThreadID)
	require.Greater(t, len(all), len(recs), "the resume reached the upstream")
	for _, r := range all {
		assert.Equal(t, "a1", r.Account, "every request of the resumed thread stayed on its account")
	}
}

// Codex over WebSocket, an upstream without a WebSocket endpoint: the relay
// answers the prewarm itself, sends every request in full over HTTP
// (rebuilt from continuity where Codex chains), and relays the events as
// frames. Codex never notices, and never leaves its WebSocket.
func TestCodexWebSocketToAnHTTPOnlyUpstream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultRefuseWebSocket, Status: 404})
	require.NoError(t, err)
	ctx := context.Background()
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: true, Key: "unused"})
	res, err := codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo http-only-ok"}]]`, codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Empty(t, res.WebSocketFallback())
	assert.Contains(t, res.FinalMessage, "http-only-ok")
	resumed, err := codex.Resume(ctx, res.ThreadID, "more", codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)

	recs := h.responseRecords(res.ThreadID)
	require.GreaterOrEqual(t, len(recs), 3)
	for _, r := range recs {
		assert.Equal(t, sim.TransportHTTP, r.Transport)
		assert.Empty(t, r.PreviousResponseID, "full requests: an HTTP upstream holds no chain")
		if r.Generate != nil {
			assert.True(t, *r.Generate, "the prewarm never reached the upstream")
		}
	}
	logged, _, err := h.store.Requests(ctx, store.RequestFilter{ThreadID: res.ThreadID})
	require.NoError(t, err)
	require.NotEmpty(t, logged)
	for _, r := range logged {
		assert.Equal(t, "ws", r.Transport, "every request reached the relay over Codex's WebSocket")
		assert.Equal(t, http.StatusOK, r.Status, "no request failed on the way")
	}
}

// The real Codex CLI against an upstream that keeps no chains, over both
// transports: tool-call turns complete, the client never sees a refusal.
func TestCodexAgainstAStatelessUpstream(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a")}, Stateless: true}, func(*harness, *relay.Config) {})
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused"})
			res, err := codex.Exec(context.Background(), `run it [[sim:tool exec_command {"cmd":"echo stateless-ok"}]]`, codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, res.Stderr)
			assert.Contains(t, res.FinalMessage, "stateless-ok")
			assert.Empty(t, res.WebSocketFallback())
			logged, _, err := h.store.Requests(context.Background(), store.RequestFilter{ThreadID: res.ThreadID})
			require.NoError(t, err)
			for _, r := range logged {
				assert.Equal(t, http.StatusOK, r.Status, "no request failed on the way")
			}
		})
	}
}
