package relay_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A draining relay lets a WebSocket turn under way finish, then ends the
// session with 1012 (service restart: Codex reconnects, to another
// replica); an idle session ends at once the same way; a new session is
// refused 503.
func TestDrainLetsWebSocketTurnsFinish(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	busy := h.dialWS(sessionS, rootT)
	idle := h.dialWS(sessionS, childT)
	typ, _ := lastEvent(idle.turn(responseRequest("a turn before the drain")))
	require.Equal(t, "response.completed", typ)

	done := make(chan []map[string]any, 1)
	go func() { done <- busy.turn(responseRequest("a slow turn [[sim:delay 1s]]")) }()
	require.Eventually(t, func() bool { return len(h.responseRecords(rootT)) == 1 }, time.Minute, 5*time.Millisecond,
		"the slow turn reached the upstream")
	h.relay.Drain()
	assert.True(t, h.relay.Draining())

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err := idle.conn.Read(ctx)
	assert.Equal(t, websocket.StatusServiceRestart, websocket.CloseStatus(err), "the idle session ends at once: %v", err)

	events := <-done
	typ, _ = lastEvent(events)
	assert.Equal(t, "response.completed", typ, "the turn under way finished")
	_, _, err = busy.conn.Read(ctx)
	assert.Equal(t, websocket.StatusServiceRestart, websocket.CloseStatus(err), "then its session ends: %v", err)

	url := "ws" + strings.TrimPrefix(h.codexBaseURL(), "http") + "/responses"
	_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"session-id": {sessionS}}})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a new session is refused")
	require.NoError(t, h.relay.WaitSessions(ctx), "every session ended")
}
