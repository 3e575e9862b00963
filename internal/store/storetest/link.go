package storetest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Link is a TCP proxy in front of a database. Partitioned, it passes
// nothing either way and leaves every connection open, as a network that
// drops packets does (or a frozen server: the connections are there, no
// answer comes); healed, it resets the connections that were open across
// the partition, as a firewall or NAT that lost their state does, and
// passes new ones again.
type Link struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool                  // guarded by mu
	healed chan struct{}         // closed when the partition ends; guarded by mu
	conns  map[net.Conn]struct{} // both ends of every pair; guarded by mu
}

// NewLink listens on loopback and passes to target (host:port); the test's
// end closes it and every connection through it.
func NewLink(t testing.TB, target string) *Link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &Link{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		l.Heal()
	})
	return l
}

// Addr is the address to connect to instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Partition stops passing anything until Heal.
func (l *Link) Partition() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		l.cut, l.healed = true, make(chan struct{})
	}
}

// Heal resets every connection open now and passes again.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, not a goodbye
		}
		c.Close()
		delete(l.conns, c)
	}
	if l.cut {
		l.cut = false
		close(l.healed)
	}
}

// wait returns at once while the link passes, else when the partition
// under way ends.
func (l *Link) wait() {
	l.mu.Lock()
	cut, healed := l.cut, l.healed
	l.mu.Unlock()
	if cut {
		<-healed
	}
}

func (l *Link) track(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns[c] = struct{}{}
}

func (l *Link) serve(c net.Conn) {
	l.track(c)
	l.wait() // a connection made during a partition gets nowhere
	up, err := net.DialTimeout("tcp", l.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	l.track(up)
	go l.pass(up, c)
	l.pass(c, up)
}

// pass copies src to dst, holding what it read while partitioned.
func (l *Link) pass(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
