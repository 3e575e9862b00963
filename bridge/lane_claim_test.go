package bridge

import (
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

// scriptedUpstream is an upstream WebSocket the test drives: each string
// sent on out goes to the lane as a text message ("close" closes the
// connection), and what the lane sends arrives on in.
type scriptedUpstream struct {
	out chan string
	in  chan string
}

func scriptedLane(t *testing.T) (*Lane, *scriptedUpstream) {
	t.Helper()
	u := &scriptedUpstream{out: make(chan string, 16), in: make(chan string, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			defer cancel()
			for {
				_, m, err := c.Read(ctx)
				if err != nil {
					return
				}
				u.in <- string(m)
			}
		}()
		for {
			select {
			case m := <-u.out:
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
	l := NewLane(conn, "acc", nil, time.Now())
	t.Cleanup(l.Close)
	return l, u
}

// firstOf waits for a claim's first message.
func firstOf(t *testing.T, first <-chan *Event) (*Event, bool) {
	t.Helper()
	select {
	case m, ok := <-first:
		return m, ok
	case <-time.After(time.Minute):
		t.Fatal("the claim was never answered")
		return nil, false
	}
}

// A request reads its lane in its own goroutine: what arrived before its
// claim is dropped by the idle reader, its first message is handed over,
// the rest it reads itself; once it lets go, the idle reader takes over
// again and the next request's claim works the same way.
func TestLaneClaimHandsOverTheRequestsMessages(t *testing.T) {
	l, u := scriptedLane(t)
	for turn := range 2 {
		u.out <- `stray` // arrives while no request waits: before this turn, or the last one's tail
		require.Eventually(t, func() bool { return l.dropped.Load() == int64(turn+1) }, time.Minute, time.Millisecond)

		first := l.Claim()
		require.NoError(t, l.Send(context.Background(), []byte(`request`)))
		assert.Equal(t, "request", <-u.in)
		u.out <- `one`
		u.out <- `two`
		m, ok := firstOf(t, first)
		require.True(t, ok, "turn %d: %v", turn, l.Err())
		assert.Equal(t, "one", string(m.Data), "turn %d", turn)
		m.Release()
		m, err := l.Read()
		require.NoError(t, err)
		assert.Equal(t, "two", string(m.Data), "turn %d", turn)
		m.Release()
		l.Unclaim(first)
	}
	assert.True(t, l.Alive())
}

// A request that claims the lane before the previous one let go of it (a
// bridge lane is released when its response completes, while its last
// event is still being written to the client) gets its first message once
// the previous one lets go.
func TestLaneClaimWaitsForThePreviousHolder(t *testing.T) {
	l, u := scriptedLane(t)
	a := l.Claim()
	u.out <- `a1`
	m, ok := firstOf(t, a)
	require.True(t, ok)
	m.Release()

	b := l.Claim()
	u.out <- `b1`
	select {
	case <-b:
		t.Fatal("handed over while the previous request still reads")
	case <-time.After(50 * time.Millisecond):
	}
	l.Unclaim(a)
	m, ok = firstOf(t, b)
	require.True(t, ok)
	assert.Equal(t, "b1", string(m.Data))
	m.Release()
	l.Unclaim(b)
}

// The lane ends for its reader whoever it is: an upstream that closes the
// connection between requests is noticed by the idle reader (the lane is
// no longer alive, a claim ends at once), and one that closes it during a
// request ends the request's read.
func TestLaneEndsForWhoeverReadsIt(t *testing.T) {
	t.Run("between requests", func(t *testing.T) {
		l, u := scriptedLane(t)
		u.out <- "close"
		require.Eventually(t, func() bool { return !l.Alive() }, time.Minute, time.Millisecond)
		require.Error(t, l.Err())
		_, ok := firstOf(t, l.Claim())
		assert.False(t, ok, "a claim on an ended lane ends")
	})
	t.Run("waiting for the first message", func(t *testing.T) {
		l, u := scriptedLane(t)
		first := l.Claim()
		u.out <- "close"
		_, ok := firstOf(t, first)
		assert.False(t, ok)
		assert.False(t, l.Alive())
		l.Unclaim(first)
	})
	t.Run("during a request", func(t *testing.T) {
		l, u := scriptedLane(t)
		first := l.Claim()
		u.out <- "one"
		m, ok := firstOf(t, first)
		require.True(t, ok)
		m.Release()
		u.out <- "close"
		_, err := l.Read()
		require.Error(t, err)
		assert.False(t, l.Alive())
		assert.Equal(t, err, l.Err())
		l.Unclaim(first) // no idle reader starts on an ended lane (the leak check would see it)
	})
	t.Run("interrupted during a request", func(t *testing.T) {
		l, u := scriptedLane(t)
		first := l.Claim()
		u.out <- "one"
		m, ok := firstOf(t, first)
		require.True(t, ok)
		m.Release()
		done := make(chan error, 1)
		go func() {
			_, err := l.Read()
			done <- err
		}()
		l.Interrupt()
		select {
		case err := <-done:
			require.Error(t, err)
		case <-time.After(time.Minute):
			t.Fatal("Interrupt did not end the read")
		}
		assert.False(t, l.Alive())
		l.Unclaim(first)
	})
	t.Run("closed while a request waits behind another", func(t *testing.T) {
		l, u := scriptedLane(t)
		a := l.Claim()
		u.out <- "a1"
		m, ok := firstOf(t, a)
		require.True(t, ok)
		m.Release()
		b := l.Claim()
		l.Close()
		_, ok = firstOf(t, b)
		assert.False(t, ok, "the waiting claim ends with the lane")
		l.Unclaim(a)
		l.Unclaim(b)
	})
}
