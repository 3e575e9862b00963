package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// handleRealtime serves GET {p}/realtime, the Realtime API's WebSocket
// (?model=..., or ?call_id=rtc_... for the sideband of a call, which must be
// a call of the caller's account). It sends session.created, then answers
// each client event: session.update with session.updated,
// conversation.item.create (and Codex's conversation.handoff.append) with
// conversation.item.created, input_audio_buffer.commit with
// input_audio_buffer.committed, input_audio_buffer.clear with
// input_audio_buffer.cleared, response.create with response.created, the
// reply's output_text deltas (output_audio_transcript deltas when the
// session's output is audio) and response.done; input_audio_buffer.append
// is taken silently, as OpenAI does. Any other type gets an "error" event
// and the connection stays. Each client event is a record (RecordMessage,
// RouteRealtime) whose MessageType is its type.
func (s *Server) handleRealtime(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := headerRecord(r, RecordHandshake, TransportWS, RouteRealtime, s.cfg.Now())
		rec.ConnID = s.ids.Add(1)
		callID := r.URL.Query().Get("call_id")
		rec.ObjectID = callID
		rec.Model = r.URL.Query().Get("model")
		ref := s.rec.add(rec)
		if !isWebSocketUpgrade(r) {
			e := wire.Error{Type: wire.TypeInvalidRequest, Message: "GET on this path must be a WebSocket upgrade."}
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
		c := s.objectFault(w, r, ref, acct, RouteRealtime, TransportWS)
		if c == nil {
			return
		}
		if c.fault.kind == FaultRefuseWebSocket {
			e := wire.Error{Type: wire.TypeInvalidRequest, Code: "websocket_unavailable", Message: "Realtime WebSocket is not available."}
			status := c.fired.Status
			if status == 0 {
				status = http.StatusUpgradeRequired
			}
			ref.fail(status, e, s.cfg.Now())
			writeError(w, status, e, &c.rl)
			return
		}
		if callID != "" {
			s.mu.Lock()
			known := s.objectsLocked(acct.ID).calls[callID]
			s.mu.Unlock()
			if !known {
				c.fail(http.StatusNotFound, apiError{Message: fmt.Sprintf("Call with id '%s' not found.", callID), Type: wire.TypeInvalidRequest, Param: strPtr("call_id")})
				return
			}
		}
		c.rl.SetHeaders(w.Header())
		ref.finish(http.StatusSwitchingProtocols, OutcomeUpgraded, s.cfg.Now())
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: s.cfg.wsCompression()})
		if err != nil {
			ref.fail(http.StatusBadRequest, wire.Error{Message: err.Error()}, s.cfg.Now())
			return
		}
		defer ws.CloseNow()
		ws.SetReadLimit(s.cfg.WSReadLimit)
		conn := &wsConn{id: rec.ConnID, ws: ws, account: acct.ID, started: time.Now()}
		if !s.track(conn) {
			return
		}
		defer s.untrack(conn)
		rt := &realtimeSession{s: s, conn: conn, r: r, cutAfter: c.fault.cutAfter, stallAt: c.fault.stallAt,
			session: object{"id": "sess_" + randomHex(12), "object": "realtime.session", "type": "realtime",
				"model": or(rec.Model, "gpt-realtime"), "output_modalities": []any{"text"}, "instructions": ""}}
		rt.serve()
	}
}

// realtimeSession is one Realtime WebSocket. Owned by its serve loop.
type realtimeSession struct {
	s        *Server
	conn     *wsConn
	r        *http.Request
	session  object
	items    []string // conversation item ids
	lastText string
	sent     int // server events sent, for the cut and stall faults
	cutAfter int
	stallAt  int
}

// serve reads client events one at a time and answers them, until the
// client goes, the sim closes, or a fault cuts the connection.
func (rt *realtimeSession) serve() {
	ctx, cancel := context.WithCancel(rt.s.ctx)
	defer cancel()
	msgs := make(chan []byte)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer cancel()
		for {
			_, data, err := rt.conn.ws.Read(ctx)
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
	if !rt.send(ctx, nil, object{"type": "session.created", "session": rt.session}) {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case data := <-msgs:
			rec := headerRecord(rt.r, RecordMessage, TransportWS, RouteRealtime, rt.s.cfg.Now())
			rec.ConnID, rec.Account, rec.Method = rt.conn.id, rt.conn.account, ""
			ref := rt.s.rec.add(rec)
			if !rt.answer(ctx, ref, data) {
				return
			}
		}
	}
}

// send writes one server event (with an event_id) and notes it on ref;
// it reports whether the connection goes on. A cut fault closes the
// connection in place of the event past its count; a stall sends nothing
// more until the client goes.
func (rt *realtimeSession) send(ctx context.Context, ref *recordRef, ev object) bool {
	if rt.sent == rt.cutAfter {
		if ref != nil {
			ref.finish(0, OutcomeCut, rt.s.cfg.Now())
		}
		_ = rt.conn.ws.CloseNow()
		return false
	}
	if rt.sent == rt.stallAt {
		<-ctx.Done()
		if ref != nil {
			ref.finish(0, OutcomeStalled, rt.s.cfg.Now())
		}
		return false
	}
	ev["event_id"] = "event_" + randomHex(10)
	b, _ := json.Marshal(ev)
	typ, _ := ev["type"].(string)
	if ref != nil {
		ref.event(typ)
	}
	rt.sent++
	return (&wsSink{c: rt.conn.ws, timeout: rt.s.cfg.WriteTimeout}).send(ctx, b) == nil
}

// answer answers one client event; it reports whether the connection
// goes on.
func (rt *realtimeSession) answer(ctx context.Context, ref recordRef, data []byte) bool {
	var ev struct {
		Type    string          `json:"type"`
		EventID string          `json:"event_id"`
		Session json.RawMessage `json:"session"`
		Item    json.RawMessage `json:"item"`
		Output  string          `json:"output_text"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		ev.Type = ""
	}
	ref.update(func(r *Record) { r.MessageType = ev.Type })
	ok := true
	switch ev.Type {
	case "session.update":
		var upd map[string]any
		_ = json.Unmarshal(ev.Session, &upd)
		for k, v := range upd {
			if k != "id" && k != "object" {
				rt.session[k] = v
			}
		}
		ok = rt.send(ctx, &ref, object{"type": "session.updated", "session": rt.session})
	case "conversation.item.create", "conversation.handoff.append":
		item := object{}
		_ = json.Unmarshal(ev.Item, &item)
		if len(item) == 0 {
			item = object{"type": "message", "role": "user", "content": []any{object{"type": "input_text", "text": ev.Output}}}
		}
		if id, _ := item["id"].(string); id == "" {
			item["id"] = "item_" + randomHex(12)
		}
		rt.lastText = or(contentText(mustJSON(item["content"])), ev.Output)
		prev := any(nil)
		if len(rt.items) > 0 {
			prev = rt.items[len(rt.items)-1]
		}
		rt.items = append(rt.items, item["id"].(string))
		ok = rt.send(ctx, &ref, object{"type": "conversation.item.created", "previous_item_id": prev, "item": item})
	case "input_audio_buffer.append":
	case "input_audio_buffer.commit":
		id := "item_" + randomHex(12)
		var prev any
		if len(rt.items) > 0 {
			prev = rt.items[len(rt.items)-1]
		}
		rt.items = append(rt.items, id)
		ok = rt.send(ctx, &ref, object{"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": id})
	case "input_audio_buffer.clear":
		ok = rt.send(ctx, &ref, object{"type": "input_audio_buffer.cleared"})
	case "response.create":
		ok = rt.respond(ctx, &ref)
	default:
		msg := fmt.Sprintf("Invalid value: '%s'. Supported values are: 'session.update', 'conversation.item.create', 'input_audio_buffer.append', 'input_audio_buffer.commit', 'input_audio_buffer.clear' and 'response.create'.", ev.Type)
		ref.update(func(r *Record) {
			r.ErrorType, r.ErrorCode, r.ErrorMessage = wire.TypeInvalidRequest, "invalid_value", msg
		})
		ok = rt.send(ctx, &ref, object{"type": "error", "error": object{"type": wire.TypeInvalidRequest,
			"code": "invalid_value", "message": msg, "param": "type", "event_id": ev.EventID}})
		if ok {
			ref.finish(http.StatusBadRequest, OutcomeError, rt.s.cfg.Now())
		}
		return ok
	}
	if ok {
		ref.finish(http.StatusOK, OutcomeOK, rt.s.cfg.Now())
	}
	return ok
}

// respond streams one response: "Simulated realtime reply to: TEXT" in
// three deltas.
func (rt *realtimeSession) respond(ctx context.Context, ref *recordRef) bool {
	id, itemID := "resp_"+randomHex(12), "item_"+randomHex(12)
	text := "Simulated realtime reply to: " + or(rt.lastText, "(audio)")
	audio := false
	if mods, ok := rt.session["output_modalities"].([]any); ok {
		for _, m := range mods {
			audio = audio || m == "audio"
		}
	}
	delta, done, part := "response.output_text.delta", "response.output_text.done", "output_text"
	if audio {
		delta, done, part = "response.output_audio_transcript.delta", "response.output_audio_transcript.done", "output_audio"
	}
	resp := object{"id": id, "object": "realtime.response", "status": "in_progress", "output": []any{}}
	item := object{"id": itemID, "object": "realtime.item", "type": "message", "role": "assistant", "status": "in_progress", "content": []any{}}
	steps := []object{
		{"type": "response.created", "response": resp},
		{"type": "response.output_item.added", "response_id": id, "output_index": 0, "item": item},
	}
	for _, chunk := range splitText(text, 3) {
		steps = append(steps, object{"type": delta, "response_id": id, "item_id": itemID, "output_index": 0, "content_index": 0, "delta": chunk})
	}
	doneKey := "text"
	if audio {
		doneKey = "transcript"
	}
	final := object{"id": itemID, "object": "realtime.item", "type": "message", "role": "assistant", "status": "completed",
		"content": []any{object{"type": part, doneKey: text}}}
	words := len(strings.Fields(text))
	steps = append(steps,
		object{"type": done, "response_id": id, "item_id": itemID, "output_index": 0, "content_index": 0, doneKey: text},
		object{"type": "response.output_item.done", "response_id": id, "output_index": 0, "item": final},
		object{"type": "response.done", "response": object{"id": id, "object": "realtime.response", "status": "completed",
			"output": []any{final}, "usage": object{"total_tokens": words + 8, "input_tokens": 8, "output_tokens": words}}})
	for _, st := range steps {
		if !rt.send(ctx, ref, st) {
			return false
		}
	}
	return true
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// handleRealtimeCalls serves POST {p}/realtime/calls, the WebRTC call
// Codex starts for voice: the SDP offer as the raw body (application/sdp),
// as the sdp part of a multipart body, or as {"sdp", "session"} JSON (the
// backend's shape). The answer is 201 with a plausible SDP answer and the
// call in Location (/v1/realtime/calls/rtc_...); the call then belongs to
// the account, and only it may join the call's sideband WebSocket.
func (s *Server) handleRealtimeCalls(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteRealtimeCalls, "")
		if c == nil {
			return
		}
		var offer string
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		switch mt {
		case "multipart/form-data":
			form, err := c.readMultipart()
			if err != nil {
				c.failBody(err)
				return
			}
			offer = form.values["sdp"]
		case "application/json":
			var body struct {
				SDP string `json:"sdp"`
			}
			if !c.readJSON(&body) {
				return
			}
			offer = body.SDP
		default:
			body, err := readBody(r, 1<<20)
			if err != nil {
				c.failBody(err)
				return
			}
			offer = string(body)
		}
		if !strings.HasPrefix(offer, "v=") {
			c.fail(http.StatusBadRequest, invalidRequest("The SDP offer is missing or does not start with 'v='.", "sdp"))
			return
		}
		id := "rtc_" + randomHex(12)
		s.mu.Lock()
		s.addCallLocked(c.acct.ID, id)
		s.mu.Unlock()
		c.noteObject(id)
		c.w.Header().Set("Location", "/v1/realtime/calls/"+id)
		answer := fmt.Sprintf("v=0\r\no=- %d 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"+
			"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 127.0.0.1\r\na=mid:0\r\na=sendrecv\r\na=rtpmap:111 opus/48000/2\r\n", s.cfg.Now().Unix())
		c.answer(http.StatusCreated, "application/sdp", []byte(answer))
	}
}
