package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// maxErrorBody bounds an upstream error body the relay reads.
const maxErrorBody = 1 << 20

// attemptHTTP sends p to ch's account as one HTTP request and forwards the
// answer to cl: its SSE events, or a JSON document (the legacy compact
// route). A chained request continuity can rebuild goes in full, so it is
// served wherever it lands; a prewarm is answered by the relay itself, since
// an HTTP upstream would generate.
func (s *Server) attemptHTTP(ctx context.Context, r *request, p plan, ch *choice, cl clientStream, h *head) attemptResult {
	acct := ch.target.Account.ID
	if r.prewarm() {
		return s.answerPrewarm(ctx, r, ch, cl, h)
	}
	var res attemptResult
	body := p.body
	if full, ok := p.full(); ok {
		body, res.sentFull = full.body, true
	}
	if r.transport == "ws" {
		res.detail = "http: the upstream speaks HTTP only, or the request is too large for its WebSocket"
	}
	// The upstream's request outlives its client by Config.HangUpAfter:
	// what the upstream sent before it saw the client go is still read
	// (see httpSource.Arrived).
	hang := newHangUp(ctx, s.cfg.HangUpAfter)
	defer hang.end()
	actx, cancel := hang.ctx, hang.cancel
	var answer answerDeadline
	pctx := actx
	if r.sub == "" {
		// A stream: its headers come before any work. A compaction's
		// document comes once it is done: the transport's header timeout
		// bounds it.
		pctx = answer.arm(actx, s.cfg.StreamIdleTimeout, cancel)
	}
	resp, err := s.cfg.Upstream.post(pctx, ch.target, ch.target.ResponsesURL(r.sub), s.upstreamHeader(r, p, acct), body)
	stalled := answer.stop()
	if stalled {
		if err == nil {
			resp.Body.Close() // it came as the deadline cancelled the request
		}
		err = errStall
	}
	now := s.cfg.Now()
	if err != nil {
		res.detail = joinDetail(res.detail, err.Error())
		res.facts = attemptEnd{Now: now, Transport: err, Stalled: stalled, Cancelled: ctx.Err() != nil}
		return res
	}
	defer resp.Body.Close()
	// The account's usage windows, from this answer's headers: queued for
	// the writer behind the requests (s.usage) before any event reaches the
	// client, as a lane's are.
	s.foldUsage(acct, resp.Header)
	h.upstream = resp.Header

	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		header := http.Header{}
		passHeaders(header, resp.Header)
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			header.Set("Content-Type", ct)
		}
		var ep *wire.Error
		if e, ok := wire.ParseErrorBody(raw); ok {
			ep = &e
			res.detail = joinDetail(res.detail, e.Message)
		}
		retry, _ := wire.ParseRetryAfter(resp.Header, now)
		res.facts = attemptEnd{Now: now, Status: resp.StatusCode, Err: ep, RetryAfter: retry, Cancelled: ctx.Err() != nil,
			Header: header, Body: raw}
		return res
	}
	if !strings.HasPrefix(strings.ToLower(resp.Header.Get("Content-Type")), "text/event-stream") {
		// A JSON answer (the legacy compact route): pass it through.
		doc, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes))
		if err != nil {
			res.detail = joinDetail(res.detail, err.Error())
			res.facts = attemptEnd{Now: s.cfg.Now(), Transport: err, Cancelled: ctx.Err() != nil, Began: true}
			return res
		}
		// A document is no turn: no turn state is issued for it. It is a
		// compaction, whose output replaces the thread's history (under a
		// response id of the relay's own when the upstream gave none).
		tr := documentTracker(doc)
		if tr.responseID == "" {
			tr.responseID = "resp_relay_" + r.id
		}
		s.settle(ctx, r, ch, h, tr, p.input)
		s.finishReservation(ctx, r, tr)
		res.tr = *tr
		if err := cl.reply(h, http.StatusOK, doc); err != nil {
			res.facts = attemptEnd{Now: s.cfg.Now(), Cancelled: true, Committed: true}
			return res
		}
		res.firstEvent = s.cfg.Now().Sub(r.start)
		res.facts = attemptEnd{Now: s.cfg.Now(), Completed: true, Committed: true}
		return res
	}
	input := p.input // the whole input the upstream saw, for continuity (nil: unknown)
	settle := func(tr *tracker) {
		h.decideTurnState(r, cl)
		s.settle(ctx, r, ch, h, tr, input)
	}
	s.watchStored(ctx, r, ch, h)
	end := s.pump(ctx, r, acct, newHTTPSource(resp.Body, hang), cl, h, settle)
	return res.finish(end)
}

// answerPrewarm answers a WebSocket prewarm (generate: false) on an account
// served over HTTP: the relay issues the response id Codex chains its next
// request on, and remembers the input under it.
func (s *Server) answerPrewarm(ctx context.Context, r *request, ch *choice, cl clientStream, h *head) attemptResult {
	id := "resp_relay_" + r.id
	tr := &tracker{responseID: id}
	h.tr = tr
	h.decideTurnState(r, cl)
	s.settle(ctx, r, ch, h, tr, r.history)
	var res attemptResult
	for _, ev := range []map[string]any{
		{"type": wire.EventResponseCreated, "response": map[string]any{"id": id, "object": "response", "status": "in_progress", "output": []any{}}},
		{"type": wire.EventResponseCompleted, "response": map[string]any{"id": id, "object": "response", "status": "completed", "output": []any{}}},
	} {
		typ, _ := ev["type"].(string)
		if err := cl.send(h, typ, mustJSON(ev)); err != nil {
			res.facts = attemptEnd{Now: s.cfg.Now(), Cancelled: true, Committed: true}
			return res
		}
	}
	res.tr, res.firstEvent = *tr, s.cfg.Now().Sub(r.start)
	res.facts = attemptEnd{Now: s.cfg.Now(), Completed: true, Committed: true}
	return res
}

// answerDeadline gives an upstream the stream idle deadline to start
// answering once it has the whole request, as pump gives it between two
// events: a port that takes the request and never answers is a stall,
// ended within the operator's deadline rather than the transport's
// (longer) wait for response headers. Connecting keeps its own deadline.
type answerDeadline struct {
	mu    sync.Mutex
	timer *time.Timer // armed once the request is written; guarded by mu
	done  bool        // stop was called: nothing arms it any more; guarded by mu
}

// arm returns ctx traced so that the deadline starts when the request has
// been written; when it passes, cancel ends the request.
func (d *answerDeadline) arm(ctx context.Context, idle time.Duration, cancel context.CancelFunc) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if w.Err == nil && d.timer == nil && !d.done {
			d.timer = time.AfterFunc(idle, cancel)
		}
	}})
}

// stop disarms the deadline, once the answer's headers came or the request
// failed, and reports whether it had passed (the request was cancelled by
// it, or is being).
func (d *answerDeadline) stop() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	return d.timer != nil && !d.timer.Stop()
}
