package sim

import (
	"context"
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

// handleResponses serves POST {base}/responses as an SSE stream.
func (s *Server) handleResponses(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteResponses, s.cfg.Now()))
		acct, req := s.readResponseRequest(w, r, kind, ref)
		if req == nil {
			return
		}
		v := s.decide(call{transport: TransportHTTP, account: acct.ID, req: req, ref: ref})
		if v.err != nil {
			ref.fail(v.status, *v.err, s.cfg.Now())
			writeError(w, v.status, *v.err, &v.rateLimits)
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
		ref.update(func(rec *Record) { rec.ResponseID = v.responseID })
		w.WriteHeader(http.StatusOK)
		sk := &sseSink{rc: http.NewResponseController(w), sse: wire.NewSSEWriter(w), timeout: s.cfg.WriteTimeout}
		// The server does not reset a write deadline between requests of a
		// kept-alive connection unless it has a WriteTimeout: clear ours.
		defer func() { _ = sk.rc.SetWriteDeadline(time.Time{}) }()
		_ = sk.sse.Flush()

		outcome := s.stream(ctx, sk, v.events, &v, ref)
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
