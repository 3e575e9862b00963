package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// maxChainedResponses bounds the response ids one connection remembers for
// previous_response_id.
const maxChainedResponses = 256

// wsConn is one accepted Responses WebSocket.
type wsConn struct {
	id      int64
	ws      *websocket.Conn // its Close methods may be called from Close
	account string          // static: the handshake's account
	started time.Time       // static: real time of the upgrade
	maxAge  time.Duration   // static: 0 for none

	// Owned by the connection's serve loop.
	responses map[string]int // response id -> context tokens
	order     []string       // response ids, oldest first
}

func (c *wsConn) remember(id string, tokens int) {
	if len(c.order) >= maxChainedResponses {
		delete(c.responses, c.order[0])
		c.order = c.order[1:]
	}
	c.responses[id] = tokens
	c.order = append(c.order, id)
}

func (c *wsConn) lookup(id string) (int, bool) {
	t, ok := c.responses[id]
	return t, ok
}

func isWebSocketUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// handleWebSocket serves GET {base}/responses: a Responses WebSocket. The
// upgrade is authenticated like a POST and carries the rate-limit headers;
// then each response.create message is answered with its events, one
// request at a time, and previous_response_id finds only responses of this
// connection.
func (s *Server) handleWebSocket(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := headerRecord(r, RecordHandshake, TransportWS, RouteResponses, s.cfg.Now())
		rec.ConnID = s.ids.Add(1)
		ref := s.rec.add(rec)
		if !isWebSocketUpgrade(r) {
			e := wire.Error{Type: wire.TypeInvalidRequest, Message: "GET on this path must be a WebSocket upgrade; send a response with POST."}
			w.Header().Set("Upgrade", "websocket")
			ref.fail(http.StatusUpgradeRequired, e, s.cfg.Now())
			writeError(w, http.StatusUpgradeRequired, e, nil)
			return
		}
		acct, fail := s.authenticate(r, kind, true, ref)
		if fail != nil {
			ref.fail(fail.status, fail.err, s.cfg.Now())
			writeError(w, fail.status, fail.err, nil)
			return
		}

		s.mu.Lock()
		fault, fired := s.faults.check(faultSite{account: acct.ID, transport: TransportWS, route: RouteResponses, handshake: true})
		st := s.accounts[acct.ID]
		var rl wire.RateLimits
		if st != nil {
			rl = st.rateLimits()
		}
		s.mu.Unlock()
		var maxAge time.Duration
		if fired {
			ref.update(func(r *Record) { r.Fault = fault.Kind })
			switch fault.Kind {
			case FaultRefuseWebSocket:
				status := fault.Status
				if status == 0 {
					status = http.StatusUpgradeRequired
				}
				e := wire.Error{Type: wire.TypeInvalidRequest, Code: "websocket_unavailable",
					Message: "Responses WebSocket is not available; use HTTP."}
				ref.fail(status, e, s.cfg.Now())
				writeError(w, status, e, &rl)
				return
			case FaultWebSocketMaxAge:
				maxAge = time.Duration(fault.MaxAge)
			}
		}

		rl.SetHeaders(w.Header())
		// Finished before the client can see the 101, corrected on failure.
		ref.finish(http.StatusSwitchingProtocols, OutcomeUpgraded, s.cfg.Now())
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
			InsecureSkipVerify: true, // a loopback test upstream: any origin
			CompressionMode:    s.cfg.wsCompression(),
		})
		if err != nil {
			// Accept has answered the client already.
			ref.fail(http.StatusBadRequest, wire.Error{Message: err.Error()}, s.cfg.Now())
			s.cfg.Logger.Warn("websocket upgrade failed", "conn", rec.ConnID, "account", acct.ID, "err", err)
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(s.cfg.WSReadLimit)

		conn := &wsConn{id: rec.ConnID, ws: c, account: acct.ID, started: time.Now(), maxAge: maxAge,
			responses: map[string]int{}}
		if !s.track(conn) {
			return
		}
		defer s.untrack(conn)
		s.serveConn(conn, r)
	}
}

func (s *Server) track(c *wsConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *wsConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// serveConn runs one connection: a reader goroutine hands messages over one
// at a time, and this loop answers them. When the client goes away the
// reader cancels ctx, which also ends a stalled answer. It returns when the
// connection is done, after the reader has stopped.
func (s *Server) serveConn(conn *wsConn, r *http.Request) {
	ctx, cancel := context.WithCancel(s.ctx)
	msgs := make(chan []byte)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer cancel()
		for {
			_, data, err := conn.ws.Read(ctx)
			if err != nil {
				return
			}
			select {
			case msgs <- data:
			case <-ctx.Done():
				return
			}
		}
	})

	// aged ends when the connection reaches its maximum age (never, without
	// one): an idle connection is closed then, a response streaming then is
	// cut by the limit, as the upstream's hard limit does.
	aged := ctx
	if conn.maxAge > 0 {
		var stop context.CancelFunc
		aged, stop = context.WithDeadline(ctx, conn.started.Add(conn.maxAge))
		defer stop()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-aged.Done():
			if ctx.Err() == nil {
				s.closeAged(ctx, conn, nil)
			}
			return
		case data := <-msgs:
			ref := s.rec.add(s.messageRecord(r, conn))
			if aged.Err() != nil {
				s.closeAged(ctx, conn, &ref)
				return
			}
			if !s.answerMessage(ctx, aged, conn, data, ref) {
				return
			}
		}
	}
}

func (s *Server) messageRecord(r *http.Request, conn *wsConn) Record {
	rec := headerRecord(r, RecordMessage, TransportWS, RouteResponses, s.cfg.Now())
	rec.ConnID = conn.id
	rec.Account = conn.account
	rec.Method = ""
	return rec
}

// closeAged ends a connection past its maximum age the way the upstream
// does after 60 minutes: an error event (the answer of the message in ref,
// if any: one that arrived late, or one whose response the limit cut), then
// a close.
func (s *Server) closeAged(ctx context.Context, conn *wsConn, ref *recordRef) {
	e := wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodeWebSocketConnectionLimitReached,
		Message: fmt.Sprintf("Responses websocket connection limit reached (%s). Create a new websocket connection to continue.", conn.maxAge)}
	if ref != nil {
		ref.update(func(r *Record) { r.Fault = FaultWebSocketMaxAge })
		ref.event(wire.EventError)
		ref.fail(http.StatusBadRequest, e, s.cfg.Now())
	}
	if err := s.sendEvent(ctx, conn, wire.NewErrorEvent(http.StatusBadRequest, e, nil)); err != nil {
		s.cfg.Logger.Debug("websocket limit event not sent", "conn", conn.id, "err", err)
	}
	if err := conn.ws.Close(websocket.StatusNormalClosure, "connection limit reached"); err != nil {
		s.cfg.Logger.Debug("websocket close after max age", "conn", conn.id, "err", err)
	}
}

func (s *Server) sendEvent(ctx context.Context, conn *wsConn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return (&wsSink{c: conn.ws, timeout: s.cfg.WriteTimeout}).send(ctx, b)
}

// answerMessage answers one message; it reports whether the connection
// stays open. aged ends when the connection reaches its maximum age: a
// response still streaming then ends with the limit's error event, and the
// connection closes.
func (s *Server) answerMessage(ctx, aged context.Context, conn *wsConn, data []byte, ref recordRef) bool {
	reject := func(status int, e wire.Error, rl *wire.RateLimits) bool {
		var h http.Header
		if rl != nil {
			h = http.Header{}
			rl.SetHeaders(h)
		}
		ref.event(wire.EventError)
		ref.fail(status, e, s.cfg.Now())
		return s.sendEvent(ctx, conn, wire.NewErrorEvent(status, e, h)) == nil
	}
	typ, _ := wire.EventType(data)
	if typ == wire.MessageResponseProcessed {
		// An acknowledgement: recorded, never answered.
		ref.finish(http.StatusOK, OutcomeOK, s.cfg.Now())
		return true
	}
	if typ != wire.MessageResponseCreate {
		return reject(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest,
			Message: fmt.Sprintf("Unsupported message type %q: send response.create.", typ)}, nil)
	}
	req, err := parseResponseRequest(data)
	if err != nil {
		return reject(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()}, nil)
	}
	ref.noteRequest(req)

	var prev func(string) (int, bool) // nil when Stateless: nothing is ever found
	if !s.cfg.Stateless {
		stored := s.storedContext(conn.account)
		prev = func(id string) (int, bool) {
			if t, ok := conn.lookup(id); ok {
				return t, true
			}
			return stored(id) // a response the account stored over HTTP
		}
	}
	v := s.decide(call{transport: TransportWS, account: conn.account, req: req, ref: ref, prev: prev})
	if v.err != nil {
		return reject(v.status, *v.err, &v.rateLimits)
	}

	// The WebSocket carries in events what HTTP carries in headers: the
	// rate limits, and the turn state once per turn.
	pre := make([][]byte, 0, 2)
	rlEvent, _ := json.Marshal(wire.NewRateLimitsEvent(v.planType, v.rateLimits, s.cfg.Now().Unix()))
	pre = append(pre, rlEvent)
	if req.generates() && req.clientTurnState() == "" {
		ts := "ts_" + randomHex(12)
		md, _ := json.Marshal(object{"type": wire.EventResponseMetadata, "headers": object{wire.HeaderTurnState: ts}})
		pre = append(pre, md)
		ref.update(func(r *Record) { r.TurnStateSent = ts })
	}
	ref.update(func(r *Record) { r.ResponseID = v.responseID })

	// The stream's waits end with the connection's age; its writes only
	// with the connection (a write cut by a deadline would close it).
	sk := fixedCtxSink{sink: &wsSink{c: conn.ws, timeout: s.cfg.WriteTimeout}, ctx: ctx}
	outcome := s.stream(aged, sk, append(pre, v.events...), &v, ref)
	if (outcome == OutcomeGone || outcome == OutcomeStalled) && ctx.Err() == nil && aged.Err() != nil {
		s.closeAged(ctx, conn, &ref)
		return false
	}
	ref.finish(http.StatusOK, outcome, s.cfg.Now())
	switch outcome {
	case OutcomeCompleted:
		conn.remember(v.responseID, v.contextTokens)
		return true
	case OutcomeFailed:
		return true
	case OutcomeCut:
		_ = conn.ws.CloseNow()
	}
	return false
}

// fixedCtxSink sends through sink on ctx, whatever context the stream
// passes.
type fixedCtxSink struct {
	sink
	ctx context.Context
}

func (k fixedCtxSink) send(_ context.Context, data []byte) error { return k.sink.send(k.ctx, data) }

// wsSink writes events as text frames, each under a write deadline.
type wsSink struct {
	c       *websocket.Conn
	timeout time.Duration
}

func (k *wsSink) send(ctx context.Context, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	return k.c.Write(ctx, websocket.MessageText, data)
}
