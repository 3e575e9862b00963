package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// The kinds of hostile connection.
const (
	kindSlowHTTP    = "slow reader (HTTP)"
	kindSlowWS      = "slow reader (WebSocket)"
	kindStalledHTTP = "stopped reader (HTTP)"
	kindStalledWS   = "stopped reader (WebSocket)"
	kindSlowloris   = "half-open: half a request's headers"
	kindWSSilent    = "half-open: WebSocket silent after the handshake"
	kindWSIdleTurn  = "half-open: WebSocket silent after one turn"
	kindSlowBody    = "half-open: body trickled a byte at a time"
)

var hostileExpect = map[string]string{
	kindSlowHTTP:    "events keep coming at the reader's pace, no failure",
	kindSlowWS:      "events keep coming at the reader's pace, no failure",
	kindStalledHTTP: "the relay closes the connection, the answer cut short (client write timeout)",
	kindStalledWS:   "the relay closes the connection, the answer cut short (client write timeout)",
	kindSlowloris:   "the relay closes the connection (read header timeout)",
	kindWSSilent:    "101, then held (the relay's pings go unanswered)",
	kindWSIdleTurn:  "the turn completes, then held with its idle lane",
	kindSlowBody:    "408 request_timeout (body read timeout)",
}

var hostileKinds = []string{kindSlowHTTP, kindSlowWS, kindStalledHTTP, kindStalledWS, kindSlowloris, kindWSSilent, kindWSIdleTurn, kindSlowBody}

// hostileClients are the hostile connections of one run.
type hostileClients struct {
	total   int
	stalled int // stopped readers
	inPlace sync.WaitGroup
	settled sync.WaitGroup // done by the ones the relay must end, once it did (or the wait ran out)
	done    sync.WaitGroup
	mu      sync.Mutex
	got     map[string]*hostileGroup // guarded by mu
	letGo   map[string][]letGoSample // stopped readers the relay closed, by kind; guarded by mu
}

// letGoSample is one stopped reader the relay closed.
type letGoSample struct {
	sent time.Time // its request
	rc   relayClose
}

func (hc *hostileClients) closedBy(kind string, sent time.Time, rc relayClose) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.letGo[kind] = append(hc.letGo[kind], letGoSample{sent, rc})
}

// letGoes sums up the closes of the stopped readers, by kind.
func (hc *hostileClients) letGoes() []hostileLetGo {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	var out []hostileLetGo
	for _, k := range []string{kindStalledHTTP, kindStalledWS} {
		ss := hc.letGo[k]
		if len(ss) == 0 {
			continue
		}
		l := hostileLetGo{Kind: k, Closed: len(ss)}
		var after, blocked, closed []time.Duration
		var written []int64
		for _, s := range ss {
			closed = append(closed, s.rc.At.Sub(s.sent))
			if s.rc.BlockedAt.IsZero() {
				l.Unblocked++
				continue
			}
			after = append(after, s.rc.BlockedAt.Sub(s.sent))
			blocked = append(blocked, s.rc.blocked())
			written = append(written, s.rc.Written)
		}
		l.BlockedAfter, l.Blocked, l.ClosedAfter = percentilesOf(after), percentilesOf(blocked), percentilesOf(closed)
		if len(written) > 0 {
			slices.Sort(written)
			l.WrittenP50, l.WrittenMax = written[(len(written)-1)/2], written[len(written)-1]
		}
		out = append(out, l)
	}
	return out
}

func (hc *hostileClients) record(kind string, ok bool, got string) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	g := hc.got[kind]
	g.Count++
	if ok {
		g.AsExpected++
	} else if g.FirstOther == "" {
		g.FirstOther = clipText(got, 300)
	}
}

func (hc *hostileClients) groups() []hostileGroup {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	var out []hostileGroup
	for _, k := range hostileKinds {
		if g := hc.got[k]; g.Count > 0 {
			out = append(out, *g)
		}
	}
	return out
}

// waitInPlace waits until every hostile connection is where it holds.
func (hc *hostileClients) waitInPlace(ctx context.Context, limit time.Duration) error {
	if !waitGroupWithin(ctx, &hc.inPlace, limit) {
		return fmt.Errorf("bench: hostile clients not in place within %s", limit)
	}
	return nil
}

func (hc *hostileClients) waitSettled(ctx context.Context, limit time.Duration) {
	waitGroupWithin(ctx, &hc.settled, limit)
}

func (hc *hostileClients) wait() { hc.done.Wait() }

// waitGroupWithin waits for wg, at most limit; it reports whether wg was
// done. The waiting goroutine it starts ends with wg.
func waitGroupWithin(ctx context.Context, wg *sync.WaitGroup, limit time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// startHostileClients opens every hostile connection, a few at a time, each
// in its own goroutine that ends when ctx does (or earlier).
func (e *hostileEnv) startHostileClients(ctx context.Context) *hostileClients {
	h := e.h
	hc := &hostileClients{got: map[string]*hostileGroup{}, letGo: map[string][]letGoSample{}}
	for _, k := range hostileKinds {
		hc.got[k] = &hostileGroup{Kind: k, Expect: hostileExpect[k]}
	}
	var kinds []string
	stalled := h.stopped
	for i := range h.stopped {
		kinds = append(kinds, []string{kindStalledHTTP, kindStalledWS}[i%2])
	}
	for i := range h.slowReaders {
		kinds = append(kinds, []string{kindSlowHTTP, kindSlowWS}[i%2])
	}
	for i := range h.halfOpen {
		kinds = append(kinds, []string{kindSlowloris, kindWSSilent, kindSlowBody, kindWSIdleTurn}[i%4])
	}
	hc.total, hc.stalled = len(kinds), stalled
	hc.inPlace.Add(len(kinds))
	hc.done.Add(len(kinds))
	reader := hostileReaderClient()
	slots := make(chan struct{}, hostileOpeners)
	hc.done.Add(1)
	go func() {
		defer hc.done.Done()
		defer reader.CloseIdleConnections()
		for i, kind := range kinds {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				// Never started: count them in place and done.
				for range kinds[i:] {
					hc.inPlace.Done()
					hc.done.Done()
				}
				return
			}
			settles := kind == kindStalledHTTP || kind == kindStalledWS || kind == kindSlowloris || kind == kindSlowBody
			if settles {
				hc.settled.Add(1)
			}
			go func() {
				defer hc.done.Done()
				c := hostileConn{e: e, hc: hc, kind: kind, session: store.NewID("hostile", time.Now()), client: reader}
				c.placed = sync.OnceFunc(func() { <-slots; hc.inPlace.Done() })
				c.settle = func() {}
				if settles {
					c.settle = sync.OnceFunc(hc.settled.Done)
				}
				defer c.placed()
				defer c.settle()
				ok, got := c.run(ctx)
				hc.record(kind, ok, got)
			}()
		}
	}()
	return hc
}

// hostileReaderClient is the HTTP client of the slow readers: a small
// socket receive buffer, so a relay writing to a reader that stopped
// blocks soon, and no connection reuse.
func hostileReaderClient() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { setReceiveBuffer(fd, hostileReadBuffer) })
	}}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DisableCompression: true, DialContext: d.DialContext}}
}

// hostileConn is one hostile connection.
type hostileConn struct {
	e       *hostileEnv
	hc      *hostileClients
	kind    string
	session string
	client  *http.Client
	placed  func() // called once the connection holds where it should
	settle  func() // called once the relay ended it as it must
}

// run plays the connection's part until ctx ends, and reports whether the
// relay answered it as it must, and what it got.
func (c *hostileConn) run(ctx context.Context) (bool, string) {
	switch c.kind {
	case kindSlowHTTP:
		return c.slowHTTP(ctx)
	case kindSlowWS:
		return c.slowWS(ctx)
	case kindStalledHTTP:
		return c.stoppedHTTP(ctx)
	case kindStalledWS:
		return c.stoppedWS(ctx)
	case kindSlowloris:
		return c.slowloris(ctx)
	case kindWSSilent:
		return c.wsSilent(ctx)
	case kindWSIdleTurn:
		return c.wsIdleTurn(ctx)
	default:
		return c.slowBody(ctx)
	}
}

// longPrompt asks for the slow readers' long answer: paced, or for the
// readers that stop, all at once (the relay's writes to them block at once).
func (c *hostileConn) longPrompt() []any {
	h := c.e.h
	text := fmt.Sprintf("hostile reader [[sim:words %d]] [[sim:events %d]] [[sim:gap %s]]", h.answerWords, h.answerEvents, h.answerGap)
	if c.kind == kindStalledHTTP || c.kind == kindStalledWS {
		text = fmt.Sprintf("hostile stopped reader [[sim:words %d]] [[sim:events %d]]", hostileStoppedWords, hostileStoppedEvents)
	}
	return []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}}
}

func (c *hostileConn) headers() http.Header {
	h := c.e.target.header(0)
	h.Set("Session-Id", c.session)
	h.Set("Thread-Id", c.session)
	h.Set("Originator", "codex-relay-bench-hostile")
	return h
}

// longRequest posts the long answer's request over HTTP; the caller closes
// the answer's body.
func (c *hostileConn) longRequest(ctx context.Context) (*http.Response, error) {
	body, _ := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false, "input": c.longPrompt()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.e.target.base+"/responses", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = c.headers()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return resp, nil
}

// slowHTTP asks for the long answer over HTTP and reads one event every
// readEvery until ctx ends.
func (c *hostileConn) slowHTTP(ctx context.Context) (bool, string) {
	resp, err := c.longRequest(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	events := wire.NewSSEReader(resp.Body, 0, 0)
	return c.readSlowly(ctx, func() ([]byte, error) {
		ev, err := events.Next()
		return ev.Data, err
	}, func() { resp.Body.Close() })
}

// readSlowly reads one event every readEvery until ctx ends; the first one
// places the connection. It fails on a read error or a terminal event
// other than response.completed.
func (c *hostileConn) readSlowly(ctx context.Context, next func() ([]byte, error), abort func()) (bool, string) {
	stop := context.AfterFunc(ctx, abort)
	defer stop()
	t := time.NewTicker(c.e.h.readEvery)
	defer t.Stop()
	for n := 0; ; n++ {
		data, err := next()
		if err != nil {
			if ctx.Err() != nil && n > 0 {
				return true, fmt.Sprintf("%d events read", n)
			}
			return false, fmt.Sprintf("read after %d events: %v", n, err)
		}
		c.placed()
		typ, _ := wire.EventType(data)
		if typ == wire.EventResponseCompleted {
			return true, fmt.Sprintf("completed after %d events", n+1)
		}
		if wire.IsTerminal(typ) || typ == "error" {
			return false, fmt.Sprintf("%s after %d events: %s", typ, n, clipText(string(data), 200))
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return true, fmt.Sprintf("%d events read", n+1)
		}
	}
}

// slowWS is slowHTTP over a WebSocket (no compression offered: a slow
// reader's bytes should be many).
func (c *hostileConn) slowWS(ctx context.Context) (bool, string) {
	conn, err := c.dialWS(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, c.longMessage()); err != nil {
		return false, "write: " + err.Error()
	}
	return c.readSlowly(ctx, func() ([]byte, error) {
		_, data, err := conn.Read(context.Background()) // ended by abort
		return data, err
	}, func() { conn.CloseNow() })
}

func (c *hostileConn) longMessage() []byte {
	msg, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false, "input": c.longPrompt()})
	return msg
}

// stoppedHTTP asks for the stopped readers' answer over HTTP and reads
// none of it: the relay must let it go (letGo).
func (c *hostileConn) stoppedHTTP(ctx context.Context) (bool, string) {
	tctx, watched := c.watchRelay(ctx)
	sent := time.Now()
	resp, err := c.longRequest(tctx)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	return c.letGo(ctx, sent, watched, func() (string, bool) {
		// A chunked answer cut short fails to read; one that ends
		// normally was never stalled on.
		cut := time.AfterFunc(hostileDrain, func() { resp.Body.Close() })
		n, err := io.Copy(io.Discard, resp.Body)
		if !cut.Stop() {
			return fmt.Sprintf("what the connection held (%s read) did not drain within %s", mibText(n), hostileDrain), false
		}
		if err == nil {
			return "the stream ended normally: the relay never stalled on this reader", false
		}
		return fmt.Sprintf("cut short after %s: %v", mibText(n), err), true
	})
}

// stoppedWS is stoppedHTTP over a WebSocket.
func (c *hostileConn) stoppedWS(ctx context.Context) (bool, string) {
	tctx, watched := c.watchRelay(ctx)
	conn, err := c.dialWS(tctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	sent := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, c.longMessage()); err != nil {
		return false, "write: " + err.Error()
	}
	return c.letGo(ctx, sent, watched, func() (string, bool) {
		rctx, cancel := context.WithTimeout(ctx, hostileDrain)
		defer cancel()
		for n := 0; ; n++ {
			_, data, err := conn.Read(rctx)
			if err != nil {
				if rctx.Err() != nil {
					return fmt.Sprintf("what the connection held (%d messages read) did not drain within %s", n, hostileDrain), false
				}
				return fmt.Sprintf("cut short after %d messages: %v", n, err), true
			}
			if typ, _ := wire.EventType(data); typ == wire.EventResponseCompleted {
				return "the answer completed: the relay never stalled on this reader", false
			}
		}
	})
}

// relayWatch is a stopped reader's connection as the relay's side of it
// is watched (relayConns).
type relayWatch struct {
	client string // the connection's local address
	*connWatch
}

// watchRelay returns ctx with a trace that registers, with the relay's
// side, the connection the request or handshake made under it gets; the
// channel holds the registration once it got one.
func (c *hostileConn) watchRelay(ctx context.Context) (context.Context, <-chan relayWatch) {
	got := make(chan relayWatch, 1)
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		a := i.Conn.LocalAddr().String()
		select {
		case got <- relayWatch{client: a, connWatch: c.e.conns.watch(a)}:
		default:
		}
	}}
	return httptrace.WithClientTrace(ctx, trace), got
}

// letGo waits, reading nothing, until the relay closes the connection,
// then reads what the kernel's buffers still hold of the answer with
// drain: it must end cut short, never complete. The reader cannot see the
// close without reading (it waits behind what the buffers hold), and
// reading would unblock the relay's writes, so the close is seen on the
// relay's side of the connection, and so are the relay's writes blocking:
// the relay must close the connection within its write timeout and
// hostileMargin of a write that stays blocked (the report's bound). When
// the writes block depends on how fast the relay produces the answer into
// the buffers, which is the load, not the relay's deadlines: that wait
// ends stoppedCap after the request.
func (c *hostileConn) letGo(ctx context.Context, sent time.Time, watched <-chan relayWatch, drain func() (string, bool)) (bool, string) {
	var w relayWatch
	select {
	case w = <-watched:
	default:
		return false, "no connection was seen to watch"
	}
	c.placed()
	fill := time.NewTimer(time.Until(sent.Add(c.e.h.stoppedCap)))
	defer fill.Stop()
	// letGo runs from the write that blocked (blockedAt): the relay's write
	// timeout, and the margin.
	letGo := time.NewTimer(time.Hour)
	letGo.Stop()
	defer letGo.Stop()
	var blockedAt time.Time
	bound := c.e.h.writeTimeout + hostileMargin
	armed := func(since time.Time) {
		blockedAt = since
		letGo.Reset(time.Until(since.Add(bound)))
	}
	filled := false // stoppedCap passed
	unfilled := func() (bool, string) {
		c.e.conns.forget(w.client)
		return false, fmt.Sprintf("the relay's writes to the connection had not blocked %s after the request (%s written, no write under way for %s): it was still filling the kernel's buffers",
			c.e.h.stoppedCap, mibText(w.state().Written), blockedAfter)
	}
	var rc relayClose
wait:
	for {
		select {
		case rc = <-w.closed:
			break wait
		case since := <-w.blocked:
			armed(since)
		case <-letGo.C:
			st := w.state()
			switch {
			case st.BlockedSince.IsZero():
				// The write went through after all: the relay is still
				// filling the buffers.
				if blockedAt = (time.Time{}); filled {
					return unfilled()
				}
				continue
			case st.BlockedSince.After(blockedAt):
				armed(st.BlockedSince) // another write blocked since
				continue
			}
			c.e.conns.forget(w.client)
			return false, fmt.Sprintf("the relay had not closed the connection %.1f s after its write to it blocked (%.1f s after the request, %s written): past its write timeout %s and %s",
				time.Since(blockedAt).Seconds(), blockedAt.Sub(sent).Seconds(), mibText(st.Written), c.e.h.writeTimeout, hostileMargin)
		case <-fill.C:
			if filled = true; blockedAt.IsZero() {
				return unfilled()
			}
			// Blocked: the relay's write timeout decides now.
		case <-ctx.Done():
			c.e.conns.forget(w.client)
			return false, fmt.Sprintf("the run ended before the relay closed the connection (%s written)", mibText(w.state().Written))
		}
	}
	c.hc.closedBy(c.kind, sent, rc)
	got, ok := drain()
	c.settle()
	return ok, fmt.Sprintf("closed %.1f s after the request: %s", rc.At.Sub(sent).Seconds(), got)
}

// dialWS opens the connection's WebSocket with a small receive buffer and
// no compression.
func (c *hostileConn) dialWS(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h := c.headers()
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	conn, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(c.e.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPClient: c.client, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("websocket dial: HTTP %d: %w", resp.StatusCode, err)
		}
		return nil, fmt.Errorf("websocket dial: %w", err)
	}
	conn.SetReadLimit(64 << 20)
	return conn, nil
}

// rawConn dials the relay for a hand-written request.
func (c *hostileConn) rawConn(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	return d.DialContext(ctx, "tcp", c.e.addr)
}

// requestHead writes a request line and headers (without the blank line
// that ends them).
func requestHead(method, path, host string, h http.Header) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	return b.String()
}

// slowloris sends half a request's headers and then nothing: the relay
// must close the connection within its read header timeout.
func (c *hostileConn) slowloris(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	head := requestHead(http.MethodPost, "/backend-api/codex/responses", c.e.addr, c.headers()) + "X-Hostile: half-sent"
	if _, err := io.WriteString(conn, head); err != nil {
		return false, "write: " + err.Error()
	}
	c.placed()
	return c.awaitClose(ctx, conn, c.e.h.readHeaderTimeout())
}

// awaitClose waits for the relay to close conn within limit (its read
// header timeout) and a margin.
func (c *hostileConn) awaitClose(ctx context.Context, conn net.Conn, limit time.Duration) (bool, string) {
	_ = conn.SetReadDeadline(time.Now().Add(limit + hostileMargin))
	got, err := io.ReadAll(io.LimitReader(conn, 64<<10))
	if ctx.Err() != nil {
		return false, "released before the relay closed it"
	}
	c.settle()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, fmt.Sprintf("still open after %s", limit+hostileMargin)
	}
	return true, fmt.Sprintf("closed after %d bytes: %s", len(got), firstLine(got))
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(line)
}

// wsHandshake sends a WebSocket handshake on a raw connection and reads
// the answer's head.
func (c *hostileConn) wsHandshake(conn net.Conn) (*http.Response, error) {
	h := c.headers()
	h.Set("Upgrade", "websocket")
	h.Set("Connection", "Upgrade")
	h.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	h.Set("Sec-WebSocket-Version", "13")
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	if _, err := io.WriteString(conn, requestHead(http.MethodGet, "/backend-api/codex/responses", c.e.addr, h)+"\r\n"); err != nil {
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	_ = conn.SetReadDeadline(time.Time{})
	return resp, err
}

// wsSilent finishes a WebSocket handshake and then neither reads, sends
// nor closes until released.
func (c *hostileConn) wsSilent(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	resp, err := c.wsHandshake(conn)
	if err != nil {
		return false, "handshake: " + err.Error()
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return false, fmt.Sprintf("handshake: HTTP %d", resp.StatusCode)
	}
	c.placed()
	<-ctx.Done()
	return true, "101, held"
}

// wsIdleTurn runs one short turn on a WebSocket, then neither reads, sends
// nor closes until released: its session keeps an idle lane, which the
// pool must hand to others when it runs out.
func (c *hostileConn) wsIdleTurn(ctx context.Context) (bool, string) {
	conn, err := c.dialWS(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	msg, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "idle after this [[sim:words 5]]"}}}}})
	if err := conn.Write(tctx, websocket.MessageText, msg); err != nil {
		return false, "write: " + err.Error()
	}
	for {
		_, data, err := conn.Read(tctx)
		if err != nil {
			return false, "read: " + err.Error()
		}
		typ, _ := wire.EventType(data)
		if typ == wire.EventResponseCompleted {
			break
		}
		if wire.IsTerminal(typ) || typ == "error" {
			return false, clipText(string(data), 200)
		}
	}
	c.placed()
	<-ctx.Done()
	return true, "completed, held"
}

// slowBody sends a request's headers and then its body one byte every
// readEvery: the relay must answer 408 within its body read timeout.
func (c *hostileConn) slowBody(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := c.headers()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", "100000")
	if _, err := io.WriteString(conn, requestHead(http.MethodPost, "/backend-api/codex/responses", c.e.addr, h)+"\r\n{"); err != nil {
		return false, "write: " + err.Error()
	}
	c.placed()
	answered := make(chan struct{})
	var got []byte
	var readErr error
	go func() {
		defer close(answered)
		_ = conn.SetReadDeadline(time.Now().Add(c.e.h.bodyTimeout + hostileMargin))
		got, readErr = io.ReadAll(io.LimitReader(conn, 64<<10))
	}()
	t := time.NewTicker(c.e.h.readEvery)
	defer t.Stop()
loop:
	for {
		select {
		case <-answered:
			break loop
		case <-t.C:
			_, _ = io.WriteString(conn, " ") // fails once the relay closed: the reader sees it
		}
	}
	if ctx.Err() != nil {
		return false, "released before the relay answered"
	}
	c.settle()
	if errors.Is(readErr, os.ErrDeadlineExceeded) {
		return false, fmt.Sprintf("no answer within %s", c.e.h.bodyTimeout+hostileMargin)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
	if err != nil {
		return false, fmt.Sprintf("answer: %v (%d bytes)", err, len(got))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusRequestTimeout && jsonErrorCode(b) == "request_timeout" {
		return true, "408 request_timeout"
	}
	return false, fmt.Sprintf("HTTP %d %s", resp.StatusCode, clipText(string(b), 200))
}

// jsonErrorCode is the code (or type) of a JSON error answer.
func jsonErrorCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return cmpOr(e.Error.Code, e.Error.Type)
}
