package relay

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// lane is a long-lived upstream WebSocket for one thread on one account. Its
// reader goroutine pumps messages into events until the connection ends;
// the lane's owner (a client session) reads events one turn at a time.
type lane struct {
	account store.Account // static
	conn    *websocket.Conn
	opened  time.Time   // static
	header  http.Header // the upgrade answer's headers; static
	events  chan []byte // closed by the reader when the connection ends
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader has exited

	mu  sync.Mutex
	err error // guarded by mu; why the reader stopped

	// known holds response ids produced on this connection; owned by the
	// session goroutine that uses the lane.
	known map[string]bool
}

// laneQueue bounds events waiting for the session; the reader waits when it
// is full (the upstream then waits on TCP), so nothing is dropped.
const laneQueue = 256

func (s *Server) openLane(ctx context.Context, t Target, clientHeader http.Header) (*lane, error) {
	conn, resp, err := s.cfg.Upstream.DialWebSocket(ctx, t, clientHeader)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &lane{account: t.Account, conn: conn, opened: s.cfg.Now(), events: make(chan []byte, laneQueue),
		cancel: cancel, done: make(chan struct{}), known: map[string]bool{}}
	if resp != nil {
		l.header = resp.Header
	}
	go l.read(lctx)
	s.metrics.lanes.WithLabelValues("opened").Inc()
	return l, nil
}

func (l *lane) read(ctx context.Context) {
	defer close(l.done)
	defer close(l.events)
	for {
		typ, data, err := l.conn.Read(ctx)
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

// readErr reports why the lane's reader stopped.
func (l *lane) readErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// alive reports whether the reader still runs.
func (l *lane) alive() bool {
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

// send writes one message upstream within a deadline.
func (l *lane) send(ctx context.Context, msg []byte) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return l.conn.Write(wctx, websocket.MessageText, msg)
}

// drain discards events left from an earlier turn.
func (l *lane) drain() {
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

// close ends the lane and waits for its reader.
func (l *lane) close() {
	l.cancel() // a cancelled Read closes the connection
	l.conn.CloseNow()
	<-l.done
}

// errorEvent encodes a WebSocket error event as Codex reads it.
func errorEvent(status int, e apiError) []byte {
	return mustJSON(wire.NewErrorEvent(status, e, nil))
}
