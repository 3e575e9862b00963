package app

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// serveHTTP serves hs on ln, the header deadline of each connection's
// first request starting at its first byte (firstByteListener).
func serveHTTP(hs *http.Server, ln net.Listener) error {
	return hs.Serve(firstByteListener{Listener: ln, idle: hs.IdleTimeout})
}

// firstByteListener gives a connection's first request what net/http gives
// every later one: the connection waits idle (up to idle, the server's
// IdleTimeout) until the request's first byte, and only then must the
// headers come within the server's ReadHeaderTimeout. net/http starts the
// first request's header deadline at accept, so a connection a client
// dialled ahead and pooled unused (Go's and hyper's clients do, when a
// kept-alive connection freed up while the dial was under way) was closed
// after ReadHeaderTimeout, and the request the client later sent on it
// failed with EOF or a reset: 11 of about 60,000 HTTP requests in a
// 5-minute soak, each on a connection idle 10 s. A slow sender of headers
// is still cut ReadHeaderTimeout after its first byte; a connection that
// sends nothing costs what an idle kept-alive one does, for as long.
type firstByteListener struct {
	net.Listener
	idle time.Duration
}

func (l firstByteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.idle <= 0 {
		return c, nil
	}
	return &firstByteConn{Conn: c, idle: l.idle}, nil
}

// firstByteConn holds back the read deadlines asked for before its first
// byte: the idle deadline stands instead, and the deadline asked for last
// starts at the first byte, for as long as it was asked.
type firstByteConn struct {
	net.Conn
	idle  time.Duration
	begun atomic.Bool // the first byte came: deadlines pass through

	mu       sync.Mutex
	askedFor time.Duration // guarded by mu: the read deadline asked for last, from the time it was asked (0: none)
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.begun.Load() {
		c.mu.Lock()
		if !c.begun.Load() {
			c.begun.Store(true)
			if c.askedFor > 0 {
				_ = c.Conn.SetReadDeadline(time.Now().Add(c.askedFor))
			}
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *firstByteConn) SetReadDeadline(t time.Time) error {
	if c.begun.Load() {
		return c.Conn.SetReadDeadline(t)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.begun.Load() {
		return c.Conn.SetReadDeadline(t)
	}
	if t.IsZero() {
		c.askedFor = 0
		return c.Conn.SetReadDeadline(t)
	}
	c.askedFor = time.Until(t)
	return c.Conn.SetReadDeadline(time.Now().Add(max(c.idle, c.askedFor)))
}

func (c *firstByteConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// CloseWrite half-closes the connection when it can, so net/http's
// lingering close after refusing a request works as on the bare one.
func (c *firstByteConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
