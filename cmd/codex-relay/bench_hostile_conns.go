package main

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
// a lock a write), and one a stopped reader registered reports when
// the relay closed it. Safe for concurrent use.
type relayConns struct {
	mu      sync.Mutex
	watched map[string]chan relayClose // by the client's address; guarded by mu
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
// returned channel gets its relayClose once the relay closes it.
func (w *relayConns) watch(client string) <-chan relayClose {
	ch := make(chan relayClose, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watched == nil {
		w.watched = map[string]chan relayClose{}
	}
	w.watched[client] = ch
	return ch
}

// forget drops a registration whose close never came.
func (w *relayConns) forget(client string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watched, client)
}

func (w *relayConns) closed(client string, c relayClose) {
	w.mu.Lock()
	ch, ok := w.watched[client]
	delete(w.watched, client)
	w.mu.Unlock()
	if ok {
		ch <- c
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
// reported.
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
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.pending == 0 && !c.failed {
		c.since = time.Now()
	}
	c.pending++
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.pending--
	c.written += int64(n)
	c.failed = c.failed || err != nil
	c.mu.Unlock()
	return n, err
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
	c.mu.Unlock()
	if first {
		c.w.closed(c.Conn.RemoteAddr().String(), rc)
	}
	return c.Conn.Close()
}
