package relay

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/bridge"
)

// scriptedLane is a lane on an upstream the test drives: each string sent
// on the returned channel goes to the lane as a text message, and "close"
// closes the connection.
func scriptedLane(t *testing.T) (*bridge.Lane, chan<- string) {
	t.Helper()
	out := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := c.CloseRead(r.Context()) // the lane's requests are not needed
		for {
			select {
			case m := <-out:
				if m == "close" {
					c.Close(websocket.StatusGoingAway, "bye")
					return
				}
				if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	conn, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	l := bridge.NewLane(conn, "acc", nil, time.Now())
	t.Cleanup(l.Close)
	return l, out
}

// nextIn runs src.Next in a goroutine and waits for it (a Next that never
// returns fails the test instead of hanging it).
func nextIn(t *testing.T, ctx context.Context, src eventSource, idle time.Duration) (string, error) {
	t.Helper()
	type result struct {
		data string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, err := src.Next(ctx, idle)
		done <- result{string(data), err}
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-time.After(time.Minute):
		t.Fatal("Next did not return")
		return "", nil
	}
}

// A lane's events are read in the request's goroutine once the first has
// been handed over, and every way a read ends is told apart as the pump
// needs it: the idle deadline (a stall), the request's context ending (its
// client went away: the read is interrupted, not waited out), and the
// upstream closing the connection (a cut stream), before the first event
// and after it.
func TestLaneSourceEndings(t *testing.T) {
	t.Parallel()
	const long = time.Hour // a deadline no test waits out
	for _, tc := range []struct {
		name   string
		events int // events before the ending
		ending string
	}{
		{"stall before the first event", 0, "stall"},
		{"stall mid-stream", 2, "stall"},
		{"client gone before the first event", 0, "cancel"},
		{"client gone mid-stream", 2, "cancel"},
		{"upstream closed before the first event", 0, "close"},
		{"upstream closed mid-stream", 2, "close"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, up := scriptedLane(t)
			src := newLaneSource(l, hangUpAfter)
			defer src.stop()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range tc.events {
				up <- "event"
				data, err := nextIn(t, ctx, src, long)
				require.NoError(t, err, "event %d", i)
				assert.Equal(t, "event", data)
			}
			idle := long
			switch tc.ending {
			case "stall":
				idle = 50 * time.Millisecond
			case "cancel":
				time.AfterFunc(50*time.Millisecond, cancel)
			case "close":
				up <- "close"
			}
			_, err := nextIn(t, ctx, src, idle)
			switch tc.ending {
			case "stall":
				assert.ErrorIs(t, err, errStall)
			case "cancel":
				assert.ErrorIs(t, err, context.Canceled)
			case "close":
				require.Error(t, err)
				assert.False(t, errors.Is(err, errStall) || errors.Is(err, context.Canceled), "a cut stream: %v", err)
				assert.False(t, l.Alive())
			}
		})
	}
}

// Once the client is gone, Arrived reads what the upstream has sent
// already (its terminal event, which keeps the lane) and reports nothing
// when it has sent nothing more; the request's context ending meanwhile
// does not interrupt it (an HTTP client's request ends as its connection
// does, while the relay still reads what arrived).
func TestLaneSourceArrived(t *testing.T) {
	t.Parallel()
	l, up := scriptedLane(t)
	src := newLaneSource(l, hangUpAfter)
	ctx, cancel := context.WithCancel(context.Background())
	up <- "first"
	data, err := nextIn(t, ctx, src, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, "first", data)
	up <- "second"
	up <- "terminal"
	cancel() // the client went away while its write was under way
	require.Eventually(t, func() bool { return len(up) == 0 }, time.Minute, time.Millisecond)
	for _, want := range []string{"second", "terminal"} {
		var got []byte
		var ok bool
		require.Eventually(t, func() bool { got, ok = src.Arrived(); return ok }, time.Minute, time.Millisecond, "%s arrived", want)
		assert.Equal(t, want, string(got))
	}
	assert.True(t, l.Alive(), "the lane, read to the upstream's end, is kept")
	src.stop()

	// The next request on the lane: the idle reader took over again.
	next := newLaneSource(l, hangUpAfter)
	defer next.stop()
	up <- "again"
	data, err = nextIn(t, context.Background(), next, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, "again", data)
	_, ok := next.Arrived()
	assert.False(t, ok, "nothing more was sent")
}

// A client that goes while the upstream is still answering: the lane hangs
// up (half-closes), the upstream sees its client go, and what it sends
// before it closes is still read (a response it completed, whose usage it
// counts), not thrown away with the lane. The lane serves no other request.
func TestLaneSourceHearsOutAnUpstreamItHangsUpOn(t *testing.T) {
	t.Parallel()
	sawEnd := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if err := c.Write(r.Context(), websocket.MessageText, []byte("first")); err != nil {
			return
		}
		if _, _, err := c.Read(r.Context()); err == nil {
			return // the client sends nothing: only its end comes
		}
		close(sawEnd)
		// Seeing its client go, the upstream sends what it had finished,
		// and closes.
		_ = c.Write(context.Background(), websocket.MessageText, []byte("response.completed"))
	}))
	t.Cleanup(srv.Close)
	var raw net.Conn
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { raw = i.Conn }})
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	l := bridge.NewLane(conn, "acc", nil, time.Now())
	l.Raw = raw
	t.Cleanup(l.Close)

	src := newLaneSource(l, hangUpAfter)
	defer src.stop()
	reqCtx, cancel := context.WithCancel(context.Background())
	data, err := nextIn(t, reqCtx, src, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, "first", data)
	time.AfterFunc(20*time.Millisecond, cancel) // the client goes while the read waits
	got, err := nextIn(t, reqCtx, src, time.Hour)
	select {
	case <-sawEnd:
	case <-time.After(time.Minute):
		t.Fatal("the upstream never saw its client go")
	}
	if err != nil { // the read under way ended with the lane; what came is at hand
		assert.ErrorIs(t, err, context.Canceled)
		data, ok := src.Arrived()
		require.True(t, ok, "what the upstream sent after the hang-up is read")
		got = string(data)
	}
	assert.Equal(t, "response.completed", got)
	assert.False(t, l.Alive(), "a lane that hung up serves no other request")
}
