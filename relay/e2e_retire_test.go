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
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// A session pinned to an account that hits its limit: an ordinary request
// (the real Codex CLI resuming) fails closed with the owner's reset time; a
// goal-marked, self-contained restart retires the owner and is served by
// another account.
func TestGoalRestartRetiresAnUnavailableOwner(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	h.setUsed("a2", 90)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused"})
	first, err := codex.Exec(ctx, "start", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, first.Stderr)
	recs := h.responseRecords(first.ThreadID)
	require.Equal(t, "a1", recs[0].Account)
	session := recs[0].SessionID
	require.NotEmpty(t, session)

	pin, err := h.store.Pin(ctx, store.BindRawSession, session, h.ids["a1"], "pin")
	require.NoError(t, err)
	reset := time.Now().Add(time.Hour).Truncate(time.Second)
	_, err = h.store.SetAccountStatus(ctx, h.ids["a1"], store.StatusRateLimited, "usage_limit_reached", reset)
	require.NoError(t, err)
	before := len(h.responseRecords(""))

	resumed, err := codex.Resume(ctx, first.ThreadID, "go on", codexcli.RunOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, 0, resumed.ExitCode, "an unmarked request fails closed")
	assert.Contains(t, strings.ToLower(strings.Join(resumed.Errors, " ")), "try again at", "Codex shows the owner's reset time")
	assert.Equal(t, before, len(h.responseRecords("")), "nothing went upstream")

	restart := responseRequest("")
	restart["input"] = []any{map[string]any{"type": "message", "role": "user", "content": []any{
		map[string]any{"type": "input_text", "text": relay.GoalMarker + "\nContinue working toward the goal."}}}}
	resp, body := h.post(session, "019a5555-0000-7000-8000-000000000001", restart, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, relay.RecoveryRetired, resp.Header.Get(relay.RecoveryHeader))
	all := h.responseRecords("")
	assert.Equal(t, "a2", all[len(all)-1].Account, "served by another account")

	got, err := h.store.Binding(ctx, pin.ID)
	require.NoError(t, err)
	assert.Equal(t, "process_session:goal_restart", got.AbandonedScope, "the retirement is recorded with its source")
	atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{Recovery: relay.RecoveryRetired})
	require.NoError(t, err)
	assert.Len(t, atts, 1)
}
