package relay

import (
	"context"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// attemptResult is how one attempt ended: the one result type of both
// transports. Attempts gather facts; the decision step (decide.go) reads
// them, and the client's failure and the attempt's record are built from
// them (clientFailure, record), once.
type attemptResult struct {
	facts attemptEnd
	tr    tracker // what the stream carried: ids, usage
	// detail is for the operator only: lane use, dial and stream errors.
	detail      string
	firstEvent  time.Duration
	firstOutput time.Duration
	// sentFull: the request went in full (its whole history in the body),
	// so a ciphertext recovery may strip or move it.
	sentFull bool
}

// attempt tries plan p on ch's account and forwards the answer to cl: over
// the client's upstream lane when it has one and the account speaks
// WebSocket, else as a plain HTTP request.
func (s *Server) attempt(ctx context.Context, r *request, p plan, ch *choice, cl clientStream) attemptResult {
	if ch.claim == nil {
		ch.claim = s.inFlight(ch.target.Account.ID)
	}
	defer ch.release()
	h := &head{recovery: p.recovery, notice: p.fallbackNotice(ch.target), released: p.released, limits: r.limits}
	if key, ok := cl.lane(r); ok && !s.httpOnly.has(ch.target.Account.ID, s.cfg.Now()) {
		if res, done := s.attemptLane(ctx, r, p, ch, cl, h, key); done {
			return res
		}
		// The account turned out to speak HTTP only, or the request is
		// larger than a lane takes: the same attempt goes as HTTP.
	}
	return s.attemptHTTP(ctx, r, p, ch, cl, h)
}

// finish completes an attempt from how its stream ended.
func (res attemptResult) finish(end pumpEnd) attemptResult {
	res.facts, res.tr, res.firstEvent, res.firstOutput = end.facts, end.tr, end.firstEvent, end.firstOutput
	if end.detail != "" {
		res.detail = joinDetail(res.detail, end.detail)
	}
	return res
}

// clientFailure is what a client that has not been answered gets for an
// attempt that ended so; nil when it has its answer (or its terminal event
// within the stream) or went away. It is the upstream's own failure as it
// came (its terminal event, or its HTTP error with the headers worth
// passing on), or one of the relay's: no lane within the wait, an upstream
// that could not be reached, or an answer that broke off before any
// output. Built once per attempt, by the decision step. Pure.
func clientFailure(e attemptEnd) *failure {
	switch {
	case e.Completed, e.Committed, e.Cancelled:
		return nil
	case e.LaneCapacity:
		return failNoLane()
	case e.Event != nil:
		f := &failure{status: e.Status, event: e.Event}
		if e.Err != nil {
			f.err = *e.Err
		}
		return f
	case e.Status != 0:
		f := &failure{status: e.Status, header: e.Header, body: e.Body,
			err: apiError{Type: wire.TypeServerError, Message: http.StatusText(e.Status)}}
		if e.Err != nil {
			f.err = *e.Err
		}
		return f
	case e.Began:
		return failInterrupted()
	}
	return failUnreachable()
}

// record is the status and code an attempt's record shows for an attempt
// that ended so, f its client failure (clientFailure): the upstream's (its
// status and the code its error named), or the relay's own failure's; 499
// for a client that went away. Pure.
func record(e attemptEnd, f *failure) (status int, code string) {
	switch {
	case e.Cancelled:
		return statusClientClosed, errCode(e.Err)
	case e.Completed:
		return http.StatusOK, ""
	case f != nil && (e.Status != 0 || e.Event != nil):
		return f.status, errCode(e.Err)
	case f != nil:
		return f.status, f.code()
	case e.Status != 0 || e.Err != nil:
		return e.Status, errCode(e.Err) // a failure within a committed stream
	case e.StreamCut || e.Stalled:
		return http.StatusBadGateway, "upstream_stream_interrupted"
	}
	return e.Status, errCode(e.Err)
}

func joinDetail(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// isTooLarge reports an upstream that closed its WebSocket because a
// message was over its limit.
func isTooLarge(err error) bool {
	return websocket.CloseStatus(err) == websocket.StatusMessageTooBig
}
