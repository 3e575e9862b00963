package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay"
)

// smallBuffers makes every accepted connection's send buffer small, so a
// client that stops reading blocks the relay's writes after a few KB
// instead of megabytes.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// smallReader dials with a small receive buffer.
func smallReader(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	return c, err
}

// waitRequest waits for the request log row of a thread's request.
func (h *harness) waitRequest(thread string) store.RequestRecord {
	h.t.Helper()
	var got store.RequestRecord
	require.Eventually(h.t, func() bool {
		rows, _, err := h.store.Requests(context.Background(), store.RequestFilter{ThreadID: thread})
		require.NoError(h.t, err)
		if len(rows) == 0 {
			return false
		}
		got = rows[0]
		return true
	}, time.Minute, 20*time.Millisecond, "the request of thread %s was logged", thread)
	return got
}

// A client that stops reading is let go within the write timeout, on both
// transports: the attempt ends as client_stalled, the account's slot is
// free again and the upstream lane closed (it was mid-answer), and the
// request is logged as closed by the client.
func TestClientThatStopsReadingIsLetGo(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.ClientWriteTimeout = 300 * time.Millisecond }, simAccount("a1", "org-a"))
			srv := httptest.NewUnstartedServer(h.relay)
			srv.Listener = smallBuffers{srv.Listener}
			srv.Start()
			t.Cleanup(srv.Close)
			thread := "019a2222-0000-7000-8000-00000000000" + map[string]string{"http": "1", "ws": "2"}[transport]
			// The upstream is still answering when the client is let go
			// (one that had finished keeps its lane: see
			// TestClientLetGoAfterTheUpstreamFinishedKeepsTheLane).
			body := responseRequest("flood me [[sim:words 60000]] [[sim:events 64]] [[sim:gap 50ms]]")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			hc := &http.Client{Transport: &http.Transport{DialContext: smallReader}}
			if transport == "http" {
				b, _ := json.Marshal(body)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
				require.NoError(t, err)
				req.Header.Set("Thread-Id", thread)
				resp, err := hc.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				require.NoError(t, err)
				require.NotEmpty(t, line, "the stream began") // then the client reads no more
			} else {
				conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/backend-api/codex/responses",
					&websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"Thread-Id": {thread}}})
				require.NoError(t, err)
				defer conn.CloseNow()
				msg := map[string]any{"type": "response.create"}
				for k, v := range body {
					msg[k] = v
				}
				b, _ := json.Marshal(msg)
				require.NoError(t, conn.Write(ctx, websocket.MessageText, b))
				_, _, err = conn.Read(ctx)
				require.NoError(t, err, "the stream began") // then the client reads no more
			}
			rec := h.waitRequest(thread)
			assert.Equal(t, 499, rec.Status, "logged as closed by the client")
			assert.Equal(t, "client_stalled", rec.ErrorCode)
			atts, _, err := h.store.Attempts(context.Background(), storeFilterThread(thread))
			require.NoError(t, err)
			require.Len(t, atts, 1, "nothing was retried")
			assert.Equal(t, "client_stalled", atts[0].Class)
			assert.Equal(t, 0, h.relay.InFlight(h.ids["a1"]), "the account's slot is free")
			assert.Eventually(t, func() bool { return h.relay.Bridge().Len() == 0 }, time.Minute, 10*time.Millisecond,
				"the lane, mid-answer, was closed")
		})
	}
}

// A client that stops reading an answer of small events over HTTP is
// let go as client_stalled too: each event fits the response's buffer, so
// the write that blocks, and times out, is the flush after it
// (wire.SSEWriter.WriteEvent returns its error); dropping that error would
// leave the attempt to the request's context, which the failed write
// cancels, and record the client's stall as a hang-up.
//
// Behind a front that wraps the response writer and drops its flushes'
// errors, as echo's Response does in serve, the flush's error is read from
// the writer it wraps.
func TestClientThatStopsReadingSmallEventsIsStalled(t *testing.T) {
	t.Parallel()
	fronts := map[string]func(http.Handler) http.Handler{
		"bare": func(h http.Handler) http.Handler { return h },
		"behind a front that drops flush errors": func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(errorlessFlush{w}, r) })
		},
	}
	for name, front := range fronts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clientThatStopsReadingSmallEventsIsStalled(t, front)
		})
	}
}

// errorlessFlush wraps a response writer as echo's Response does: its Flush
// drops the error.
type errorlessFlush struct{ http.ResponseWriter }

func (w errorlessFlush) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w errorlessFlush) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func clientThatStopsReadingSmallEventsIsStalled(t *testing.T, front func(http.Handler) http.Handler) {
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.ClientWriteTimeout = 300 * time.Millisecond }, simAccount("a1", "org-a"))
	srv := httptest.NewUnstartedServer(front(h.relay))
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	const thread = "019a2222-0000-7000-8000-000000000003"
	// About 150 bytes an event, 3,000 of them 1 ms apart: far more than
	// the buffers between hold, each event far less than a write buffer.
	b, err := json.Marshal(responseRequest("flood me [[sim:words 3000]] [[sim:events 3000]] [[sim:gap 1ms]]"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Thread-Id", thread)
	resp, err := (&http.Client{Transport: &http.Transport{DialContext: smallReader}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.NotEmpty(t, line, "the stream began") // then the client reads no more

	rec := h.waitRequest(thread)
	assert.Equal(t, 499, rec.Status, "logged as closed by the client")
	assert.Equal(t, "client_stalled", rec.ErrorCode)
	atts, _, err := h.store.Attempts(context.Background(), storeFilterThread(thread))
	require.NoError(t, err)
	require.Len(t, atts, 1, "nothing was retried")
	assert.Equal(t, "client_stalled", atts[0].Class, "detail: %s", atts[0].Detail)
	h.requireUnpenalised("a1")
}

// A client that hangs up is a cancellation: logged as 499, never as an
// error of the relay, and not held against the account.
func TestClientThatHangsUpIsACancellation(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Logger = logs.Logger() }, simAccount("a1", "org-a"))
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(responseRequest("slow [[sim:delay 3s]]"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Thread-Id", rootT)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return len(h.responseRecords(rootT)) == 1 }, time.Minute, 10*time.Millisecond, "the request went upstream")
	cancel()
	<-done
	rec := h.waitRequest(rootT)
	assert.Equal(t, 499, rec.Status)
	assert.Equal(t, "cancelled", rec.ErrorCode)
	a, err := h.store.Account(context.Background(), h.ids["a1"])
	require.NoError(t, err)
	assert.Equal(t, store.StatusActive, a.Status, "the account is not penalised")
	assert.NotContains(t, logs.String(), "level=ERROR", "a hang-up is no error of the relay")
	assert.Len(t, h.responseRecords(rootT), 1, "nothing was retried")
}

// A WebSocket session keeps reading while a response streams: the client's
// pings are answered, messages it sends meanwhile are served in turn, and
// past a small bound it is told to wait instead of being dropped silently.
func TestWebSocketKeepsReadingWhileAResponseStreams(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	c := h.dialWS(sessionS, rootT)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(prompt string) {
		msg := map[string]any{"type": "response.create"}
		for k, v := range responseRequest(prompt) {
			msg[k] = v
		}
		b, _ := json.Marshal(msg)
		require.NoError(t, c.conn.Write(ctx, websocket.MessageText, b))
	}
	send("slow [[sim:events 6]] [[sim:gap 250ms]]")
	// The first event says the session took the request off its queue
	// (else the queue would hold it beside the ones below, and the split
	// between queued and refused would depend on the scheduler).
	_, first, err := c.conn.Read(ctx)
	require.NoError(t, err)
	typ, _ := wire.EventType(first)
	require.NotEmpty(t, typ, "an event of the first response")
	// Codex sends one request at a time; a client that sends more while one
	// streams has them queued, up to a bound.
	for range 6 {
		send("queued")
	}
	// The client reads on its own goroutine (a pong needs a reader) until
	// every request got its terminal event.
	type tally struct{ completed, refused int }
	got := make(chan tally, 1)
	go func() {
		var n tally
		defer func() { got <- n }()
		for n.completed+n.refused < 7 {
			_, data, err := c.conn.Read(ctx)
			if err != nil {
				return
			}
			var ev map[string]any
			require.NoError(t, json.Unmarshal(data, &ev))
			switch ev["type"] {
			case "response.completed":
				n.completed++
			case "error":
				assert.Equal(t, "too_many_pending_requests", ev["error"].(map[string]any)["code"])
				n.refused++
			}
		}
	}()
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	defer pcancel()
	require.NoError(t, c.conn.Ping(pctx), "the relay answers pings while a response streams")
	n := <-got
	assert.Equal(t, 5, n.completed, "the streaming request and four queued ones")
	assert.Equal(t, 2, n.refused, "past the bound the client is told to wait")
	typ, _ = lastEvent(c.turn(responseRequest("and the connection still serves")))
	assert.Equal(t, "response.completed", typ)
}

// A client may send its first message right behind its handshake, before
// the 101 reaches it: net/http then holds that frame in its buffer when the
// connection is hijacked, and the session reads it first.
func TestAFrameSentBehindTheHandshakeIsServed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	msg := map[string]any{"type": "response.create"}
	for k, v := range responseRequest("sent with the handshake") {
		msg[k] = v
	}
	payload, _ := json.Marshal(msg)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &pipelining{Conn: c, frame: maskedTextFrame(payload)}, nil
	}
	hdr := http.Header{"Thread-Id": {rootT}, "Session-Id": {sessionS}, "Openai-Beta": {"responses_websockets=2026-02-06"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "ws" + strings.TrimPrefix(h.codexBaseURL(), "http") + "/responses"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr,
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}}})
	require.NoError(t, err)
	defer conn.CloseNow()
	c := &wsClient{t: t, conn: conn}
	typ, _ := lastEvent(c.events(ctx))
	assert.Equal(t, "response.completed", typ, "the frame sent with the handshake was served")
	typ, _ = lastEvent(c.turn(responseRequest("and the next one")))
	assert.Equal(t, "response.completed", typ)
	assert.Len(t, h.responseRecords(rootT), 2)
}

// A WebSocket session does not hold its upgrade request's handler: the
// handler returns once the connection is hijacked (net/http then frees what
// it kept for the request), and the session goes on serving turns.
func TestAWebSocketSessionOutlivesItsHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	returned := make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.relay.ServeHTTP(w, r)
		returned <- struct{}{}
	}))
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hdr := http.Header{"Thread-Id": {rootT}, "Session-Id": {sessionS}, "Openai-Beta": {"responses_websockets=2026-02-06"}}
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+"/backend-api/codex/responses", &websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(t, err)
	defer conn.CloseNow()
	select {
	case <-returned:
	case <-ctx.Done():
		t.Fatal("the upgrade's handler is still running while its session is open")
	}
	c := &wsClient{t: t, conn: conn}
	for _, prompt := range []string{"first", "second"} {
		typ, _ := lastEvent(c.turn(responseRequest(prompt)))
		assert.Equal(t, "response.completed", typ, "the session serves after its handler returned")
	}
}

// pipelining sends frame in the same write as the handshake request.
type pipelining struct {
	net.Conn
	frame []byte
}

func (c *pipelining) Write(p []byte) (int, error) {
	if c.frame == nil {
		return c.Conn.Write(p)
	}
	b := append(append([]byte(nil), p...), c.frame...)
	c.frame = nil
	if _, err := c.Conn.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// maskedTextFrame is one final text frame as a client sends it (masked,
// uncompressed).
func maskedTextFrame(payload []byte) []byte {
	f := []byte{0x81}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	default:
		panic("test frame too large")
	}
	key := [4]byte{0x1f, 0x2e, 0x3d, 0x4c}
	f = append(f, key[:]...)
	for i, b := range payload {
		f = append(f, b^key[i%4])
	}
	return f
}

// A request larger than an upstream WebSocket takes is served over plain
// HTTP on the same account, from an HTTP client of a thread (the bridge)
// and from a WebSocket client alike; no other account is spent on it.
func TestLargeRequestsGoOverHTTP(t *testing.T) {
	t.Parallel()
	// The sim takes WebSocket messages up to 1 MiB here: below the relay's
	// own lane limit, so the refusal comes from the upstream (close 1009).
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a"), simAccount("a2", "org-a")}, WSReadLimit: 1 << 20, Logger: testLogger(t)},
		func(*harness, *relay.Config) {})
	big := responseRequest("big")
	big["input"] = append([]any{map[string]any{"type": "message", "role": "user", "content": []any{
		map[string]any{"type": "input_text", "text": strings.Repeat("x", 2<<20)}}}}, big["input"].([]any)...)

	resp, body := h.post(sessionS, rootT, big, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "response.completed")
	recs := h.responseRecords(rootT)
	var accounts []string
	for _, r := range recs {
		accounts = append(accounts, r.Account)
	}
	require.NotEmpty(t, recs)
	assert.Equal(t, sim.TransportHTTP, recs[len(recs)-1].Transport, "served over HTTP")
	assert.Len(t, uniq(accounts), 1, "one account only: %v", accounts)

	c := h.dialWS(sessionS, childT)
	events := c.turn(big)
	typ, _ := lastEvent(events)
	assert.Equal(t, "response.completed", typ)
	recs = h.responseRecords(childT)
	require.NotEmpty(t, recs)
	assert.Equal(t, sim.TransportHTTP, recs[len(recs)-1].Transport)
	typ, _ = lastEvent(c.turn(responseRequest("and small ones go on the lane")))
	assert.Equal(t, "response.completed", typ)
	recs = h.responseRecords(childT)
	assert.Equal(t, sim.TransportWS, recs[len(recs)-1].Transport)
}

func uniq(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// Every upstream WebSocket of an account, a client WebSocket's as much as
// the HTTP bridge's, counts against one cap: more client sockets than the
// cap never open more upstream connections than it, and each is served
// (an idle lane of another connection gives way).
func TestOneLaneCapPerAccount(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		c.Bridge = bridge.PoolConfig{MaxLanesPerAccount: 2, WaitTimeout: time.Minute}
	}, simAccount("a1", "org-a"))
	var clients []*wsClient
	for i := range 5 {
		clients = append(clients, h.dialWS(sessionS, "019a3333-0000-7000-8000-00000000000"+string(rune('0'+i))))
	}
	resp, body := h.post(sessionS, rootT, responseRequest("bridged"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	for round := range 2 {
		for i, c := range clients {
			typ, _ := lastEvent(c.turn(responseRequest("hello")))
			require.Equal(t, "response.completed", typ, "client %d, round %d", i, round)
			open, max := h.relay.AccountLanes(h.ids["a1"])
			assert.LessOrEqual(t, open, 2, "never more lanes than the cap")
			assert.Equal(t, 2, max)
		}
	}
	lanes := h.relay.Lanes()
	assert.LessOrEqual(t, len(lanes), 2)
	for _, l := range lanes {
		assert.Contains(t, []string{"direct", "bridge"}, l.Kind)
	}
}

// A request body must arrive in time and within its size, however it is
// sent: a client that trickles its body is cut (408), and an oversized body
// is refused with 413 whether it announced its length or came chunked.
func TestRequestBodiesHaveADeadlineAndALimit(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		c.BodyReadTimeout = 300 * time.Millisecond
		c.MaxBodyBytes = 64 << 10
	}, simAccount("a1", "org-a"))
	addr := strings.TrimPrefix(h.srv.URL, "http://")

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("POST /backend-api/codex/responses HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the relay answers a trickling body instead of waiting for it")
	body := readAllString(t, resp)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, body)
	assert.Contains(t, body, "request_timeout")

	big := bytes.Repeat([]byte("x"), 100<<10)
	for _, chunked := range []bool{false, true} {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/backend-api/codex/responses", bytes.NewReader(big))
		require.NoError(t, err)
		if chunked {
			req.ContentLength = -1 // sent chunked
			req.Body = io.NopCloser(bytes.NewReader(big))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body := readAllString(t, resp)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "chunked %v: %s", chunked, body)
		assert.Contains(t, body, "request_too_large")
	}
	assert.Empty(t, h.responseRecords(""), "nothing went upstream")
}

// Lane metrics count each lane once, of either kind: one opened, a chained
// request rebuilt in full on a new lane counted as rebuilt.
func TestLaneMetricsCountEachLaneOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Registry = reg }, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	h.setUsed("a2", 50)
	resp, body := h.post(sessionS, rootT, responseRequest("over the bridge"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	c := h.dialWS(sessionS, childT)
	typ, id := lastEvent(c.turn(responseRequest("over a client's lane")))
	require.Equal(t, "response.completed", typ)
	assert.Equal(t, 2.0, laneEvents(t, reg)["opened"], "two lanes, each counted once")

	h.pause("a1") // the WebSocket's next turn moves: rebuilt in full on a new lane
	typ, _ = lastEvent(c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id, "input": []any{userMessage("moved")}}))
	require.Equal(t, "response.completed", typ)
	events := laneEvents(t, reg)
	assert.Equal(t, 3.0, events["opened"])
	assert.Equal(t, 1.0, events["rebuilt"])
	assert.Equal(t, 1.0, events["retired"], "the lane on the paused account")
}

// laneEvents reads codex_relay_lanes_total by event.
func laneEvents(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "codex_relay_lanes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
