package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// Operators see live lanes; resetting a thread's bindings drops its
// continuity and its lane, and the next turn is placed afresh.
func TestLanesAndReset(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	c := h.dialWS(sessionS, rootT)
	typ, id1 := lastEvent(c.turn(responseRequest("hello")))
	require.Equal(t, "response.completed", typ)

	lanes := h.relay.Lanes()
	require.Len(t, lanes, 1)
	assert.Equal(t, "direct", lanes[0].Kind)
	assert.Equal(t, rootT, lanes[0].ThreadID)
	assert.Equal(t, sessionS, lanes[0].SessionID)
	assert.EqualValues(t, 1, lanes[0].Requests)
	owner := h.simID(lanes[0].AccountID)
	require.NotEmpty(t, owner)

	reset, err := h.store.ResetBindings(ctx, store.BindingReset{ThreadID: rootT})
	require.NoError(t, err)
	require.NotEmpty(t, reset)
	h.relay.Forget(reset)

	// The continuity entry is gone: the chained request cannot be rebuilt,
	// and the lane was dropped, so Codex is asked to resend in full.
	events := c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id1, "input": []any{userMessage("again")}})
	last := events[len(events)-1]
	assert.Equal(t, "error", last["type"])
	assert.Equal(t, "previous_response_not_found", last["error"].(map[string]any)["code"])

	typ, _ = lastEvent(c.turn(responseRequest("full resend")))
	require.Equal(t, "response.completed", typ)
	handshakes := 0
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Kind == sim.RecordHandshake {
			handshakes++
		}
	}
	assert.Equal(t, 2, handshakes, "the reset closed the lane; a new one serves")
	rows, _, err := h.store.Bindings(ctx, store.BindingFilter{ThreadID: rootT})
	require.NoError(t, err)
	assert.NotEmpty(t, rows, "the next turn re-bound the thread")
}

// A turn is recorded before its terminal event reaches the client: reading
// up to response.completed (and no further), the binding already exists.
func TestTurnIsBoundBeforeItsTerminalEvent(t *testing.T) {
	t.Parallel()
	for _, noBridge := range []bool{false, true} {
		h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.DisableBridge = noBridge }, simAccount("a1", "org-a"))
		thread := "019a4444-0000-7000-8000-00000000000" + map[bool]string{false: "1", true: "2"}[noBridge]
		b, _ := json.Marshal(responseRequest("hi"))
		req, err := http.NewRequest(http.MethodPost, h.codexBaseURL()+"/responses", bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("thread-id", thread)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() && !strings.Contains(sc.Text(), `"response.completed"`) {
		}
		rows, _, err := h.store.Bindings(context.Background(), store.BindingFilter{ThreadID: thread})
		require.NoError(t, err)
		assert.Len(t, rows, 1, "bridge off=%v: bound when the client reads response.completed", noBridge)
		resp.Body.Close()
	}
}
