package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
)

// The smoke set, on the newest pinned Codex CLI and on the previous pin
// (package.json's codex-previous), so a regression on either shows: over
// WebSocket and over HTTP, a conversation with a tool call that really
// runs, then a resume that stays on the thread's account.
func TestCodexSmokeOnEachPin(t *testing.T) {
	t.Parallel()
	pins := []struct {
		name    string
		version string // what the client's User-Agent names
		new     func(testing.TB, codexcli.Provider) *codexcli.Codex
	}{
		{"newest", "0.171.0", codexcli.New},
		{"previous", "0.169.0", codexcli.NewPrevious},
	}
	for _, pin := range pins {
		for _, ws := range []bool{true, false} {
			name := pin.name + "/" + map[bool]string{true: "websocket", false: "http"}[ws]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
				ctx := context.Background()
				codex := pin.new(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused"})
				marker := fmt.Sprintf("smoke-%s-%v", pin.name, ws)
				first, err := codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo `+marker+`"}]]`, codexcli.RunOptions{BypassSandbox: true})
				require.NoError(t, err)
				codexcli.RequireSuccess(t, first)
				assert.Contains(t, first.FinalMessage, marker, "the tool ran and its output came back")
				require.NotEmpty(t, first.Commands, "a command_execution item completed")

				resumed, err := codex.Resume(ctx, first.ThreadID, "and again", codexcli.RunOptions{})
				require.NoError(t, err)
				codexcli.RequireSuccess(t, resumed)
				recs := h.responseRecords(first.ThreadID)
				require.GreaterOrEqual(t, len(recs), 3, "the turn, its tool follow-up and the resume")
				for _, r := range recs {
					assert.Equal(t, recs[0].Account, r.Account, "the thread stays on its account")
					assert.True(t, strings.Contains(r.UserAgent, pin.version), "the %s pin ran: %q", pin.name, r.UserAgent)
					assert.False(t, r.ClientKey, "no client key went upstream")
				}
				if ws {
					assert.Empty(t, resumed.WebSocketFallback(), "Codex stayed on its WebSocket")
				}
			})
		}
	}
}
