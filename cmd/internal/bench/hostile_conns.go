package bench

import (
	"net"
	"sync"
	"time"
)

// relayConns sees the relay's side of the connections the hostile mode
// waits on: a reader that stopped reading cannot see the relay close its
// end (the close waits in the relay's send buffer, behind the answer it
// never reads), so the bench looks where it happens. It wraps the relay's
// listener; every accepted connection counts its writes (a clock read and
// a lock a write), and one a stopped reader registered (watch) reports
// when the relay's writes to it block and when the relay closed it. Safe
// for concurrent use.
type relayConns struct {
	mu      sync.Mutex
	watched map[string]*connWatch // by the client's address; guarded by mu
}

// blockedAfter is how long a write to a watched connection is under way
// before the bench calls the relay's writes to it blocked (connWatch's
// blocked): a write to a reader whose buffers have room takes
// microseconds.
const blockedAfter = 500 * time.Millisecond

// connWatch is one registered connection as its relay side is seen.
type connWatch struct {
	// closed gets how the relay let the connection go, once.
	closed chan relayClose
	// blocked gets the start of a write that has been under way for
	// blockedAfter: the relay's writes to the connection blocked then, and
	// its write timeout runs from there. Buffered; the latest is kept.
	blocked chan time.Time

	mu   sync.Mutex
	conn *watchedConn // the relay's side, from its first write; guarded by mu
}

// relayClose is how the relay let one connection go.
type relayClose struct {
	At time.Time // when the relay closed its end
	// Written is what the relay had written to the connection: what the
	// kernel's buffers between it and a reader that reads nothing took.
	Written int64
	// BlockedAt is when the write that failed, or the oldest write still
	// under way at the close, began (zero: every write had completed): the
	// relay's writes blocked then, and its write timeout ran from there.
	BlockedAt time.Time
}

// blocked is how long the relay's writes had been blocked when it closed
// the connection (zero: they were not).
func (c relayClose) blocked() time.Duration {
	if c.BlockedAt.IsZero() {
		return 0
	}
	return c.At.Sub(c.BlockedAt)
}

// watch registers the connection from client (its local address): the
// returned watch hears when the relay's writes to it block and when the
// relay closes it.
func (w *relayConns) watch(client string) *connWatch {
	cw := &connWatch{closed: make(chan relayClose, 1), blocked: make(chan time.Time, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watched == nil {
		w.watched = map[string]*connWatch{}
	}
	w.watched[client] = cw
	return cw
}

// forget drops a registration whose close never came.
func (w *relayConns) forget(client string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watched, client)
}

// lookup is the registration of the connection from client, or nil.
func (w *relayConns) lookup(client string) *connWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watched[client]
}

func (w *relayConns) closed(client string, c relayClose) {
	w.mu.Lock()
	cw, ok := w.watched[client]
	delete(w.watched, client)
	w.mu.Unlock()
	if ok {
		cw.closed <- c
	}
}

// connState is a watched connection's relay side at one moment.
type connState struct {
	Written int64
	// BlockedSince is when the oldest write still under way began (zero:
	// none is).
	BlockedSince time.Time
}

// state reads the relay's side of the connection now (zero before the
// relay first wrote to it).
func (cw *connWatch) state() connState {
	cw.mu.Lock()
	c := cw.conn
	cw.mu.Unlock()
	if c == nil {
		return connState{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := connState{Written: c.written}
	if c.pending > 0 {
		s.BlockedSince = c.since
	}
	return s
}

// block reports a write under way since since, keeping the latest report.
func (cw *connWatch) block(since time.Time) {
	select {
	case <-cw.blocked:
	default:
	}
	select {
	case cw.blocked <- since:
	default:
	}
}

// listener wraps ln so that its connections report to w.
func (w *relayConns) listener(ln net.Listener) net.Listener { return watchedListener{ln, w} }

type watchedListener struct {
	net.Listener
	w *relayConns
}

func (l watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, w: l.w}, nil
}

// watchedConn is one relay connection: its writes are counted, its close
// reported, and for a watched one its writes' blocking.
type watchedConn struct {
	net.Conn
	w  *relayConns
	mu sync.Mutex
	// written counts the bytes the kernel took; since is when the oldest
	// write under way began, or the write that failed (zero: none);
	// pending counts writes under way (the WebSocket's pings beside its
	// messages); failed is set once a write failed. Guarded by mu.
	written int64
	since   time.Time
	pending int
	failed  bool
	closed  bool
	// watch is the connection's registration (nil: none), looked up at
	// its first write (the client registers before it sends its request),
	// and timer reports a write to a watched connection under way for
	// blockedAfter. Guarded by mu.
	looked bool
	watch  *connWatch
	timer  *time.Timer
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.looked {
		c.looked = true
		if c.watch = c.w.lookup(c.Conn.RemoteAddr().String()); c.watch != nil {
			c.watch.mu.Lock()
			c.watch.conn = c
			c.watch.mu.Unlock()
		}
	}
	if c.pending == 0 && !c.failed {
		c.since = time.Now()
		if c.watch != nil {
			if c.timer == nil {
				c.timer = time.AfterFunc(blockedAfter, c.reportBlocked)
			} else {
				c.timer.Reset(blockedAfter)
			}
		}
	}
	c.pending++
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.pending--
	c.written += int64(n)
	c.failed = c.failed || err != nil
	if c.pending == 0 && c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	return n, err
}

// reportBlocked tells the watch of a write still under way blockedAfter
// after the oldest one began.
func (c *watchedConn) reportBlocked() {
	c.mu.Lock()
	since, blocked := c.since, c.pending > 0 && !c.closed && time.Since(c.since) >= blockedAfter
	c.mu.Unlock()
	if blocked {
		c.watch.block(since)
	}
}

// CloseWrite keeps the HTTP server's half-close (before it closes a
// connection whose request it refused) as it is without the wrapper.
func (c *watchedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *watchedConn) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	rc := relayClose{At: time.Now(), Written: c.written}
	if c.pending > 0 || c.failed {
		rc.BlockedAt = c.since
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	if first {
		c.w.closed(c.Conn.RemoteAddr().String(), rc)
	}
	return c.Conn.Close()
}
