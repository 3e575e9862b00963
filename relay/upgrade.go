package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// upgrader is the http.RoundTripper of a lane dialed straight to its
// upstream (no account proxy, no environment proxy): it connects, writes the
// upgrade request and reads the answer in the calling goroutine. net/http's
// Transport does the same work across three goroutines of its own (a dial
// goroutine, then the connection's read and write loops) and hands off
// between them by channel; in a burst of new threads each hand-off is a wait
// in a run queue of hundreds of goroutines, and the handshakes' waits were
// most of what first turns spent blocked. Proxied lanes still go through
// net/http (CONNECT and SOCKS are its job).
type upgrader struct {
	dialer *net.Dialer
	tls    *tls.Config // nil: the defaults
	raw    *net.Conn   // set to the connection once the upgrade is answered
}

// maxUpgradeAnswer bounds an upgrade's answer, status line, headers and an
// error's body together.
const maxUpgradeAnswer = 2 * maxErrorBody

// laneDialer connects to upstreams: direct lanes, and the pooled
// transports of everything else.
var laneDialer = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}

// RoundTrip sends one upgrade request on a new connection. A 101 answer's
// body is the connection itself (what coder/websocket expects of a
// Transport); any other answer's body reads the rest of that answer and
// closing it closes the connection.
func (g *upgrader) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	tcp, err := g.dialer.DialContext(ctx, "tcp", hostPort(req.URL))
	if err != nil {
		return nil, err
	}
	// The caller's context bounds everything below: its deadline is the
	// connection's, and its end unblocks a read or write under way.
	if d, ok := ctx.Deadline(); ok {
		_ = tcp.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = tcp.SetDeadline(time.Unix(1, 0)) })
	conn := tcp
	resp, err := g.exchange(ctx, &conn, req)
	if !stop() { // the context ended: what failed, failed for that
		if err == nil {
			resp.Body.Close()
		}
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if resp.StatusCode == http.StatusSwitchingProtocols {
		*g.raw = conn
	}
	return resp, nil
}

// exchange does TLS when the URL asks for it, writes req and reads its
// answer; *conn becomes the TLS connection.
func (g *upgrader) exchange(ctx context.Context, conn *net.Conn, req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "https" {
		tc := &tls.Config{}
		if g.tls != nil {
			tc = g.tls.Clone()
		}
		if tc.ServerName == "" {
			tc.ServerName = req.URL.Hostname()
		}
		tc.NextProtos = []string{"http/1.1"} // an upgrade is HTTP/1.1 only
		t := tls.Client(*conn, tc)
		*conn = t
		if err := t.HandshakeContext(ctx); err != nil {
			return nil, err
		}
	}
	if err := req.Write(*conn); err != nil {
		return nil, err
	}
	// The answer is read through a limit, as net/http bounds response
	// headers: an upstream cannot make the handshake's buffer grow without
	// end. An error's body is read through the same limit (openLane keeps
	// at most maxErrorBody of it).
	br := bufio.NewReader(io.LimitReader(*conn, maxUpgradeAnswer))
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("read the upgrade's answer: %w", err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &upgradedConn{Conn: *conn, br: br}
	} else {
		resp.Body = &answerBody{ReadCloser: resp.Body, conn: *conn}
	}
	return resp, nil
}

// upgradedConn is the connection after a 101: bytes the upstream sent right
// behind its answer are read first, then the connection directly (the
// handshake's buffer is let go once it is empty).
type upgradedConn struct {
	net.Conn
	br *bufio.Reader // nil once drained
}

func (c *upgradedConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// answerBody is a refused upgrade's body; closing it closes the connection,
// which carries nothing else.
type answerBody struct {
	io.ReadCloser
	conn net.Conn
}

func (b *answerBody) Close() error {
	return errors.Join(b.ReadCloser.Close(), b.conn.Close())
}

// hostPort is u's host with its scheme's port when it names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
