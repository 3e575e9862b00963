package relay

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that stops reading may be let go by the session's ping before
// the write guard fires: the ping's frame waits behind the blocked write
// and fails (coder/websocket gives a control frame 5 s). The write then
// fails as the client's stall, as when the guard fires, so the attempt is
// client_stalled, never a hang-up.
func TestPingBehindAStuckWriteIsAStall(t *testing.T) {
	t.Parallel()
	accepted := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := websocket.Accept(w, r, nil); err == nil {
			accepted <- c
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	defer client.CloseNow() // the client reads nothing
	conn := <-accepted
	defer conn.CloseNow()

	// The session as run builds it, with a guard that would fire only in
	// an hour.
	sctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	ws := &wsSession{conn: conn, writes: writeGuard{timeout: time.Hour, onStuck: func() { conn.CloseNow() }}}
	stop := context.AfterFunc(sctx, func() { conn.CloseNow() })
	defer stop()
	wrote := make(chan error, 1)
	go func() { wrote <- ws.write(sctx, bytes.Repeat([]byte("a"), 32<<20)) }() // more than the kernel's buffers hold
	require.Eventually(t, func() bool {
		ws.writes.mu.Lock()
		defer ws.writes.mu.Unlock()
		return ws.writes.active > 0
	}, time.Minute, time.Millisecond, "the write is under way")
	pinger := ws.pingEvery(sctx, end, time.Millisecond)
	defer pinger.Stop()

	select {
	case err = <-wrote:
	case <-ctx.Done():
		t.Fatal("the stuck write never ended")
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, errClientStalled, "the write failed as the client's stall")
	assert.ErrorIs(t, context.Cause(sctx), errClientStalled, "the session ended for it")
}

// stall marks the guard fired only while a write is under way.
func TestWriteGuardStall(t *testing.T) {
	t.Parallel()
	g := &writeGuard{onStuck: func() {}}
	assert.False(t, g.stall(), "no write under way")
	assert.False(t, g.fired())
	g.begin()
	assert.True(t, g.stall())
	assert.True(t, g.fired())
	g.end()
}
