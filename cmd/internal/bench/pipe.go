package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// bytePipe is the bench's physical limit: a plain TCP proxy that accepts,
// dials the upstream and copies bytes both ways with io.Copy, parsing
// nothing. Between two TCP connections on Linux io.Copy splices in the
// kernel, so the bytes never enter the process: whatever the relay does
// beyond moving bytes is what it costs over this.
//
// Safe for concurrent use; Close ends every connection and waits for its
// goroutines.
type bytePipe struct {
	ln       net.Listener // static after startBytePipe
	upstream string       // host:port; static

	copied     atomic.Int64 // bytes copied, both ways, by copies that ended
	dialFailed atomic.Int64 // upstream dials that failed

	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // open connections, both sides; guarded by mu
	closed bool                  // guarded by mu
}

// startBytePipe listens on a loopback port in front of upstream.
func startBytePipe(upstream string) (*bytePipe, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pipe listen: %w", err)
	}
	p := &bytePipe{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the pipe's host:port.
func (p *bytePipe) Addr() string { return p.ln.Addr().String() }

func (p *bytePipe) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return // closed
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Go(func() { p.handle(c) })
	}
}

// handle dials the upstream for client c and copies both ways until both
// directions end; a direction that ends half-closes the other side, as
// TCP would.
func (p *bytePipe) handle(c net.Conn) {
	defer p.untrack(c)
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		p.dialFailed.Add(1)
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	defer p.untrack(up)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.copy(up, c)
	}()
	p.copy(c, up)
	<-done
}

func (p *bytePipe) copy(dst, src net.Conn) {
	n, _ := io.Copy(dst, src)
	p.copied.Add(n)
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		_ = dst.Close()
	}
}

func (p *bytePipe) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *bytePipe) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// Close stops accepting, closes every connection, waits for the copies to
// end and returns the bytes copied, both ways.
func (p *bytePipe) Close() int64 {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
	return p.copied.Load()
}
