package relay_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// The real Codex CLI keeps its WebSocket, over several messages on one
// connection (a tool call and its follow-up), whatever the relay answers
// its permessage-deflate offer with, against an upstream that compresses
// in either mode or not at all: the handshakes on both sides say what each
// setting promises, and compression really happens (Codex's requests
// arrive in fewer bytes when it is on).
func TestCodexWebSocketUnderEachCompression(t *testing.T) {
	const (
		pooledAnswer = "permessage-deflate; client_no_context_takeover; server_no_context_takeover"
		pooledOffer  = pooledAnswer
	)
	cases := []struct {
		name               string
		client, upstream   relay.CompressionMode
		sim                string // the simulated upstream's answer
		wantAnswer         string // the relay's answer to Codex's offer; "" none
		wantUpstreamOffer  string // what the relay offered the upstream
		compressedRequests bool
	}{
		{"default pooled, upstream takes over", "", "", "takeover", pooledAnswer, pooledOffer, true},
		{"takeover both sides", relay.CompressionTakeover, relay.CompressionTakeover, "takeover", "permessage-deflate", "permessage-deflate", true},
		{"takeover asked, pooled upstream", relay.CompressionTakeover, relay.CompressionTakeover, "pooled", "permessage-deflate", "permessage-deflate", true},
		{"off both sides", relay.CompressionOff, relay.CompressionOff, "pooled", "", "", false},
		{"pooled to a client, none upstream", relay.CompressionPooled, relay.CompressionOff, "takeover", pooledAnswer, "", true},
	}
	type outcome struct {
		readPerRequest float64 // bytes read from Codex per request it sent
	}
	var mu sync.Mutex
	got := map[string]outcome{}
	t.Run("group", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a")}, WSCompression: tc.sim},
					func(_ *harness, c *relay.Config) {
						c.ClientCompression = relay.Compression{Mode: tc.client}
						c.Upstream = relay.NewUpstreamWith(relay.UpstreamOptions{Compression: relay.Compression{Mode: tc.upstream}})
					})
				tap := &wireTap{next: h.relay}
				srv := httptest.NewServer(tap)
				t.Cleanup(srv.Close)
				_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "e2e"})
				require.NoError(t, err)
				codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/backend-api/codex", WebSockets: true, Key: key})

				res, err := codex.Exec(context.Background(), `run it [[sim:tool exec_command {"cmd":"echo compressed-ok"}]]`,
					codexcli.RunOptions{BypassSandbox: true})
				require.NoError(t, err)
				require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
				assert.Empty(t, res.WebSocketFallback(), "Codex must stay on its WebSocket")
				assert.Contains(t, res.FinalMessage, "compressed-ok", "the tool's output went up and the answer came back")

				handshakes := tap.handshakes()
				require.NotEmpty(t, handshakes)
				for _, hs := range handshakes {
					assert.Contains(t, hs.offered, "permessage-deflate", "Codex offers deflate")
					assert.Equal(t, tc.wantAnswer, hs.answered, "the relay's answer")
				}
				recs := h.sim.Records(sim.RecordFilter{Route: sim.RouteResponses})
				requests := 0
				for _, r := range recs {
					if r.Kind == sim.RecordHandshake {
						assert.Equal(t, tc.wantUpstreamOffer, r.WSExtensions, "what the relay offered the upstream")
					} else {
						assert.Equal(t, sim.TransportWS, r.Transport)
						requests++
					}
				}
				require.GreaterOrEqual(t, requests, 2, "the tool call's follow-up went on the same lane")
				mu.Lock()
				got[tc.name] = outcome{readPerRequest: float64(tap.read.Load()) / float64(requests)}
				t.Logf("%.0f B read from Codex a request", got[tc.name].readPerRequest)
				mu.Unlock()
			})
		}
	})
	if t.Failed() {
		return
	}
	off := got["off both sides"].readPerRequest
	require.Positive(t, off)
	for _, tc := range cases {
		if tc.compressedRequests {
			assert.Less(t, got[tc.name].readPerRequest, off*0.6,
				"%s: Codex's requests arrive compressed (%.0f B a request against %.0f B uncompressed)", tc.name, got[tc.name].readPerRequest, off)
		}
	}
}

// wireTap is a front to the relay that records WebSocket handshakes (what
// the client offered, what the relay answered) and counts the bytes read
// from upgraded connections.
type wireTap struct {
	next http.Handler
	read atomic.Int64

	mu  sync.Mutex
	hss []tappedHandshake
}

type tappedHandshake struct{ offered, answered string }

func (t *wireTap) handshakes() []tappedHandshake {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]tappedHandshake(nil), t.hss...)
}

func (t *wireTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		t.next.ServeHTTP(w, r)
		return
	}
	t.next.ServeHTTP(&tapWriter{ResponseWriter: w, tap: t, offered: r.Header.Get("Sec-WebSocket-Extensions")}, r)
}

type tapWriter struct {
	http.ResponseWriter
	tap     *wireTap
	offered string
}

func (w *tapWriter) WriteHeader(code int) {
	if code == http.StatusSwitchingProtocols {
		w.tap.mu.Lock()
		w.tap.hss = append(w.tap.hss, tappedHandshake{offered: w.offered, answered: w.Header().Get("Sec-WebSocket-Extensions")})
		w.tap.mu.Unlock()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *tapWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// coder/websocket reads what brw buffered, then the returned conn.
	return &countedConn{Conn: c, read: &w.tap.read}, brw, nil
}

type countedConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}
