package relay

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// serveRealtime relays a realtime (voice) WebSocket session frame by frame
// to one account for its whole life: admitted like a Responses session
// (the key, its model allow-list for the ?model= asked, its budgets), the
// account selected once (a sideband session naming ?call_id= goes to the
// call's account: 409 when it cannot serve, 404 for a call the relay never
// saw), the upstream dialled before the client is accepted (so a refused
// dial moves to the next account, or answers the client plainly), then
// each message passed on as it came, in order, one at a time each way
// (the bound on what is queued), every write within the client write
// timeout, the key read again before each client message. The usage its
// response.done events report is the session's log row (route "realtime").
func (s *Server) serveRealtime(w http.ResponseWriter, hr *http.Request, rest string) {
	ctx := hr.Context()
	cl, ident, ok := s.admitIdentified(w, hr)
	if !ok {
		return
	}
	rt := objectRoute{name: "realtime", kind: store.ObjectRealtimeCall}
	callID := hr.URL.Query().Get("call_id")
	c := s.newObjectCall(hr, rt, callID, rest, cl, ident)
	c.r.transport = "ws"
	defer c.log.write()
	model := hr.URL.Query().Get("model")
	c.r.fields, c.r.asked = continuity.Fields{Model: model}, model
	if model != "" || len(cl.key.Models) > 0 {
		if err := cl.checkModel(model); err != nil {
			s.failObject(w, c, err)
			return
		}
	}
	reserved, err := s.admitBudget(ctx, c.r)
	c.r.reserved, c.log.rec.Reserved = reserved, reserved
	if err != nil {
		s.failObject(w, c, err)
		return
	}
	if callID != "" {
		if !validObjectID(callID) {
			s.failObject(w, c, &unknownObjectError{kind: rt.kind, id: "(malformed)"})
			return
		}
		if c.owner, err = s.objectAccount(ctx, cl.scope(), callID, rt.kind); err != nil {
			s.failObject(w, c, err)
			return
		}
	}
	c.r.objectOwner = c.owner
	if !s.sessions.start() {
		writeError(w, http.StatusServiceUnavailable, apiError{Type: wire.TypeServerError, Code: "shutting_down", Message: "the relay is shutting down"})
		return
	}
	defer s.sessions.end()
	up, ch, ok := s.dialRealtime(w, c)
	if !ok {
		return
	}
	defer ch.release()
	defer up.CloseNow()
	conn, err := websocket.Accept(w, hr, &websocket.AcceptOptions{CompressionMode: s.cfg.ClientCompression.websocketMode(),
		CompressionThreshold: s.cfg.ClientCompression.threshold()})
	if err != nil {
		c.log.ended(classCancelled)
		return // Accept has answered the client
	}
	defer conn.CloseNow()
	conn.SetReadLimit(MaxMessageBytes)
	c.log.rec.Status = http.StatusSwitchingProtocols
	s.relayRealtime(context.WithoutCancel(ctx), c, conn, up)
}

// dialRealtime selects the session's account and dials its realtime
// WebSocket; an account that refuses or does not answer is passed over
// (unless the session is bound to a call's account). It answers the client
// itself when no account can take the session.
func (s *Server) dialRealtime(w http.ResponseWriter, c *objectCall) (*websocket.Conn, choice, bool) {
	ctx := c.hr.Context()
	exclude := map[string]bool{}
	for seq := 1; ; seq++ {
		ch, err := s.choose(ctx, c.r, plan{}, exclude, "")
		if err != nil {
			s.failObject(w, c, err)
			return nil, choice{}, false
		}
		acct := ch.target.Account.ID
		started := s.cfg.Now()
		var raw net.Conn
		up, resp, err := s.cfg.Upstream.dialWebSocketURL(ctx, ch.target, c.realtimeURL(ch.target), c.hr.Header, &raw, "")
		if err == nil {
			c.log.attempt(seq, acct, "", classOK, "", actionDone, http.StatusSwitchingProtocols, "", "", started, s.cfg.Now().Sub(started))
			c.log.rec.AccountID = acct
			up.SetReadLimit(MaxMessageBytes)
			return up, ch, true
		}
		ch.release()
		e := attemptEnd{Now: s.cfg.Now(), Transport: err, Cancelled: ctx.Err() != nil}
		if resp != nil && resp.StatusCode >= 400 {
			e = attemptEnd{Now: s.cfg.Now(), Status: resp.StatusCode, Began: true}
		}
		o := classify(e)
		status, code := record(e, nil)
		c.log.attempt(seq, acct, "", o.Class, "", o.Action, status, code, err.Error(), started, 0)
		if o.Class == classCancelled {
			c.log.ended(classCancelled)
			return nil, choice{}, false
		}
		s.penalise(context.WithoutCancel(ctx), acct, o.Penalty)
		if c.owner == "" && o.Action == actionNext && seq < s.cfg.MaxAttempts {
			exclude[acct] = true
			continue
		}
		f := failUnreachable()
		if e.Status != 0 {
			f = screenAnswer(e.Status, nil, nil, s.cfg.Now())
		}
		c.log.answered(f, o.Class)
		writeError(w, f.status, f.err)
		return nil, choice{}, false
	}
}

// realtimeURL is the account's realtime WebSocket: below its base URL,
// with the client's query (model, call_id).
func (c *objectCall) realtimeURL(t target) string {
	u := strings.TrimRight(t.Account.BaseURL, "/") + "/realtime"
	if q := c.hr.URL.RawQuery; q != "" {
		u += "?" + q
	}
	return u
}

// relayRealtime passes messages both ways until either side closes, the
// relay closes, the relay drains (between responses: 1012, as a Responses
// session closes between turns), or the client's key stops being usable
// (read again before every client message, as a Responses session does;
// the store keeps it briefly and drops it when the key changes). The
// first end closes both sides with its code.
func (s *Server) relayRealtime(ctx context.Context, c *objectCall, client, up *websocket.Conn) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()
	ws := &wsSession{s: s, client: c.r.client}
	type ended struct {
		code   websocket.StatusCode
		reason string
	}
	done := make(chan ended, 2)
	// responding: a response is under way upstream (between its
	// response.created and its response.done); drain waits for it.
	var responding atomic.Bool
	restart := ended{websocket.StatusServiceRestart, "relay restarting: reconnect"}
	pass := func(from, to *websocket.Conn, toClient bool) {
		for {
			typ, msg, err := from.Read(ctx)
			if err != nil {
				code := websocket.CloseStatus(err)
				if code == -1 {
					code = websocket.StatusGoingAway
				}
				done <- ended{code, "the other side closed"}
				return
			}
			if !toClient {
				if err := ws.admitTurn(ctx); err != nil {
					done <- ended{websocket.StatusPolicyViolation, "client key revoked or expired"}
					return
				}
			}
			var event string
			if toClient {
				event, _ = wire.EventType(msg)
				c.noteRealtimeEvent(event, msg)
				switch event {
				case "response.created":
					responding.Store(true)
				case "response.done":
					responding.Store(false)
				}
			}
			wctx, wcancel := context.WithTimeout(ctx, s.cfg.ClientWriteTimeout)
			err = to.Write(wctx, typ, msg)
			wcancel()
			if err != nil {
				done <- ended{websocket.StatusGoingAway, "a write did not finish in time"}
				return
			}
			if event == "response.done" && s.draining.Err() != nil {
				done <- restart
				return
			}
		}
	}
	var both sync.WaitGroup
	both.Go(func() { pass(client, up, false) })
	both.Go(func() { pass(up, client, true) })
	var end ended
	select {
	case end = <-done:
	case <-s.draining.Done():
		if !responding.Load() {
			end = restart
			break
		}
		end = <-done // the response under way ends first
	}
	if s.closing.Err() != nil {
		end = ended{websocket.StatusGoingAway, "relay shutting down"}
	}
	// Closed before the reads are cancelled: a cancelled read drops its
	// connection at once, without the close frame that says why.
	_ = client.Close(end.code, end.reason)
	_ = up.Close(end.code, end.reason)
	cancel()
	both.Wait() // both directions have ended (their reads were cancelled): the usage is all in
	if c.log.last != nil {
		c.log.served(c.log.rec.AccountID, "", *c.log.last, http.StatusSwitchingProtocols, "")
	}
}

// noteRealtimeEvent adds the usage a realtime response.done reports to the
// session's (event is msg's type).
func (c *objectCall) noteRealtimeEvent(event string, msg []byte) {
	if event != "response.done" {
		return
	}
	var ev struct {
		Response struct {
			Usage json.RawMessage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(msg, &ev) != nil || len(ev.Response.Usage) == 0 {
		return
	}
	tr := usageTracker("", ev.Response.Usage)
	if c.log.last == nil {
		c.log.last = &attemptResult{tr: tracker{work: true, model: c.r.asked}}
	}
	sum := &c.log.last.tr
	sum.usage = true
	sum.input += tr.input
	sum.outputTok += tr.outputTok
	sum.cached += tr.cached
	sum.total += tr.total
}
