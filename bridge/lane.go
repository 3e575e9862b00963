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
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Lane is a long-lived upstream WebSocket for one thread on one account.
// Its connection is always read, so control frames are answered and an
// upstream that ends the connection is noticed, by one goroutine at a
// time: between requests an idle reader (a goroutine of the lane's own),
// which drops whatever arrives; during a request the request's own
// goroutine (Claim, Read, Unclaim), so forwarding an event costs no hand-off
// between goroutines. Close ends the lane and waits for its idle reader.
type Lane struct {
	Account string      // static: the account's id
	Opened  time.Time   // static
	Header  http.Header // static: the upgrade answer's headers
	// SessionID and ThreadID are the client's raw ids of the thread the
	// lane was opened for, for operators; set before the lane is shared.
	SessionID, ThreadID string
	// Raw is the network connection under the WebSocket, when the dialer
	// knew it (set before the lane is shared): Hangup half-closes it.
	Raw      net.Conn
	conn     *websocket.Conn
	dead     chan struct{} // closed once the connection has ended or Close ran
	deadOnce sync.Once
	idlers   sync.WaitGroup // idle readers; Close waits for them

	mu     sync.Mutex
	err    error // guarded by mu; why the connection ended
	closed bool  // guarded by mu; Close ran: no idle reader starts again
	// reader is who reads the connection; guarded by mu.
	reader laneReader
	// handoff, guarded by mu, is the channel of a request that claimed
	// the lane and waits for its first message (nil when none waits). The
	// idle reader sends it the next message, gives up reading and exits;
	// it is closed when the lane ends first.
	handoff chan *Event

	// Requests counts requests sent on the lane.
	Requests atomic.Int64
	// dropped counts messages that arrived while no request waited.
	dropped atomic.Int64
}

// laneReader says who reads a lane's connection.
type laneReader int

const (
	readerNone laneReader = iota // nobody: the connection has ended
	readerIdle                   // the lane's idle reader goroutine
	readerHeld                   // a request's goroutine, which took the hand-over
)

// NewLane starts serving conn, an upgraded upstream WebSocket of account.
// The lane lives until Close or until the connection ends.
func NewLane(conn *websocket.Conn, account string, header http.Header, now time.Time) *Lane {
	l := &Lane{Account: account, Opened: now, Header: header, conn: conn, dead: make(chan struct{}), reader: readerIdle}
	l.idlers.Add(1)
	go l.idle()
	return l
}

// idle reads the connection between requests. A message that arrives
// while no request waits is dropped (the tail of an earlier request, or a
// message no request asked for); the first one after a Claim is handed to
// the claimant, and the idle reader exits: the claimant reads from then on.
func (l *Lane) idle() {
	defer l.idlers.Done()
	for {
		m, err := l.read()
		l.mu.Lock()
		if err != nil {
			l.reader = readerNone
			if l.handoff != nil {
				close(l.handoff)
				l.handoff = nil
			}
			l.mu.Unlock()
			return
		}
		if h := l.handoff; h != nil {
			l.handoff, l.reader = nil, readerHeld
			h <- m // never blocks: its capacity is one, and it is sent one message
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		l.dropped.Add(1)
		m.Release()
	}
}

// Claim makes the calling request the lane's reader, from the first
// message that arrives after it: call it before sending the request, then
// wait for that message on the returned channel, and read the rest with
// Read. The channel is closed instead when the lane ends first (Err says
// why). A request that claims a lane whose previous request has not yet
// called Unclaim gets its first message once that one has. Unclaim ends
// the claim. One claim at a time: the lane's lease holder makes it.
func (l *Lane) Claim() <-chan *Event {
	h := make(chan *Event, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reader == readerNone || l.closed {
		close(h)
		return h
	}
	l.handoff = h
	return h
}

// Read reads the next message for the request that holds the lane's
// reading: it received its first message from Claim's channel. It blocks
// until a message arrives or the connection ends (Interrupt or Close end
// it at once); a connection that ended stays ended (Alive is false, Err
// says why).
func (l *Lane) Read() (*Event, error) { return l.read() }

// read reads the next text message, skipping others. An error ends the
// lane.
func (l *Lane) read() (*Event, error) {
	for {
		m, typ, err := l.next()
		if err != nil {
			l.fail(err)
			return nil, err
		}
		if typ == websocket.MessageText {
			return m, nil
		}
		m.Release()
	}
}

// fail records why the connection ended, once.
func (l *Lane) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.deadOnce.Do(func() { close(l.dead) })
}

// Unclaim ends a claim made with Claim (h is its channel): reading goes
// back to an idle reader, started again when the claimant held it. A first
// message handed over but not taken is released. Call it once the request
// reads no more.
func (l *Lane) Unclaim(h <-chan *Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handoff != nil && (<-chan *Event)(l.handoff) == h {
		// Nothing arrived: the idle reader reads on, for no one.
		l.handoff = nil
		return
	}
	select {
	case m, ok := <-h:
		if ok {
			m.Release()
		}
	default:
	}
	if l.reader != readerHeld {
		return
	}
	if l.closed || !l.Alive() {
		l.reader = readerNone
		if l.handoff != nil {
			close(l.handoff) // a later claim waits on a lane that has ended
			l.handoff = nil
		}
		return
	}
	l.reader = readerIdle
	l.idlers.Add(1)
	go l.idle()
}

// Interrupt ends the connection at once, without waiting: a Read under way
// returns. The lane is then dead; Close still releases it.
func (l *Lane) Interrupt() { l.conn.CloseNow() }

// ErrHungUp is why a lane that hung up ended (Hangup).
var ErrHungUp = errors.New("lane hung up: its request was cancelled")

// Hangup cancels the upstream's request the way a client that goes away
// does, yet hears it out: the connection's sending side ends (a TCP or TLS
// half-close), so the upstream sees its client go, stops and closes the
// connection, while whatever it sent before that can still be read. The
// lane serves no other request (Alive is false from now on). It reports
// false, and does nothing, when the connection cannot be half-closed (its
// network connection is unknown): the caller closes it instead.
func (l *Lane) Hangup() bool {
	cw, ok := l.Raw.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return false
	}
	l.fail(ErrHungUp)
	return true
}

// next reads one message into a pooled buffer. It reads without a
// context: coder/websocket arms a context.AfterFunc for every frame
// read under a cancellable one, an allocation and two locks an event.
// Interrupt and Close unblock the read by closing the connection.
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

// Err reports why the lane's connection ended (nil while it has not, or
// when Close ended it with no read under way).
func (l *Lane) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Alive reports whether the connection still serves: it has not ended,
// and Close has not run.
func (l *Lane) Alive() bool {
	select {
	case <-l.dead:
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

// Close ends the lane and waits for its idle reader; a request reading it
// sees its Read fail. It is safe to call twice.
func (l *Lane) Close() {
	l.mu.Lock()
	l.closed = true
	if l.handoff != nil && l.reader != readerIdle {
		// No idle reader will hand it anything, nor close it.
		close(l.handoff)
		l.handoff = nil
	}
	l.mu.Unlock()
	l.conn.CloseNow()
	l.deadOnce.Do(func() { close(l.dead) })
	l.idlers.Wait()
}
