// Package bridge holds upstream WebSocket lanes: the long-lived connections
// the relay keeps per thread on one account. Direct lanes serve a client
// WebSocket; bridge lanes (Pool) serve HTTP clients, which resend their
// whole history every request, by sending the upstream only what is new.
//
// The package knows nothing of the relay: it is handed connections already
// dialled, and imports only the wire format and the continuity cache.
package bridge

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Lane is a long-lived upstream WebSocket for one thread on one account. Its
// reader goroutine pumps messages into Events until the connection ends; the
// lane's user (a client session, or a bridge lease) reads them one request
// at a time. Close ends the reader and waits for it.
type Lane struct {
	Account string      // static: the account's id
	Opened  time.Time   // static
	Header  http.Header // static: the upgrade answer's headers
	// SessionID and ThreadID are the client's raw ids of the thread the
	// lane was opened for, for operators; set before the lane is shared.
	SessionID, ThreadID string
	conn                *websocket.Conn
	events              chan *Event // closed by the reader when the connection ends
	cancel              context.CancelFunc
	done                chan struct{} // closed when the reader has exited

	mu  sync.Mutex
	err error // guarded by mu; why the reader stopped

	// Requests counts requests sent on the lane.
	Requests atomic.Int64
}

// laneQueue bounds events waiting for the session; the reader waits when it
// is full (the upstream then waits on TCP), so nothing is dropped.
const laneQueue = 32

// NewLane starts serving conn, an upgraded upstream WebSocket of account.
// The lane lives until Close or until the connection ends.
func NewLane(conn *websocket.Conn, account string, header http.Header, now time.Time) *Lane {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lane{Account: account, Opened: now, Header: header, conn: conn, events: make(chan *Event, laneQueue),
		cancel: cancel, done: make(chan struct{})}
	go l.read(ctx)
	return l
}

func (l *Lane) read(ctx context.Context) {
	defer close(l.done)
	defer close(l.events)
	for {
		m, typ, err := l.next()
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			return
		}
		if typ != websocket.MessageText {
			m.Release()
			continue
		}
		select {
		case l.events <- m:
		case <-ctx.Done():
			m.Release()
			return
		}
	}
}

// next reads one message into a pooled buffer. It reads without the
// lane's context: coder/websocket arms a context.AfterFunc for every frame
// read under a cancellable one, an allocation and two locks an event.
// Close unblocks the read by closing the connection.
func (l *Lane) next() (*Event, websocket.MessageType, error) {
	typ, r, err := l.conn.Reader(context.Background())
	if err != nil {
		return nil, 0, err
	}
	m := messagePool.Get().(*Event)
	if m.Data, err = readAll(m.Data[:0], r); err != nil {
		m.Release()
		return nil, 0, err
	}
	return m, typ, nil
}

// readAll appends what r holds to b, as io.ReadAll does into a new slice.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// Event is one upstream message, in a buffer lanes reuse: its Data is
// valid until Release, after which the holder must not touch it. Passing
// messages through pooled buffers keeps the per-event path free of
// allocations.
type Event struct {
	Data []byte
}

// messagePool holds released messages' buffers.
var messagePool = sync.Pool{New: func() any { return &Event{Data: make([]byte, 0, 1024)} }}

// maxPooledMessage bounds the buffers kept: a message that grew larger (a
// first response, a long tool call) is left to the collector.
const maxPooledMessage = 64 << 10

// Release gives the message's buffer back for reuse.
func (m *Event) Release() {
	if cap(m.Data) > maxPooledMessage {
		return
	}
	m.Data = m.Data[:0]
	messagePool.Put(m)
}

// Events delivers the upstream's messages, in order; it is closed when the
// connection ends (Err then says why). The receiver releases each message
// once done with it.
func (l *Lane) Events() <-chan *Event { return l.events }

// Err reports why the lane's reader stopped.
func (l *Lane) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Alive reports whether the reader still runs.
func (l *Lane) Alive() bool {
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

// Send writes one message upstream within a deadline.
func (l *Lane) Send(ctx context.Context, msg []byte) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return l.conn.Write(wctx, websocket.MessageText, msg)
}

// Drain discards events left from an earlier request.
func (l *Lane) Drain() {
	for {
		select {
		case m, ok := <-l.events:
			if !ok {
				return
			}
			m.Release()
		default:
			return
		}
	}
}

// Close ends the lane and waits for its reader. It is safe to call twice.
func (l *Lane) Close() {
	l.cancel() // a cancelled Read closes the connection
	l.conn.CloseNow()
	<-l.done
}
