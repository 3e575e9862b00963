package app

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstByteServer serves a plain handler as the relay's HTTP server does,
// with the given header and idle deadlines.
func firstByteServer(t *testing.T, header, idle time.Duration) string {
	t.Helper()
	hs := httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}), slog.New(slog.DiscardHandler))
	hs.ReadHeaderTimeout, hs.IdleTimeout = header, idle
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = serveHTTP(hs, ln) }()
	t.Cleanup(func() { _ = hs.Close(); <-done })
	return ln.Addr().String()
}

// readUntilClosed reads c until the server closes it, within limit, and
// reports whether it did.
func readUntilClosed(c net.Conn, limit time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// A connection a client dialled ahead and kept unused past the header
// deadline still serves its first request: until its first byte it is
// idle, as a kept-alive connection between requests is.
func TestAConnectionDialledAheadServesItsFirstRequestLate(t *testing.T) {
	t.Parallel()
	c := dialQuiet(t, firstByteServer(t, 100*time.Millisecond, time.Minute), 500*time.Millisecond) // five header deadlines
	_, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost: relay\r\nContent-Length: 2\r\n\r\n{}")
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "the connection was kept for its first request")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// Headers that start but do not finish are still cut at the header
// deadline, counted from their first byte; a connection that sends nothing
// is closed at the idle deadline.
func TestSlowHeadersAndSilentConnectionsAreStillCut(t *testing.T) {
	t.Parallel()
	c := dialQuiet(t, firstByteServer(t, 100*time.Millisecond, time.Minute), 300*time.Millisecond)
	_, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost:")
	require.NoError(t, err)
	assert.True(t, readUntilClosed(c, 10*time.Second), "half a request's headers: closed at the header deadline, not the idle one (a minute)")

	s := dialQuiet(t, firstByteServer(t, 100*time.Millisecond, 300*time.Millisecond), 0)
	assert.True(t, readUntilClosed(s, 10*time.Second), "a connection that sends nothing: closed at the idle deadline")
}

// dialQuiet connects to addr and sends nothing for quiet; the connection
// closes with the test.
func dialQuiet(t *testing.T, addr string, quiet time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	time.Sleep(quiet)
	return c
}
