package sim

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// TestCodexAgainstTheSim points the real Codex CLI straight at the sim, on
// both flavours and both transports, for a plain turn and a turn whose
// scripted tool call Codex really runs.
func TestCodexAgainstTheSim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		account string
		ws      bool
	}{
		{"chatgpt backend over websocket", "a1", true},
		{"chatgpt backend over http", "a1", false},
		{"responses api over websocket", "k1", true},
		{"responses api over http", "k1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{})
			st, _ := upstream.Account(tt.account)
			p := codexcli.Provider{BaseURL: upstream.OpenAIBaseURL(), WebSockets: tt.ws, Key: st.AccessToken}
			if st.Kind == KindChatGPT {
				p.BaseURL = upstream.CodexBaseURL()
				p.Headers = map[string]string{"ChatGPT-Account-Id": st.ChatGPTAccountID}
			}
			cx := codexcli.New(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			want := TransportHTTP
			if tt.ws {
				want = TransportWS
			}

			// A plain turn.
			res, err := cx.Exec(ctx, "say hello", codexcli.RunOptions{})
			require.NoError(t, err)
			codexcli.RequireSuccess(t, res)
			if tt.ws {
				codexcli.RequireWebSocket(t, res)
			}
			require.NotEmpty(t, res.ThreadID)
			assert.Equal(t, "Simulated reply to: say hello", res.FinalMessage)
			turns := generating(upstream.Requests(RecordFilter{ThreadID: res.ThreadID}))
			require.Len(t, turns, 1)
			assertTransport(t, upstream, res.ThreadID, want)
			assert.Equal(t, tt.account, turns[0].Account)
			assert.Equal(t, OutcomeCompleted, turns[0].Outcome)
			assert.False(t, turns[0].ClientKey)
			assert.Equal(t, "codex_exec", turns[0].Originator)
			assert.NotEmpty(t, turns[0].SessionID)

			// A turn with a tool call: the output of the command Codex ran
			// comes back in the second request and into the answer.
			res, err = cx.Exec(ctx, `check [[sim:tool exec_command {"cmd":"echo sim-tool-$((40+2))"}]]`,
				codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			codexcli.RequireSuccess(t, res)
			if tt.ws {
				codexcli.RequireWebSocket(t, res)
			}
			assert.Contains(t, res.FinalMessage, "sim-tool-42")
			require.Len(t, res.Commands, 1)
			assert.Contains(t, res.Commands[0].Output, "sim-tool-42")
			turns = generating(upstream.Requests(RecordFilter{ThreadID: res.ThreadID}))
			require.Len(t, turns, 2, "the call, then the follow-up with its output")
			assertTransport(t, upstream, res.ThreadID, want)
			assert.Empty(t, turns[0].ToolOutputs)
			require.Len(t, turns[1].ToolOutputs, 1)
			assert.Contains(t, turns[1].ToolOutputs[0].Output, "sim-tool-42")
			assert.True(t, turns[1].HasInputType("function_call_output"))
			if tt.ws {
				assert.NotEmpty(t, turns[1].PreviousResponseID, "over a WebSocket Codex chains on the previous response")
				assert.Equal(t, []string{"function_call_output"}, turns[1].InputTypes, "and sends only the new items")
				assert.Equal(t, turns[0].TurnStateSent, turns[1].ClientTurnState, "the turn state comes back in client_metadata")
			} else {
				assert.Empty(t, turns[1].PreviousResponseID)
				assert.Greater(t, turns[1].InputCount, turns[0].InputCount, "over HTTP Codex resends the history")
				assert.Equal(t, turns[0].TurnStateSent, turns[1].TurnState, "the turn state comes back in the header")
			}
			require.NotEmpty(t, turns[0].TurnStateSent)
		})
	}
}

// TestCodexResumeResendsTheHistory resumes a thread: Codex sends the whole
// history again, with the same thread identity.
func TestCodexResumeResendsTheHistory(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	cx := codexcli.New(t, codexcli.Provider{BaseURL: upstream.OpenAIBaseURL(), Key: "sk-k1"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, err := cx.Exec(ctx, "remember the red door", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, first)
	again, err := cx.Resume(ctx, first.ThreadID, "what was it?", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, again)
	assert.Equal(t, "Simulated reply to: what was it?", again.FinalMessage)

	turns := generating(upstream.Requests(RecordFilter{ThreadID: first.ThreadID}))
	require.Len(t, turns, 2)
	assert.Equal(t, turns[0].SessionID, turns[1].SessionID)
	assert.Greater(t, turns[1].InputCount, turns[0].InputCount)
	assert.True(t, turns[1].HasInputType("reasoning"), "the resumed history carries the first turn's reasoning ciphertext")
	// The resent reasoning ciphertext verified: the answer completed.
	assert.Equal(t, OutcomeCompleted, turns[1].Outcome)
}

// TestCodexStopsOnUsageLimit shows Codex's side of a fault: a usage limit
// ends the run with exit code 1 after exactly one request.
func TestCodexStopsOnUsageLimit(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultUsageLimit, Account: "k1"}}})
	cx := codexcli.New(t, codexcli.Provider{BaseURL: upstream.OpenAIBaseURL(), Key: "sk-k1"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cx.Exec(ctx, "hi", codexcli.RunOptions{})
	require.NoError(t, err)
	assert.Equal(t, 1, res.ExitCode)
	reqs := upstream.Requests(RecordFilter{})
	require.Len(t, reqs, 1, "a usage limit is not retried")
	assert.Equal(t, wire.TypeUsageLimitReached, reqs[0].ErrorType)
}

// generating drops prewarm requests (generate:false).
func generating(recs []Record) []Record {
	var out []Record
	for _, r := range recs {
		if r.Generate == nil || *r.Generate {
			out = append(out, r)
		}
	}
	return out
}

// assertTransport checks that every request of the thread used the
// transport, and that WebSocket sessions really did upgrade.
func assertTransport(t *testing.T, upstream *Server, thread string, want Transport) {
	t.Helper()
	for _, r := range upstream.Requests(RecordFilter{ThreadID: thread}) {
		assert.Equal(t, want, r.Transport, "request %d", r.Seq)
	}
	handshakes := upstream.Records(RecordFilter{ThreadID: thread, Kind: RecordHandshake})
	if want == TransportWS {
		require.NotEmpty(t, handshakes)
		for _, h := range handshakes {
			assert.Equal(t, OutcomeUpgraded, h.Outcome)
		}
	} else {
		assert.Empty(t, handshakes)
	}
}

// TestCodexFallsBackOnRefusedUpgrade: a 426 answer to the upgrade makes
// Codex use HTTP for the session at once, and shows in its stderr, which is
// what codexcli.RequireWebSocket looks for.
func TestCodexFallsBackOnRefusedUpgrade(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultRefuseWebSocket}}})
	cx := codexcli.New(t, codexcli.Provider{BaseURL: upstream.OpenAIBaseURL(), Key: "sk-k1", WebSockets: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cx.Exec(ctx, "hi", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, res)
	assert.NotEmpty(t, res.WebSocketFallback())
	handshakes := upstream.Records(RecordFilter{Kind: RecordHandshake})
	require.NotEmpty(t, handshakes)
	assert.Equal(t, 426, handshakes[0].Status)
	reqs := generating(upstream.Requests(RecordFilter{}))
	require.Len(t, reqs, 1)
	assert.Equal(t, TransportHTTP, reqs[0].Transport)
}
