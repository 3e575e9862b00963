package relay

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// Client connection timings.
const (
	clientPingEvery   = 30 * time.Second
	clientPingTimeout = 20 * time.Second
)

// maxPendingMessages bounds the client messages a WebSocket session holds
// while a response streams. Codex sends one request at a time; a client
// that sends more is told so, and the extra message is dropped.
const maxPendingMessages = 4

// wsSession is one client WebSocket: its requests are served one at a time
// over the connection's own upstream lane. Owned by serveWebSocket (see
// run).
type wsSession struct {
	s      *Server
	conn   *websocket.Conn
	id     string // names the connection's direct lane; static
	ident  Identity
	header http.Header // handshake headers, forwarded upstream; static
	path   string
	// client is the caller as last checked: its key is read again before
	// every request (revoked, expired or changed keys take effect at the
	// next request). Owned by the serving loop.
	client client
	// turnState is the turn state the relay issued on this connection, for
	// an upstream that gives none; owned by the serving loop.
	turnState string
	// writes ends the connection when a write to the client is stuck.
	writes writeGuard
}

func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	cl, ident, ok := s.admitIdentified(w, r)
	if !ok {
		return
	}
	if !s.sessions.start() {
		writeError(w, http.StatusServiceUnavailable, apiError{Type: wire.TypeServerError, Code: "shutting_down", Message: "the relay is shutting down"})
		return
	}
	c := s.cfg.ClientCompression
	conn, err := websocket.Accept(smallHijack{w}, r, &websocket.AcceptOptions{CompressionMode: c.websocketMode(), CompressionThreshold: c.threshold()})
	if err != nil {
		s.sessions.end()
		return // Accept has answered the client
	}
	ws := &wsSession{s: s, conn: conn, id: store.NewID("ws", s.cfg.Now()), client: cl, ident: ident,
		header: r.Header.Clone(), path: r.URL.Path, writes: writeGuard{timeout: s.cfg.ClientWriteTimeout, onStuck: func() { conn.CloseNow() }}} // a client that stopped reading is let go
	// The session runs on its own goroutine, and the handler returns: the
	// connection is hijacked, so net/http has nothing left to do with it,
	// and what it holds for a request (its buffers, the request, the
	// response, the handler's frames) is freed instead of living as long
	// as the session. The request's context ends when the handler returns;
	// its values stay.
	go ws.serveSession(context.WithoutCancel(r.Context()))
}

// serveSession serves the session until it ends, then closes the
// connection. A panic ends this session only, as net/http would have
// ended the connection of a handler that panicked.
func (ws *wsSession) serveSession(ctx context.Context) {
	s, conn := ws.s, ws.conn
	defer s.sessions.end()
	defer conn.CloseNow()
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("websocket session panicked", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	// The session ends with its client or with the relay.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()
	conn.SetReadLimit(MaxMessageBytes)
	defer s.pool.Drop(ws.laneKey())
	err := ws.run(ctx)
	if s.closing.Err() != nil {
		conn.Close(websocket.StatusGoingAway, "relay shutting down")
		return
	}
	if errors.Is(err, errDraining) {
		return // closed with 1012 already (closeDraining)
	}
	if err != nil && !isNormalClose(err) && ctx.Err() == nil {
		s.log.Debug("websocket session ended", "err", err)
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

// Buffer sizes of a client WebSocket's hijacked connection. net/http's are
// 4 KiB each; a session's messages are mostly events of a few hundred
// bytes, and anything larger than a buffer goes to or from the connection
// directly (bufio copies only what does not fill it), so smaller buffers
// cost a large message a second system call, not a copy.
const (
	clientReadBuffer  = 1 << 10
	clientWriteBuffer = 2 << 10
)

// smallHijack hands websocket.Accept the hijacked connection with buffers
// of its own size (clientReadBuffer, clientWriteBuffer) instead of
// net/http's: those would live as long as the session.
type smallHijack struct{ http.ResponseWriter }

func (h smallHijack) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func (h smallHijack) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Flush(); err != nil { // net/http flushed the 101; nothing should be left
		conn.Close()
		return nil, nil, err
	}
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the client sent right behind its handshake: the connection
		// gives them first (Accept reads the connection itself, past
		// whatever it finds buffered).
		b, _ := brw.Reader.Peek(n)
		conn = &prefixedConn{Conn: conn, pre: bytes.Clone(b)}
	}
	return conn, bufio.NewReadWriter(bufio.NewReaderSize(conn, clientReadBuffer), bufio.NewWriterSize(conn, clientWriteBuffer)), nil
}

// prefixedConn reads pre before the connection.
type prefixedConn struct {
	net.Conn
	pre []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// laneKey is the connection's own lane: the thread's, on this connection.
func (ws *wsSession) laneKey() bridge.Key {
	return bridge.Key{Thread: string(ws.ident.Key), Scope: ws.client.scope(), Conn: ws.id}
}

// isNormalClose reports a client that ended its connection the ordinary
// way: a close frame, or simply dropping the connection (Codex does so when
// it exits after its final answer).
func isNormalClose(err error) bool {
	st := websocket.CloseStatus(err)
	return st == websocket.StatusNormalClosure || st == websocket.StatusGoingAway || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF)
}

// errSessionDone ends a session's goroutines once the client has gone.
var errSessionDone = errors.New("session done")

// errDraining ends a session between turns once the relay drains.
var errDraining = errors.New("relay draining")

// closeDraining closes the session with 1012 (service restart), while its
// reader still reads: the reader takes the client's answer to the close,
// so the client sees the code instead of a cut connection.
func (ws *wsSession) closeDraining() error {
	_ = ws.conn.Close(websocket.StatusServiceRestart, "relay restarting: reconnect")
	return errDraining
}

// sessionRefusedError ends a session whose client may no longer be served
// (its key was revoked or expired): the client reads err, and the
// connection closes with reason.
type sessionRefusedError struct {
	reason string
	err    error
}

func (e *sessionRefusedError) Error() string { return "session refused: " + e.reason }
func (e *sessionRefusedError) Unwrap() error { return e.err }

func refuseSession(reason, msg string) error {
	return &sessionRefusedError{reason: reason, err: unauthorized(msg)}
}

// run serves the session until the client leaves, the relay drains or
// closes, or a write fails. It serves requests on the calling goroutine;
// a reader goroutine always reads (so pings, pongs and a close are handled
// while a response streams), and a timer pings the client. The first
// error of either ends both, and is returned (nil for a client that
// left).
func (ws *wsSession) run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	msgs := make(chan []byte, maxPendingMessages)
	read := make(chan struct{})
	go func() {
		defer close(read)
		cancel(ws.read(ctx, msgs))
	}()
	pinger := ws.pingEvery(ctx, cancel, clientPingEvery)
	// Writes go without the session's context (see write); its end
	// closes the connection instead, which ends a write under way.
	stopClosing := context.AfterFunc(ctx, func() { ws.conn.CloseNow() })
	defer stopClosing()
	err := ws.serveLoop(ctx, msgs)
	cancel(err)
	pinger.Stop()
	<-read
	err = context.Cause(ctx)
	if errors.Is(err, errSessionDone) {
		return nil
	}
	return err
}

// errInvalidUTF8 ends a session whose client sent a text frame that is
// not UTF-8.
var errInvalidUTF8 = errors.New("client websocket: a text frame is not valid UTF-8 (closed with 1007)")

// read reads the client's messages into msgs until the connection ends,
// and closes msgs. A message that cannot be taken is answered with an
// error event.
func (ws *wsSession) read(ctx context.Context, msgs chan<- []byte) error {
	defer close(msgs)
	for {
		typ, data, err := ws.conn.Read(ctx)
		if err != nil {
			return err
		}
		var refusal []byte
		switch {
		case typ == websocket.MessageText && !utf8.Valid(data):
			// RFC 6455 8.1: an endpoint fails a connection whose text frame is
			// not UTF-8, with 1007. Forwarded, the upstream would read other
			// text than the relay (encoding/json reads the bytes as U+FFFD).
			_ = ws.conn.Close(websocket.StatusInvalidFramePayloadData, "a text frame is not valid UTF-8")
			return errInvalidUTF8
		case typ != websocket.MessageText:
			refusal = errorEvent(http.StatusBadRequest, apiError{Type: wire.TypeInvalidRequest, Code: "unsupported_frame",
				Message: "binary frames are not supported: send response.create as a text frame"})
		default:
			select {
			case msgs <- data:
				continue
			default:
				refusal = errorEvent(http.StatusTooManyRequests, apiError{Type: wire.TypeInvalidRequest, Code: "too_many_pending_requests",
					Message: "this connection serves one request at a time: wait for the current response to end"})
			}
		}
		if err := ws.write(ctx, refusal); err != nil {
			return err
		}
	}
}

// pingEvery pings the client every period from a timer (no goroutine
// waits between pings); a ping not answered in time ends the session
// through cancel. A ping that fails while a write to the client is under
// way (its frame waits behind that write, at most 5 s in coder/websocket,
// and a client that reads nothing answers no ping) lets a client go that
// stopped reading: the write fails as the client's stall, as when the
// write guard fires. Stop the returned timer when the session ends.
func (ws *wsSession) pingEvery(ctx context.Context, cancel context.CancelCauseFunc, period time.Duration) *time.Timer {
	var t *time.Timer
	t = time.AfterFunc(period, func() {
		pctx, done := context.WithTimeout(ctx, clientPingTimeout)
		err := ws.conn.Ping(pctx)
		done()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			if ws.writes.stall() {
				err = fmt.Errorf("%w: %w", errClientStalled, err)
			}
			cancel(fmt.Errorf("client ping: %w", err))
		default:
			t.Reset(period)
		}
	})
	return t
}

// serveLoop serves the client's messages one at a time until msgs closes
// (errSessionDone), a message ends the session, or the relay drains.
func (ws *wsSession) serveLoop(ctx context.Context, msgs <-chan []byte) error {
	for {
		// Between turns only: a turn under way finishes before a
		// drain ends the session.
		if ws.s.Draining() {
			return ws.closeDraining()
		}
		select {
		case msg, ok := <-msgs:
			if !ok {
				return errSessionDone
			}
			if err := ws.serve(ctx, msg); err != nil {
				return err
			}
		case <-ws.s.draining.Done():
			return ws.closeDraining()
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// write sends msg to the client. Its context is not handed to
// coder/websocket, which would arm a context.AfterFunc for every message
// under a cancellable one: a write ends when the session's context does
// (run closes the connection then), or when the write guard fires.
func (ws *wsSession) write(ctx context.Context, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ws.writes.begin()
	defer ws.writes.end()
	err := ws.conn.Write(context.Background(), websocket.MessageText, msg)
	if err != nil && ws.writes.fired() {
		return fmt.Errorf("%w: %w", errClientStalled, err)
	}
	return err
}

// errClientStalled is a write that failed because the client stopped
// reading: the write guard let it go.
var errClientStalled = fmt.Errorf("the client stopped reading: %w", os.ErrDeadlineExceeded)

// frameMembers are the members of a client's WebSocket message the relay
// reads besides the request body's (continuity.RequestFields reads those): its type.
var frameMembers = []string{"type"}

// clientMeta is the part of a response.create the relay reads beyond the
// request fields.
type clientMeta struct {
	Type           string            `json:"type"`
	ClientMetadata map[string]string `json:"client_metadata"`
}

// serve handles one client message. It returns an error only when the
// session must end (the client cannot be written to, or may no longer be
// served); a request's failures become error events.
func (ws *wsSession) serve(ctx context.Context, msg []byte) error {
	s := ws.s
	typ, _ := wire.EventType(msg)
	request := typ == wire.MessageResponseCreate || typ == ""
	if err := ws.admitTurn(ctx); err != nil {
		f, _ := failureFor(err, s.cfg.Now())
		if werr := ws.write(ctx, f.wsEvent()); werr != nil {
			return werr
		}
		var refused *sessionRefusedError
		if errors.As(err, &refused) {
			// Closed here, while the reader still reads: it takes the
			// client's answer to the close.
			_ = ws.conn.Close(websocket.StatusPolicyViolation, refused.reason)
			return err
		}
		return nil
	}
	// The type decides whether the frame is a request, policed, or passed
	// through as it came: the relay reads the first, an upstream may read
	// another, so a frame must hold it once, as written, before either.
	if err := continuity.CanonicalMembers(msg, "", frameMembers); err != nil {
		f, _ := failureFor(bodyRefusal("the message is not a valid WebSocket message: ", err), s.cfg.Now())
		return ws.write(ctx, f.wsEvent())
	}
	if !request {
		ws.passThrough(ctx, typ, msg)
		return nil
	}
	r, err := ws.parse(msg)
	if err != nil {
		f, _ := failureFor(err, s.cfg.Now())
		return ws.write(ctx, f.wsEvent())
	}
	c := &wsClient{ws: ws, ctx: ctx, r: r}
	s.attempts(ctx, r, c)
	return c.err
}

// passThrough passes a client frame that is no request (an
// acknowledgement, a message type this relay does not know) to the
// connection's upstream lane as it came, when the lane is open and idle;
// it answers nothing, as the upstream does not. With no open lane there
// is no upstream conversation it could belong to, and it is dropped.
func (ws *wsSession) passThrough(ctx context.Context, typ string, msg []byte) {
	err := ws.s.pool.SendIdle(ctx, ws.laneKey(), msg)
	ws.s.log.Debug("client frame passed through", "type", typ, "bytes", len(msg), "err", err)
}

// admitTurn checks, before each client message, that the connection's
// client may still be served: a keyed client's key is read again (cached
// briefly; revoking a key drops the cache on every replica at once); a
// keyless client is served only while no key was ever created.
func (ws *wsSession) admitTurn(ctx context.Context) error {
	s := ws.s
	if !ws.client.keyed {
		ever, err := s.cfg.Store.KeysEverCreated(ctx)
		if err != nil {
			return storeUnavailable("check client keys", err)
		}
		if ever {
			return refuseSession("client key required", "this relay now requires a client key: Authorization: Bearer crk_...")
		}
		return nil
	}
	k, err := s.cfg.Store.CurrentClientKey(ctx, ws.client.key.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return refuseSession("client key revoked", "this relay client key is unknown, revoked or expired")
	case err != nil:
		return storeUnavailable("check the client key", err)
	case !k.Usable(s.cfg.Now()):
		return refuseSession("client key revoked or expired", "this relay client key is unknown, revoked or expired")
	}
	ws.client.key = k
	return nil
}

// parse reads one response.create into a request.
func (ws *wsSession) parse(msg []byte) (*request, error) {
	var meta clientMeta
	if err := json.Unmarshal(msg, &meta); err != nil {
		return nil, refuse(http.StatusBadRequest, "invalid_json", "the message is not valid JSON")
	}
	if meta.Type != wire.MessageResponseCreate {
		return nil, refuse(http.StatusBadRequest, "unsupported_message", fmt.Sprintf("unsupported message type %q: send response.create", meta.Type))
	}
	body := responseBody(msg)
	fields, err := continuity.RequestFields(body)
	if err != nil {
		return nil, bodyRefusal("the message is not a valid response.create: ", err)
	}
	pol, err := ws.client.police(body, fields)
	if err != nil {
		return nil, err
	}
	ts := strings.TrimSpace(meta.ClientMetadata[wire.HeaderTurnState])
	return ws.s.newRequest("ws", ws.path, "", ws.client, ws.ident, ws.header, body, pol, ts), nil
}

// wsClient answers one request of a WebSocket session: events as text
// frames, failures as error events.
type wsClient struct {
	ws      *wsSession
	ctx     context.Context // the session's, for this request's writes
	r       *request
	noticed bool
	// limitsSent: the request's own codex.rate_limits event went out.
	limitsSent bool
	// err is the first write that failed: the session ends with it.
	err error
}

func (c *wsClient) write(msg []byte) error {
	if c.err != nil {
		return c.err
	}
	c.err = c.ws.write(c.ctx, msg)
	return c.err
}

// lane is the connection's own lane.
func (c *wsClient) lane(*request) (bridge.Key, bool) { return c.ws.laneKey(), true }

func (c *wsClient) send(h *head, typ string, data []byte) error {
	if typ == wire.EventRateLimits {
		return nil // the serving account's figures: the client has its own
	}
	if err := c.sendLimits(h); err != nil {
		return err
	}
	if h.notice != "" && !c.noticed {
		c.noticed = true
		if err := c.write(noticeEvent(h.notice)); err != nil {
			return err
		}
	}
	if typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete {
		// The turn state travels as an event: the upstream's when its answer
		// carried it only in headers, or the relay's own.
		if h.turnState != "" && (h.tr == nil || h.tr.turnState != h.turnState) {
			meta := mustJSON(map[string]any{"type": wire.EventResponseMetadata, "headers": map[string]string{wire.HeaderTurnState: h.turnState}})
			if err := c.write(meta); err != nil {
				return err
			}
		}
	}
	c.ws.s.metrics.eventsWS.Inc()
	return c.write(data)
}

func (c *wsClient) fail(h *head, f *failure) error {
	if err := c.sendLimits(h); err != nil {
		return err
	}
	if f.event != nil {
		return c.write(scrubErrorEvent(f.event, h.limits))
	}
	return c.write(f.wsEvent())
}

// sendLimits sends, once per request and before anything else of its
// answer, what the client is told of its limits as a codex.rate_limits
// event (Codex reads it in place of the HTTP headers).
func (c *wsClient) sendLimits(h *head) error {
	if c.limitsSent || h.limits == nil {
		return nil
	}
	c.limitsSent = true
	return c.write(c.ws.s.limitsEvent(h.limits))
}

func (c *wsClient) reply(_ *head, _ int, _ []byte) error {
	return c.write(errorEvent(http.StatusBadGateway, apiError{Type: wire.TypeServerError, Code: "upstream_unexpected_answer",
		Message: "the upstream answered with a document instead of a stream"}))
}

func (c *wsClient) waiting(*head) {}

// issueTurnState: one per connection, kept for its life.
func (c *wsClient) issueTurnState() string {
	if c.ws.turnState == "" {
		c.ws.turnState = newTurnState()
	}
	return c.ws.turnState
}

// writeGuard closes a client connection whose write has been stuck for its
// timeout. One timer serves the session, armed around each write, so an
// event costs no context or timer of its own.
type writeGuard struct {
	timeout time.Duration // zero: clientWriteTimeout
	onStuck func()        // lets the client go; static
	// afterFunc starts the guard's timer; time.AfterFunc when nil (tests
	// replace it to fire the timer themselves).
	afterFunc func(time.Duration, func()) guardTimer
	mu        sync.Mutex
	active    int        // writes under way (the reader may write beside the serving loop)
	timer     guardTimer // fires onStuck; created on first use
	stuck     bool       // the timer fired, or a ping failed behind a write (stall): the connection was let go
}

// guardTimer is the part of *time.Timer the guard uses.
type guardTimer interface {
	Reset(time.Duration) bool
	Stop() bool
}

func (g *writeGuard) begin() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active++
	d := cmp.Or(g.timeout, clientWriteTimeout)
	if g.timer == nil {
		start := g.afterFunc
		if start == nil {
			start = func(d time.Duration, f func()) guardTimer { return time.AfterFunc(d, f) }
		}
		g.timer = start(d, func() {
			g.mu.Lock()
			g.stuck = true
			g.mu.Unlock()
			g.onStuck()
		})
		return
	}
	g.timer.Reset(d)
}

// stall marks the connection let go for a stuck write when a write is
// under way (the session ends for it), and reports whether one was.
func (g *writeGuard) stall() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active == 0 {
		return false
	}
	g.stuck = true
	return true
}

// fired reports whether the guard let the connection go.
func (g *writeGuard) fired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stuck
}

func (g *writeGuard) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active--; g.active == 0 {
		g.timer.Stop()
	}
}
