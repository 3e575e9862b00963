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
	events              chan []byte // closed by the reader when the connection ends
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
	l := &Lane{Account: account, Opened: now, Header: header, conn: conn, events: make(chan []byte, laneQueue),
		cancel: cancel, done: make(chan struct{})}
	go l.read(ctx)
	return l
}

func (l *Lane) read(ctx context.Context) {
	defer close(l.done)
	defer close(l.events)
	for {
		// Read without the lane's context: coder/websocket arms a
		// context.AfterFunc for every frame read under a cancellable
		// one, an allocation and two locks an event. Close unblocks the
		// read by closing the connection.
		typ, data, err := l.conn.Read(context.Background())
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			return
		}
		if typ != websocket.MessageText {
			continue
		}
		select {
		case l.events <- data:
		case <-ctx.Done():
			return
		}
	}
}

// Events delivers the upstream's messages, in order; it is closed when the
// connection ends (Err then says why).
func (l *Lane) Events() <-chan []byte { return l.events }

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
		case _, ok := <-l.events:
			if !ok {
				return
			}
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
