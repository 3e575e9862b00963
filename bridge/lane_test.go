package bridge

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamingLane is a lane on an upstream that sends msgs, each as a text
// message, once the lane sends anything, and then waits for the next.
func streamingLane(t testing.TB, msgs [][]byte) *Lane {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
			for _, m := range msgs {
				if err := c.Write(ctx, websocket.MessageText, m); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	conn, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	conn.SetReadLimit(1 << 20)
	l := NewLane(conn, "acc", nil, time.Now())
	t.Cleanup(l.Close)
	return l
}

// Events arrive whole and in order, each in a pooled buffer: a released
// buffer is filled again by a later event, and an event held (not yet
// released) is never overwritten; a message larger than the buffers grows
// its own.
func TestLaneEventsInPooledBuffers(t *testing.T) {
	big := []byte(`{"type":"response.completed","text":"` + strings.Repeat("x", 100_000) + `"}`)
	var msgs [][]byte
	for i := range 50 {
		msgs = append(msgs, fmt.Appendf(nil, `{"type":"response.output_text.delta","delta":"word %d"}`, i))
	}
	msgs = append(msgs, big)
	l := streamingLane(t, msgs)
	first := l.Claim()
	require.NoError(t, l.Send(context.Background(), []byte(`{"type":"response.create"}`)))

	held := <-first // kept to the end: its bytes must stay as they came
	require.NotNil(t, held, "lane ended early: %v", l.Err())
	assert.Equal(t, string(msgs[0]), string(held.Data))
	for i := 1; i < len(msgs); i++ {
		ev, err := l.Read()
		require.NoError(t, err, "event %d", i)
		require.Equal(t, string(msgs[i]), string(ev.Data), "event %d", i)
		ev.Release()
	}
	assert.Equal(t, string(msgs[0]), string(held.Data), "a held event is not reused")
	held.Release()
	l.Unclaim(first)
}

// BenchmarkLaneEvent measures a lane's per-event path: read a delta from
// the upstream WebSocket into a pooled buffer in the request's goroutine,
// release it (the first event of each request comes from the idle
// reader). Allocations per event (the upstream's writes
// included) must stay at zero: the forwarding path allocates nothing for
// an event it does not rewrite.
func BenchmarkLaneEvent(b *testing.B) {
	const burst = 1000
	msgs := make([][]byte, burst)
	for i := range msgs {
		msgs[i] = fmt.Appendf(nil, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"word%d "}`, i)
	}
	l := streamingLane(b, msgs)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(msgs[0])))
	b.ResetTimer()
	for i := 0; i < b.N; i += burst {
		first := l.Claim()
		if err := l.Send(ctx, []byte(`{"type":"response.create"}`)); err != nil {
			b.Fatal(err)
		}
		ev, ok := <-first
		if !ok {
			b.Fatal(l.Err())
		}
		ev.Release()
		for range burst - 1 {
			ev, err := l.Read()
			if err != nil {
				b.Fatal(err)
			}
			ev.Release()
		}
		l.Unclaim(first)
	}
}
