package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// Client connection timings.
const (
	clientWriteTimeout = 15 * time.Second
	clientPingEvery    = 30 * time.Second
	clientPingTimeout  = 20 * time.Second
)

// wsSession is one client WebSocket: requests arrive one at a time and are
// served over upstream lanes of this thread. Owned by serveWebSocket's
// errgroup: a reader, a pinger and the serving loop.
type wsSession struct {
	s      *Server
	conn   *websocket.Conn
	client client
	ident  Identity
	header http.Header // handshake headers, forwarded upstream
	path   string
	lane   *bridge.Lane // owned by the serving loop; read by laneInfo under infoMu
	// infoMu guards the fields operators read from other goroutines.
	infoMu    sync.Mutex
	laneView  *bridge.Lane // guarded by infoMu; the live lane, for laneInfo
	resetLane bool         // guarded by infoMu; an operator reset asks the loop to drop the lane
	// turnState is this thread's proxy-generated turn state, when the
	// upstream gives none; owned by the serving loop.
	turnState string
	// noChain: the upstream refused a chain on this session's lanes (it
	// keeps none); every request goes in full. Owned by the serving loop.
	noChain bool
	// writes ends the connection when a write to the client is stuck.
	writes writeGuard
}

// writeGuard closes a client connection whose write has been stuck for
// clientWriteTimeout. One timer serves the session, armed around each
// write, so an event costs no context or timer of its own.
type writeGuard struct {
	timeout time.Duration // zero: clientWriteTimeout
	mu      sync.Mutex
	active  int         // writes under way (the reader may write beside the serving loop)
	timer   *time.Timer // fires onStuck; created on first use
}

func (g *writeGuard) begin(onStuck func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active++
	d := cmp.Or(g.timeout, clientWriteTimeout)
	if g.timer == nil {
		g.timer = time.AfterFunc(d, onStuck)
		return
	}
	g.timer.Reset(d)
}

func (g *writeGuard) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active--; g.active == 0 {
		g.timer.Stop()
	}
}

func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	cl, ident, ok := s.admitIdentified(w, r)
	if !ok {
		return
	}
	s.sessions.Add(1)
	defer s.sessions.Done()
	if s.closing.Err() != nil {
		writeError(w, http.StatusServiceUnavailable, apiError{Type: "server_error", Message: "the relay is shutting down"})
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionContextTakeover})
	if err != nil {
		return // Accept has answered the client
	}
	defer conn.CloseNow()
	// The session ends with its client or with the relay.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()
	conn.SetReadLimit(MaxMessageBytes)
	sess := &wsSession{s: s, conn: conn, client: cl, ident: ident, header: r.Header.Clone(), path: r.URL.Path}
	s.registry.add(sess)
	defer s.registry.remove(sess)
	err = sess.run(ctx)
	if sess.lane != nil {
		sess.lane.Close()
		s.metrics.lanes.WithLabelValues("closed").Inc()
	}
	if err != nil && !isNormalClose(err) && ctx.Err() == nil {
		s.log.Debug("websocket session ended", "err", err)
	}
	if s.closing.Err() != nil {
		conn.Close(websocket.StatusGoingAway, "relay shutting down")
		return
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

func isNormalClose(err error) bool {
	st := websocket.CloseStatus(err)
	return st == websocket.StatusNormalClosure || st == websocket.StatusGoingAway || errors.Is(err, context.Canceled)
}

// errSessionDone ends a session's goroutines once the client has gone.
var errSessionDone = errors.New("session done")

func (ws *wsSession) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	msgs := make(chan []byte, 1)
	g.Go(func() error {
		defer close(msgs)
		for {
			typ, data, err := ws.conn.Read(ctx)
			if err != nil {
				return err
			}
			if typ != websocket.MessageText {
				if err := ws.write(ctx, errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "unsupported_frame",
					Message: "binary frames are not supported: send response.create as a text frame"})); err != nil {
					return err
				}
				continue
			}
			select {
			case msgs <- data:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	g.Go(func() error {
		t := time.NewTicker(clientPingEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				pctx, cancel := context.WithTimeout(ctx, clientPingTimeout)
				err := ws.conn.Ping(pctx)
				cancel()
				if err != nil && ctx.Err() == nil {
					return fmt.Errorf("client ping: %w", err)
				}
			}
		}
	})
	g.Go(func() error {
		for msg := range msgs {
			if err := ws.serve(ctx, msg); err != nil {
				return err
			}
		}
		return errSessionDone
	})
	err := g.Wait()
	if errors.Is(err, errSessionDone) {
		return nil
	}
	return err
}

func (ws *wsSession) write(ctx context.Context, msg []byte) error {
	ws.writes.begin(func() { ws.conn.CloseNow() }) // a client that stopped reading is let go
	defer ws.writes.end()
	return ws.conn.Write(ctx, websocket.MessageText, msg)
}

// clientMeta is the part of a response.create the relay reads beyond the
// request fields.
type clientMeta struct {
	Type           string            `json:"type"`
	ClientMetadata map[string]string `json:"client_metadata"`
}

// serve handles one response.create. It returns an error only when the
// client connection is unusable; request failures become error events.
func (ws *wsSession) serve(ctx context.Context, msg []byte) error {
	s := ws.s
	c := &call{id: store.NewID("req", s.cfg.Now()), start: s.cfg.Now(), transport: "ws", path: ws.path,
		client: ws.client, ident: ws.ident, header: ws.header}
	var meta clientMeta
	if err := json.Unmarshal(msg, &meta); err != nil {
		return ws.write(ctx, errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_json", Message: "the message is not valid JSON"}))
	}
	if meta.Type != wire.MessageResponseCreate {
		return ws.write(ctx, errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "unsupported_message",
			Message: fmt.Sprintf("unsupported message type %q: send response.create", meta.Type)}))
	}
	fields, err := continuity.RequestFields(msg)
	if err != nil {
		return ws.write(ctx, errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_json", Message: err.Error()}))
	}
	if !ws.client.allowsModel(fields.Model) {
		return ws.write(ctx, errorEvent(http.StatusForbidden, apiError{Type: "invalid_request_error", Code: "model_not_allowed", Message: fmt.Sprintf("this client key may not use model %q", fields.Model)}))
	}
	c.body, c.fields = msg, fields
	c.turnState = strings.TrimSpace(meta.ClientMetadata[wire.HeaderTurnState])

	var attempts []store.Attempt
	rec := store.RequestRecord{}
	defer func() { s.logRequest(c, rec, attempts) }()
	if ws.takeLaneReset() {
		ws.retireLane("reset")
	}
	exclude := map[string]bool{}
	prev := ""
	var firstFail []byte
	rc := newCiphertextRecovery(!s.cfg.DisableRecovery, c)
	refreshed := map[string]bool{}
	for n := 1; n <= s.cfg.MaxAttempts+1; n++ {
		laneOwner := ""
		if ws.lane != nil && ws.lane.Alive() {
			laneOwner = ws.lane.Account
		}
		ch, err := s.chooseFor(ctx, c, exclude, laneOwner, func() { ws.retireLane("replaced") })
		if err != nil {
			var none *NoAccountError
			if firstFail != nil && errors.As(err, &none) && none.EarliestReset.IsZero() {
				rec.Status, rec.ErrorCode = http.StatusBadGateway, "all_accounts_failed"
				return ws.write(ctx, firstFail)
			}
			a := selectionAnswer(err, s.cfg.Now())
			rec.Status, rec.ErrorCode = a.Status, cmp.Or(a.Err.Code, a.Err.Type)
			attempts = append(attempts, s.attemptRecord(c, n, "", prev, selectionClass(err), "", ActionTerminal, a.Status, a.Err.Code, err.Error(), s.cfg.Now(), 0))
			return ws.write(ctx, errorEvent(a.Status, a.Err))
		}
		started := s.cfg.Now()
		res := ws.attempt(ctx, c, ch)
		if res.clientErr != nil {
			return res.clientErr
		}
		if prev != "" && prev != ch.target.Account.ID && c.moveIsFailover() {
			c.recovery = RecoveryFailover
		}
		recovery := c.recovery
		s.metrics.attempts.WithLabelValues(ch.target.Account.ID, string(res.out.Class), string(res.out.Action)).Inc()
		if s.refreshAfter401(ctx, c, ch.target, res.out, refreshed) {
			ws.retireLane("replaced") // the lane was opened with the stale token
			attempts = append(attempts, s.attemptRecord(c, n, ch.target.Account.ID, prev, res.out.Class, "token_refresh", ActionSame, res.status, res.code, res.detail, started, res.firstEvent))
			prev = ch.target.Account.ID
			continue
		}
		attempts = append(attempts, s.attemptRecord(c, n, ch.target.Account.ID, prev, res.out.Class, recovery, res.out.Action, res.status, res.code, res.detail, started, res.firstEvent))
		rec.AccountID, rec.Recovery, rec.FirstEvent = ch.target.Account.ID, recovery, res.firstEvent
		s.penalise(context.WithoutCancel(ctx), ch.target.Account.ID, res.out.Penalty)
		switch res.out.Action {
		case ActionDone:
			rec.Status = http.StatusOK
			rec.InputTokens, rec.OutputTokens, rec.CachedTokens = res.tr.input, res.tr.outputTok, res.tr.cached
			return nil
		case ActionTerminal:
			if res.out.Class == ClassCiphertext && res.final != nil && res.firstEvent == 0 { // nothing reached the client
				if len(rc.stripped) == 0 && rc.mismatches == 0 {
					// The unchanged request is the full one as first sent
					// (rebuilt from continuity when the chain moved).
					rc.origBody, rc.origInput = c.body, c.fields.Input
				}
				f := &failure{status: res.status, body: res.final}
				if rc.retry(c, ch.target.Account.ID, f, res.status, false, ctx.Err() != nil, s.cfg.MaxAttempts-n, exclude) {
					if firstFail == nil && rc.first != nil {
						firstFail = rc.first.body
					}
					prev = ch.target.Account.ID
					continue
				}
				if rc.first != nil {
					res.final = rc.first.body // no account accepted: the first mismatch failure
				}
			}
			rec.Status, rec.ErrorCode = statusOr(res.status, http.StatusOK), cmp.Or(res.code, string(res.out.Class))
			if res.final != nil {
				return ws.write(ctx, res.final)
			}
			return nil
		}
		if firstFail == nil {
			firstFail = res.final
		}
		c.dropTurnStateOf(s, ch.target.Account.ID)
		if !res.sameAccount {
			exclude[ch.target.Account.ID] = true
		}
		prev = ch.target.Account.ID
	}
	rec.Status = http.StatusBadGateway
	if firstFail != nil {
		return ws.write(ctx, firstFail)
	}
	return ws.write(ctx, errorEvent(http.StatusServiceUnavailable, apiError{Type: "server_error", Code: wire.CodeServerIsOverloaded, Message: "no account could serve this request"}))
}

// retireLane closes the current lane.
func (ws *wsSession) retireLane(why string) {
	if ws.lane == nil {
		return
	}
	ws.lane.Close()
	ws.lane = nil
	ws.setLaneView(nil)
	ws.s.metrics.lanes.WithLabelValues(why).Inc()
}

func (ws *wsSession) setLaneView(v *bridge.Lane) {
	ws.infoMu.Lock()
	ws.laneView = v
	ws.infoMu.Unlock()
}

// laneInfo describes the session's live lane, if any.
func (ws *wsSession) laneInfo() (LaneInfo, bool) {
	ws.infoMu.Lock()
	defer ws.infoMu.Unlock()
	l := ws.laneView
	if l == nil {
		return LaneInfo{}, false
	}
	return LaneInfo{Kind: "direct", AccountID: l.Account, SessionID: ws.ident.Session, ThreadID: ws.ident.Thread,
		ThreadKey: string(ws.ident.Key), OpenedAt: l.Opened, Requests: l.Requests.Load()}, true
}

// requestLaneReset asks the serving loop to drop the lane before the next
// request (an operator reset the thread's binding).
func (ws *wsSession) requestLaneReset() {
	ws.infoMu.Lock()
	ws.resetLane = true
	ws.infoMu.Unlock()
}

// takeLaneReset reports and clears a pending operator reset.
func (ws *wsSession) takeLaneReset() bool {
	ws.infoMu.Lock()
	defer ws.infoMu.Unlock()
	r := ws.resetLane
	ws.resetLane = false
	return r
}

// attempt sends the request over a lane of ch's account and forwards its
// events. Events before the first semantic one are held back so a failure
// before any work can move to another account unseen.
func (ws *wsSession) attempt(ctx context.Context, c *call, ch choice) laneEnd {
	s := ws.s
	acct := ch.target.Account.ID
	defer s.inFlight(acct)()
	now := s.cfg.Now()
	res := laneEnd{}

	if ws.lane != nil && (!ws.lane.Alive() || ws.lane.Account != acct) {
		ws.retireLane("replaced")
	}
	if s.httpOnly.has(acct, now) {
		return ws.attemptOverHTTP(ctx, c, ch)
	}
	if ws.lane == nil {
		l, err := s.openLane(ctx, ch.target, ws.header)
		var refused *upgradeRefusedError
		if errors.As(err, &refused) {
			// The upstream has no WebSocket endpoint: serve over HTTP.
			s.httpOnly.mark(acct, now.Add(httpOnlyFor))
			return ws.attemptOverHTTP(ctx, c, ch)
		}
		if err != nil {
			res.detail = err.Error()
			o, status, e := dialOutcome(now, err, ctx.Err() != nil)
			res.out, res.status = o, status
			if e != nil {
				res.code = errCode(e)
				res.final = errorEvent(status, *e)
			} else {
				res.final = errorEvent(http.StatusBadGateway, apiError{Type: "server_error", Code: "upstream_unreachable", Message: "the upstream account could not be reached"})
			}
			return res
		}
		ws.lane = l
		ws.setLaneView(l)
		s.foldUsage(context.WithoutCancel(ctx), acct, l.Header)
	} else {
		s.metrics.lanes.WithLabelValues("reused").Inc()
	}
	l := ws.lane
	l.Drain()

	// Chain on the lane when it produced previous_response_id; otherwise
	// send the full history from continuity, or ask Codex to resend it.
	msg := c.body
	full := c.fields.Input
	if prev := c.fields.PreviousResponseID; prev != "" {
		resolved, rerr := s.fullInput(c)
		if rerr == nil {
			full = resolved
		}
		if !l.Known[prev] || ws.noChain {
			if rerr != nil {
				res.out = Outcome{Class: ClassPrevNotFound, Action: ActionTerminal}
				res.status, res.code = http.StatusBadRequest, wire.CodePreviousResponseNotFound
				res.final = errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: wire.CodePreviousResponseNotFound,
					Message: "previous response " + prev + " is not held on this account's connection; resend the full request"})
				return res
			}
			rebuilt, err := continuity.WithFullInput(c.body, full)
			if err != nil {
				res.out = Outcome{Class: ClassInvalid, Action: ActionTerminal}
				res.final = errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_json", Message: err.Error()})
				return res
			}
			msg = rebuilt
			// From here on the request is the full one: no other account or
			// lane holds the chain it named.
			c.body, c.fields.Input, c.fields.PreviousResponseID = rebuilt, full, ""
			s.metrics.lanes.WithLabelValues("rebuilt").Inc()
		}
	}
	if !s.turnStateFor(c, acct) {
		// The turn state is not this account's own (another account issued
		// it, or the relay made it up): the upstream must not see it.
		msg = withoutMetadataKey(msg, wire.HeaderTurnState)
	}
	if err := l.Send(ctx, msg); err != nil {
		ws.retireLane("closed")
		res.detail = err.Error()
		res.out = Classify(AttemptEnd{Now: now, Transport: err, Cancelled: ctx.Err() != nil})
		res.final = errorEvent(http.StatusBadGateway, apiError{Type: "server_error", Code: "upstream_unreachable", Message: "the upstream connection failed"})
		return res
	}

	l.Requests.Add(1)
	upstreamTurnState := l.Header.Get(wire.HeaderTurnState)
	noticed := false
	emit := func(typ string, data []byte, tr *tracker) error {
		if n := c.noticeEvent(ch.target); n != nil && !noticed {
			noticed = true
			if err := ws.write(ctx, n); err != nil {
				return err
			}
		}
		if typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete {
			if cmp.Or(tr.turnState, upstreamTurnState, c.turnState) == "" {
				// The upstream gave no turn state: the relay keeps one per thread.
				if ws.turnState == "" {
					ws.turnState = store.NewSecret("rts_")
				}
				meta := mustJSON(map[string]any{"type": wire.EventResponseMetadata, "headers": map[string]string{wire.HeaderTurnState: ws.turnState}})
				if err := ws.write(ctx, meta); err != nil {
					return err
				}
			}
		}
		s.metrics.eventsWS.Inc()
		return ws.write(ctx, data)
	}
	settle := func(tr *tracker) {
		ts, proxy := cmp.Or(tr.turnState, upstreamTurnState), false
		if ts == "" && c.turnState == "" {
			if ws.turnState == "" {
				ws.turnState = store.NewSecret("rts_")
			}
			ts, proxy = ws.turnState, true
		}
		if ts != "" {
			s.owners.put(turnStateKey(ts), owner{account: acct, scope: c.client.scope(), proxy: proxy})
		}
		if tr.responseID != "" {
			l.Known[tr.responseID] = true
		}
		if c.ident.Key != "" && tr.responseID != "" {
			s.conts.Commit(c.contKey(), continuity.Turn{ResponseID: tr.responseID, Input: full, Output: tr.output,
				AccountID: acct, Organization: ch.target.Account.Organization, TurnState: cmp.Or(tr.turnState, upstreamTurnState)})
		}
		s.settle(context.WithoutCancel(ctx), c, ch, tr.responseID)
	}
	res = s.pumpLane(ctx, c, acct, newLaneSource(l), emit, settle)
	if res.broken {
		ws.retireLane("closed")
	}
	if res.out.Class == ClassPrevNotFound && !res.committed && c.fields.PreviousResponseID != "" && !ws.noChain {
		if s.rebuildable(c) {
			// The upstream keeps no chains: the relay holds the history, so
			// the same account gets the full request, now and from here on.
			ws.noChain = true
			s.metrics.lanes.WithLabelValues("chain_refused").Inc()
			res.out, res.sameAccount = Outcome{Class: ClassPrevNotFound, Action: ActionNext}, true
		}
	}
	return res
}

// attemptOverHTTP serves a WebSocket client's request on an account whose
// upstream speaks HTTP only: the full request (rebuilt from continuity when
// it chains) goes as a POST, and the SSE events come back as frames. A
// prewarm is answered by the relay itself: an HTTP upstream would generate.
func (ws *wsSession) attemptOverHTTP(ctx context.Context, c *call, ch choice) laneEnd {
	s := ws.s
	acct := ch.target.Account.ID
	res := laneEnd{}
	full := c.fields.Input
	if prev := c.fields.PreviousResponseID; prev != "" {
		resolved, err := s.fullInput(c)
		if err != nil {
			res.out = Outcome{Class: ClassPrevNotFound, Action: ActionTerminal}
			res.status, res.code = http.StatusBadRequest, wire.CodePreviousResponseNotFound
			res.final = errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: wire.CodePreviousResponseNotFound,
				Message: "previous response " + prev + " is not held by this relay; resend the full request"})
			return res
		}
		full = resolved
	}
	if g := c.fields.Generate; g != nil && !*g {
		id := "resp_relay_" + c.id
		for _, ev := range []map[string]any{
			{"type": wire.EventResponseCreated, "response": map[string]any{"id": id, "object": "response", "status": "in_progress", "output": []any{}}},
			{"type": wire.EventResponseCompleted, "response": map[string]any{"id": id, "object": "response", "status": "completed", "output": []any{}}},
		} {
			if err := ws.write(ctx, mustJSON(ev)); err != nil {
				res.clientErr = err
				return res
			}
		}
		if c.ident.Key != "" {
			s.conts.Commit(c.contKey(), continuity.Turn{ResponseID: id, Input: full, AccountID: acct, Organization: ch.target.Account.Organization})
		}
		s.settle(context.WithoutCancel(ctx), c, ch, id)
		res.out, res.status = Outcome{Class: ClassOK, Action: ActionDone}, http.StatusOK
		return res
	}
	body, err := continuity.WithFullInput(c.body, full)
	if err == nil {
		body = withoutMember(body, "type")
	}
	if err != nil {
		res.out = Outcome{Class: ClassInvalid, Action: ActionTerminal}
		res.final = errorEvent(http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_json", Message: err.Error()})
		return res
	}
	defer s.inFlight(acct)()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := s.cfg.Upstream.Post(actx, ch.target, ch.target.ResponsesURL(""), ws.header, body)
	if err != nil {
		res.detail = err.Error()
		res.out = Classify(AttemptEnd{Now: s.cfg.Now(), Transport: err, Cancelled: ctx.Err() != nil})
		res.final = errorEvent(http.StatusBadGateway, apiError{Type: "server_error", Code: "upstream_unreachable", Message: "the upstream account could not be reached"})
		return res
	}
	defer resp.Body.Close()
	defer s.foldUsage(context.WithoutCancel(ctx), acct, resp.Header)
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		e, ok := wire.ParseErrorBody(raw)
		if !ok {
			e = wire.Error{Type: "server_error", Message: http.StatusText(resp.StatusCode)}
		}
		res.status, res.code, res.detail = resp.StatusCode, errCode(&e), e.Message
		res.out = Classify(AttemptEnd{Now: s.cfg.Now(), Status: resp.StatusCode, Err: &e, Cancelled: ctx.Err() != nil})
		res.final = errorEvent(resp.StatusCode, e)
		return res
	}
	src := newHTTPSource(resp.Body, cancel)
	turnState := resp.Header.Get(wire.HeaderTurnState)
	emit := func(typ string, data []byte, tr *tracker) error {
		s.metrics.eventsWS.Inc()
		return ws.write(ctx, data)
	}
	settle := func(tr *tracker) {
		if ts := cmp.Or(tr.turnState, turnState); ts != "" {
			s.owners.put(turnStateKey(ts), owner{account: acct, scope: c.client.scope()})
		}
		if c.ident.Key != "" && tr.responseID != "" {
			s.conts.Commit(c.contKey(), continuity.Turn{ResponseID: tr.responseID, Input: full, Output: tr.output,
				AccountID: acct, Organization: ch.target.Account.Organization, TurnState: turnState})
		}
		s.settle(context.WithoutCancel(ctx), c, ch, tr.responseID)
	}
	res = s.pumpLane(ctx, c, acct, src, emit, settle)
	res.detail = cmp.Or(res.detail, "http: the upstream speaks HTTP only")
	return res
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("relay: encode " + err.Error()) // only fixed shapes are encoded here
	}
	return b
}
