package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// requestContext is the context of one HTTP request: it ends when the client
// goes away or the sim closes.
func (s *Server) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// readResponseRequest authenticates an HTTP response request and decodes its
// body. On failure it answers and finishes the record, and returns nil.
func (s *Server) readResponseRequest(w http.ResponseWriter, r *http.Request, kind Kind, ref recordRef) (Account, *responseRequest) {
	acct, fail := s.authenticate(r, kind, true, ref)
	if fail != nil {
		ref.fail(fail.status, fail.err, s.cfg.Now())
		writeError(w, fail.status, fail.err, nil)
		return Account{}, nil
	}
	body, err := readBody(r, s.cfg.MaxBodyBytes)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errBodyTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		e := wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()}
		ref.fail(status, e, s.cfg.Now())
		writeError(w, status, e, nil)
		return Account{}, nil
	}
	req, err := parseResponseRequest(body)
	if err != nil {
		e := wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()}
		ref.fail(http.StatusBadRequest, e, s.cfg.Now())
		writeError(w, http.StatusBadRequest, e, nil)
		return Account{}, nil
	}
	ref.noteRequest(req)
	return acct, req
}

// handleResponses serves POST {base}/responses: as an SSE stream, or as
// JSON for an explicit "stream": false. store:true keeps the response on
// the account (GET .../responses/{id}); background:true runs it detached
// (runBackground): without stream the answer is the queued response
// object at once, with stream the events follow the run.
func (s *Server) handleResponses(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteResponses, s.cfg.Now()))
		acct, req := s.readResponseRequest(w, r, kind, ref)
		if req == nil {
			return
		}
		var prev func(string) (int, bool)
		if !s.cfg.Stateless {
			prev = s.storedContext(acct.ID) // only stored responses are known over HTTP
		}
		v := s.decide(call{transport: TransportHTTP, account: acct.ID, req: req, ref: ref, prev: prev})
		if v.err != nil {
			ref.fail(v.status, *v.err, s.cfg.Now())
			if v.objErr != nil {
				v.rateLimits.SetHeaders(w.Header())
				writeJSON(w, v.status, object{"error": v.objErr})
				return
			}
			writeError(w, v.status, *v.err, &v.rateLimits)
			return
		}
		c := &objectCall{s: s, w: w, r: r, ref: ref, acct: acct, rl: v.rateLimits, fault: v.fault}
		if req.Background && !req.stores() {
			c.fail(http.StatusBadRequest, invalidRequest("Background responses require store to be true.", "background"))
			return
		}
		ref.update(func(rec *Record) { rec.ResponseID = v.responseID })
		var sr *storedResponse
		if req.stores() {
			status := StatusInProgress
			if req.Background {
				status = StatusQueued
			}
			sr = s.storeResponse(acct.ID, req, &v, status)
			c.noteObject(v.responseID)
			if req.Background && !s.runBackground(sr, v) {
				c.fail(http.StatusServiceUnavailable, apiError{Message: "the simulated upstream is closed", Type: wire.TypeServerError})
				return
			}
		}
		if req.Background && !req.Stream {
			s.mu.Lock()
			obj := sr.objectLocked()
			s.mu.Unlock()
			c.answerJSON(http.StatusOK, obj)
			return
		}
		if !req.Background && req.StreamSet && !req.Stream {
			s.answerResponseJSON(c, &v, sr)
			return
		}
		ctx, cancel := s.requestContext(r)
		defer cancel()

		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Request-Id", "req_"+randomHex(12))
		v.rateLimits.SetHeaders(h)
		// Codex echoes the first turn state of a turn on the turn's later
		// requests; the sim keeps an echoed one and issues one otherwise.
		turnState := r.Header.Get(wire.HeaderTurnState)
		if turnState == "" {
			turnState = "ts_" + randomHex(12)
			ref.update(func(rec *Record) { rec.TurnStateSent = turnState })
		}
		h.Set(wire.HeaderTurnState, turnState)
		w.WriteHeader(http.StatusOK)
		sk := &sseSink{rc: http.NewResponseController(w), sse: wire.NewSSEWriter(w), timeout: s.cfg.WriteTimeout}
		// The server does not reset a write deadline between requests of a
		// kept-alive connection unless it has a WriteTimeout: clear ours.
		defer func() { _ = sk.rc.SetWriteDeadline(time.Time{}) }()
		_ = sk.sse.Flush()

		var outcome string
		switch {
		case req.Background:
			outcome = s.follow(ctx, sk, sr, -1, v.fault, ref)
		case sr != nil:
			outcome = s.stream(ctx, teeSink{sink: sk, store: storeSink{s: s, sr: sr}}, v.events, &v, ref)
			s.endStored(sr)
		default:
			outcome = s.stream(ctx, sk, v.events, &v, ref)
		}
		ref.finish(http.StatusOK, outcome, s.cfg.Now())
		switch outcome {
		case OutcomeCompleted, OutcomeFailed, OutcomeOK:
		default:
			// Cut, stalled, or ended by Close: drop the connection without
			// ending the chunked body, so the client sees a broken stream
			// rather than a clean end without a terminal event.
			panic(http.ErrAbortHandler)
		}
	}
}

// answerResponseJSON answers a "stream": false request with the finished
// response object, after running its script (delay and gap included) as a
// stream would; a cut or stall drops the connection without an answer.
func (s *Server) answerResponseJSON(c *objectCall, v *verdict, sr *storedResponse) {
	ctx, cancel := s.requestContext(c.r)
	defer cancel()
	col := &collectSink{}
	var sk sink = col
	if sr != nil {
		sk = teeSink{sink: col, store: storeSink{s: s, sr: sr}}
	}
	outcome := s.stream(ctx, sk, v.events, v, c.ref)
	if sr != nil {
		s.endStored(sr)
	}
	switch outcome {
	case OutcomeCompleted, OutcomeFailed:
	default:
		c.ref.finish(0, outcome, s.cfg.Now())
		panic(http.ErrAbortHandler)
	}
	var env struct {
		Response json.RawMessage `json:"response"`
	}
	_ = json.Unmarshal(col.last, &env)
	h := c.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Request-Id", "req_"+randomHex(12))
	c.rl.SetHeaders(h)
	c.w.WriteHeader(http.StatusOK)
	_, _ = c.w.Write(env.Response)
}

// collectSink keeps the last event sent through it.
type collectSink struct{ last []byte }

func (k *collectSink) send(ctx context.Context, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.last = data
	return nil
}

// handleCompact serves the legacy POST {base}/responses/compact: the same
// checks as a response request, answered with {"output":[...]} JSON.
func (s *Server) handleCompact(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteCompact, s.cfg.Now()))
		acct, req := s.readResponseRequest(w, r, kind, ref)
		if req == nil {
			return
		}
		v := s.decide(call{transport: TransportHTTP, account: acct.ID, req: req, ref: ref, compact: true})
		if v.err != nil {
			ref.fail(v.status, *v.err, s.cfg.Now())
			writeError(w, v.status, *v.err, &v.rateLimits)
			return
		}
		switch {
		case v.fault.inStream:
			ref.fail(v.fault.status, v.fault.err, s.cfg.Now())
			writeError(w, v.fault.status, v.fault.err, &v.rateLimits)
			return
		case v.fault.cutAfter >= 0:
			ref.finish(0, OutcomeCut, s.cfg.Now())
			panic(http.ErrAbortHandler)
		case v.fault.stallAt >= 0:
			ctx, cancel := s.requestContext(r)
			defer cancel()
			<-ctx.Done()
			ref.finish(0, OutcomeStalled, s.cfg.Now())
			panic(http.ErrAbortHandler)
		}
		v.rateLimits.SetHeaders(w.Header())
		ref.update(func(rec *Record) { rec.ResponseID = v.responseID })
		ref.finish(http.StatusOK, OutcomeCompleted, s.cfg.Now())
		s.completed(acct.ID)
		writeJSON(w, http.StatusOK, object{"id": v.responseID, "object": "response.compaction", "output": v.compactOutput})
	}
}

// sseSink writes events as SSE, each under a write deadline.
type sseSink struct {
	rc      *http.ResponseController
	sse     *wire.SSEWriter
	timeout time.Duration
}

func (k *sseSink) send(ctx context.Context, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_ = k.rc.SetWriteDeadline(time.Now().Add(k.timeout)) // unsupported by some writers; then unbounded
	name, _ := wire.EventType(data)
	return k.sse.WriteEvent(name, data)
}
