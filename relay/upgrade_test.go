package relay

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

// rawUpstream listens on loopback and hands each connection, with the
// upgrade request read from it, to answer.
func rawUpstream(t testing.TB, answer func(c net.Conn, req *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				answer(c, req)
			}()
		}
	}()
	return ln.Addr().String()
}

// switching is a 101 answer to req, with extra header lines.
func switching(req *http.Request, extra string) string {
	sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n" + extra + "\r\n"
}

func directTarget(addr string) target {
	return target{Account: store.Account{ID: "acc_direct", BaseURL: "http://" + addr}}
}

// A lane dialed without a proxy is upgraded in the caller's goroutine, and
// a message the upstream sends in the same write as its 101 answer (so it
// sits in the handshake's read buffer) is the lane's first message.
func TestDirectLaneKeepsWhatArrivesWithTheUpgrade(t *testing.T) {
	addr := rawUpstream(t, func(c net.Conn, req *http.Request) {
		frame := "\x81\x05hello" // one unmasked text frame
		_, _ = io.WriteString(c, switching(req, "X-Upstream: yes\r\n")+frame)
		_, _ = io.Copy(io.Discard, c)
	})
	u := NewUpstreamWith(UpstreamOptions{Compression: Compression{Mode: CompressionOff}})
	var raw net.Conn
	conn, resp, err := u.dialWebSocket(context.Background(), directTarget(addr), http.Header{}, &raw)
	require.NoError(t, err)
	defer conn.CloseNow()
	assert.Equal(t, "yes", resp.Header.Get("X-Upstream"), "the upgrade's headers reach the lane")
	require.NotNil(t, raw, "the lane knows its connection, to half-close it on a hang-up")
	assert.Equal(t, addr, raw.RemoteAddr().String())
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, msg, err := conn.Read(rctx)
	require.NoError(t, err, "the message sent with the 101")
	assert.Equal(t, "hello", string(msg))
}

// An upgrade answer whose headers run past maxUpgradeAnswer is an error,
// not a buffer that grows with whatever the upstream sends.
func TestDirectLaneRefusesAnOversizedAnswer(t *testing.T) {
	addr := rawUpstream(t, func(c net.Conn, req *http.Request) {
		var b strings.Builder
		for i := 0; b.Len() <= maxUpgradeAnswer; i++ {
			fmt.Fprintf(&b, "X-Filler-%d: %s\r\n", i, strings.Repeat("x", 1000))
		}
		_, _ = io.WriteString(c, switching(req, b.String()))
		_, _ = io.Copy(io.Discard, c)
	})
	u := NewUpstreamWith(UpstreamOptions{})
	var raw net.Conn
	_, _, err := u.dialWebSocket(context.Background(), directTarget(addr), http.Header{}, &raw)
	require.Error(t, err)
	assert.Nil(t, raw)
}

// An upstream that takes the connection and never answers is left when the
// request's context ends, not at the dial timeout.
func TestDirectLaneEndsWithTheRequest(t *testing.T) {
	asked := make(chan struct{})
	addr := rawUpstream(t, func(c net.Conn, _ *http.Request) {
		close(asked)
		_, _ = io.Copy(io.Discard, c) // until the relay closes
	})
	u := NewUpstreamWith(UpstreamOptions{})
	u.DialTimeout = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var raw net.Conn
		_, _, err := u.dialWebSocket(ctx, directTarget(addr), http.Header{}, &raw)
		done <- err
	}()
	<-asked
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("the dial outlived its request's context")
	}
}

// A refused upgrade hands back its status and body, and closing that body
// closes the connection (nothing else will ever use it).
func TestDirectLaneRefusalClosesItsConnection(t *testing.T) {
	closed := make(chan error, 1)
	addr := rawUpstream(t, func(c net.Conn, _ *http.Request) {
		body := `{"error":{"type":"invalid_request_error","code":"token_expired","message":"expired"}}`
		fmt.Fprintf(c, "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_, err := c.Read(make([]byte, 1))
		closed <- err
	})
	s := New(Config{Store: testStore(t), Upstream: NewUpstreamWith(UpstreamOptions{})})
	_, err := s.openLane(context.Background(), directTarget(addr), http.Header{})
	var de *dialStatusError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, http.StatusUnauthorized, de.status)
	require.NotNil(t, de.err)
	assert.Equal(t, "token_expired", de.err.Code)
	select {
	case err := <-closed:
		assert.True(t, errors.Is(err, io.EOF), "the upstream sees the connection closed: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the refused upgrade's connection stayed open")
	}
}

// BenchmarkLaneDial opens and closes upstream WebSockets from many
// goroutines at once, as a burst of new threads does: the relay's upgrade in
// the caller's goroutine against net/http's Transport, the way lanes were
// dialed before (its dial goroutine and the connection's read and write
// loops).
func BenchmarkLaneDial(b *testing.B) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		_, _, _ = c.Read(r.Context()) // until the client closes
		c.CloseNow()
	}))
	defer ts.Close()
	u := NewUpstreamWith(UpstreamOptions{Compression: Compression{Mode: CompressionOff}})
	t := target{Account: store.Account{ID: "acc_bench", BaseURL: ts.URL}}
	url := "ws://" + strings.TrimPrefix(t.ResponsesURL(""), "http://")
	for _, bc := range []struct {
		name string
		dial func(ctx context.Context) (*websocket.Conn, error)
	}{
		{"upgrader", func(ctx context.Context) (*websocket.Conn, error) {
			var raw net.Conn
			c, _, err := u.dialWebSocket(ctx, t, http.Header{}, &raw)
			return c, err
		}},
		{"http.Transport", func(ctx context.Context) (*websocket.Conn, error) {
			c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: u.HTTP, CompressionMode: websocket.CompressionDisabled})
			return c, err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(50)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, err := bc.dial(context.Background())
					if err != nil {
						b.Error(err)
						return
					}
					c.CloseNow()
				}
			})
		})
	}
}
