package relay

import (
	"context"
	"net/http"
	"time"

	"github.com/coder/websocket"
)

// attemptResult is how one attempt ended: the one result type of both
// transports. The loop classifies facts once; fail is the answer to send
// when the client has not been answered (nil when it has, or went away).
type attemptResult struct {
	facts attemptEnd
	fail  *failure
	tr    tracker // what the stream carried: ids, usage
	// status and code are what the attempt record shows (the upstream's, or
	// the relay's own failure).
	status int
	code   string
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
	h := &head{recovery: p.recovery, notice: p.fallbackNotice(ch.target), released: p.released}
	if key, ok := cl.lane(r); ok && !s.httpOnly.has(ch.target.Account.ID, s.cfg.Now()) {
		if res, done := s.attemptLane(ctx, r, p, ch, cl, h, key); done {
			return res
		}
		// The account turned out to speak HTTP only, or the request is
		// larger than a lane takes: the same attempt goes as HTTP.
	}
	return s.attemptHTTP(ctx, r, p, ch, cl, h)
}

// finish completes an attempt from how its stream ended: a failure the
// client has not seen becomes the answer to send (the upstream's own event,
// or one of the relay's when the stream broke before any output).
func (res attemptResult) finish(end pumpEnd) attemptResult {
	res.facts, res.tr, res.firstEvent, res.firstOutput = end.facts, end.tr, end.firstEvent, end.firstOutput
	if end.detail != "" {
		res.detail = joinDetail(res.detail, end.detail)
	}
	switch {
	case end.tr.failure != nil:
		res.status, res.code = end.tr.failStatus, errCode(end.tr.failure)
	case end.facts.StreamCut || end.facts.Stalled:
		res.status, res.code = http.StatusBadGateway, "upstream_stream_interrupted"
	}
	switch {
	case end.facts.Completed:
		res.status = http.StatusOK
	case end.facts.Committed, end.facts.Cancelled:
		// The client has its terminal event, or is gone.
	case end.final != nil:
		f := &failure{status: end.tr.failStatus, event: end.final}
		if e := end.tr.failure; e != nil {
			f.err = *e
		}
		res.fail = f
	default:
		res.fail = failInterrupted()
		res.status, res.code = res.fail.status, res.fail.code()
	}
	return res
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
