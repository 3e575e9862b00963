package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// eventSource yields one request's upstream events, pulled one at a time
// by pump (the only caller), so forwarding an event costs no hand-off
// between goroutines.
type eventSource interface {
	// Next returns the next event's payload, valid until the next call. It
	// returns errStall when nothing arrived within idle, ctx's error once
	// ctx has ended, and any other error (io.EOF: a clean end) when the
	// source itself ended.
	Next(ctx context.Context, idle time.Duration) ([]byte, error)
	// Arrived returns the next event if it has arrived already, without
	// waiting; ok is false when none is at hand. After the client went
	// away, it tells an upstream that was still answering from one that had
	// finished (its terminal event is at hand), whose lane may serve again.
	Arrived() (data []byte, ok bool)
	// stop releases the source's timer.
	stop()
}

// laneSource reads a lane's events for one request, in the request's own
// goroutine: it claims the lane's reading when made (before the request is
// sent), takes the first event from the lane's idle reader and reads the
// rest itself, and gives the reading back at stop. Each event's buffer goes
// back to the lane's pool at the next call (the data is valid until then).
type laneSource struct {
	l     *bridge.Lane
	first <-chan *bridge.Event // the claim: the lane's idle reader hands the first event over on it
	held  bool                 // the first event came: this source reads the lane
	prev  *bridge.Event        // the event returned last, released at the next call
	// wait is the idle deadline while the first event is awaited.
	wait *time.Timer
	// cut is the idle deadline while this source reads: it interrupts the
	// read, and stalled tells that interruption from the connection's own
	// end. Armed around each read, so the client's writes do not count.
	cut     *time.Timer
	stalled atomic.Bool
	// arrivedBy ends Arrived's reads (zero until its first call).
	arrivedBy time.Time
	// reading is set while Next reads the lane: the request's context
	// ending interrupts that read (unwatch stops watching it), never
	// Arrived's, nor the lane while the client is written to.
	reading atomic.Bool
	unwatch func() bool
	// grace interrupts the read under way once the request's context has
	// been over for graceFor (cancelRead arms it): an event the upstream
	// sent as the client went is read, not thrown away with the lane.
	grace    *time.Timer
	graceFor time.Duration
}

// newLaneSource claims l's reading for a request about to be sent on it.
func newLaneSource(l *bridge.Lane) *laneSource {
	return &laneSource{l: l, first: l.Claim(), graceFor: hangUpGrace}
}

// After a client goes away mid-answer, the relay reads on what the
// upstream sends for a moment: while events keep coming at most
// hangUpGrace apart, for at most arrivedWithin in all. An upstream that
// finishes by then has its response settled (its usage counts, as the
// upstream counts it) and its lane serves the thread's next request; one
// still answering has its lane closed, which cancels its request. Without
// the grace, a response completed as its client hung up was lost whenever
// the relay's reader had not yet run when the hang-up was seen (closing the
// lane threw away the completion already in its socket): 20 in 6,412
// hang-ups in a 15-minute soak on a saturated machine.
const (
	hangUpGrace   = 250 * time.Millisecond
	arrivedWithin = time.Second
)

func (s *laneSource) Next(ctx context.Context, idle time.Duration) ([]byte, error) {
	s.release()
	if !s.held {
		return s.handedOver(ctx, idle)
	}
	if s.unwatch == nil {
		// The request's end (its client went away) ends a read under way
		// after the grace; the lane then closes, which is what cancels the
		// upstream's request. Once a request: an event costs no AfterFunc.
		s.grace = time.AfterFunc(time.Hour, s.interruptRead)
		s.grace.Stop()
		s.unwatch = context.AfterFunc(ctx, s.cancelRead)
	}
	s.reading.Store(true)
	if err := ctx.Err(); err != nil { // ended before cancelRead could see the read
		s.reading.Store(false)
		return nil, err
	}
	data, err := s.read(ctx, idle)
	s.reading.Store(false)
	return data, err
}

// cancelRead, run when the request's context ends, interrupts the read
// under way unless an event comes within the grace.
func (s *laneSource) cancelRead() {
	if s.reading.Load() {
		s.grace.Reset(s.graceFor)
	}
}

// interruptRead ends the read under way, if any: never Arrived's (which has
// its own deadline), nor the lane once this request has let it go.
func (s *laneSource) interruptRead() {
	if s.reading.Load() {
		s.l.Interrupt()
	}
}

// handedOver waits for the request's first event, which the lane's idle
// reader hands over.
func (s *laneSource) handedOver(ctx context.Context, idle time.Duration) ([]byte, error) {
	if s.wait == nil {
		s.wait = time.NewTimer(idle)
	} else {
		s.wait.Reset(idle) // since Go 1.23 a Reset timer never delivers a stale tick
	}
	select {
	case m, ok := <-s.first:
		s.wait.Stop()
		if !ok {
			return nil, s.ended()
		}
		s.held, s.prev = true, m
		return m.Data, nil
	case <-s.wait.C:
		return nil, errStall
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// read reads the next event from the lane, within idle.
func (s *laneSource) read(ctx context.Context, idle time.Duration) ([]byte, error) {
	if s.cut == nil {
		s.cut = time.AfterFunc(idle, s.interrupt)
	} else {
		s.cut.Reset(idle)
	}
	m, err := s.l.Read()
	s.cut.Stop()
	switch {
	case err == nil:
		s.prev = m
		return m.Data, nil
	case s.stalled.Load():
		return nil, errStall
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, s.ended()
}

func (s *laneSource) interrupt() {
	s.stalled.Store(true)
	s.l.Interrupt()
}

// ended is why the lane ended: its error, or io.EOF.
func (s *laneSource) ended() error {
	if err := s.l.Err(); err != nil {
		return err
	}
	return io.EOF
}

func (s *laneSource) Arrived() ([]byte, bool) {
	s.release()
	if !s.held {
		select {
		case m, ok := <-s.first:
			if !ok {
				return nil, false
			}
			s.held, s.prev = true, m
			return m.Data, true
		default:
			return nil, false
		}
	}
	if s.arrivedBy.IsZero() {
		s.arrivedBy = time.Now().Add(arrivedWithin)
	}
	left := time.Until(s.arrivedBy)
	if left <= 0 || !s.l.Alive() {
		return nil, false
	}
	// An event that has not come by then has not arrived: the lane is
	// then interrupted, as it is closed anyway when the upstream is still
	// answering.
	data, err := s.read(context.Background(), min(left, s.graceFor))
	return data, err == nil
}

func (s *laneSource) release() {
	if s.prev != nil {
		s.prev.Release()
		s.prev = nil
	}
}

// stop gives the lane's reading back and releases the timers.
func (s *laneSource) stop() {
	s.release()
	if s.wait != nil {
		s.wait.Stop()
	}
	if s.cut != nil {
		s.cut.Stop()
	}
	if s.unwatch != nil {
		s.unwatch()
		s.grace.Stop() // one cancelRead armed after this finds no read under way
	}
	s.l.Unclaim(s.first)
}

// httpSource reads an upstream's HTTP/SSE answer in the caller's goroutine.
// Its idle deadline cancels the upstream request (cancel), which ends a
// blocked read.
type httpSource struct {
	r       *wire.SSEReader
	cancel  context.CancelFunc
	t       *time.Timer
	stalled atomic.Bool // set by the deadline's timer goroutine
}

func newHTTPSource(body io.Reader, cancel context.CancelFunc) *httpSource {
	return &httpSource{r: wire.NewSSEReader(body, 0, 0), cancel: cancel}
}

func (s *httpSource) Next(ctx context.Context, idle time.Duration) ([]byte, error) {
	if s.t == nil {
		s.t = time.AfterFunc(idle, func() { s.stalled.Store(true); s.cancel() })
	} else {
		s.t.Reset(idle)
	}
	ev, err := s.r.Next()
	switch {
	case err == nil:
		return ev.Data, nil
	case s.stalled.Load():
		return nil, errStall
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, err
}

// Arrived reads the next event, called once the client has gone: the
// upstream request, made under outliving's context, is cancelled
// hangUpGrace after its client went (or by the idle deadline), which ends
// this read when nothing more has come.
func (s *httpSource) Arrived() ([]byte, bool) {
	ev, err := s.r.Next()
	if err != nil {
		return nil, false
	}
	return ev.Data, true
}

// outliving returns a context with ctx's values that ends hangUpGrace after
// ctx has, or at its cancel: an upstream HTTP request made under it is read
// on for a moment once its client went, as a lane is.
func outliving(ctx context.Context) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(hangUpGrace, cancel) })
	return octx, func() { stop(); cancel() }
}

func (s *httpSource) stop() {
	if s.t != nil {
		s.t.Stop()
	}
}

// pumpEnd is how one attempt's stream ended: the facts for classify, and
// what the attempt needs to finish (the terminal event not yet sent, the
// lane's health).
type pumpEnd struct {
	facts      attemptEnd
	tr         tracker
	final      []byte // the terminal event the client has not been sent (a failure before any output)
	firstEvent time.Duration
	// firstOutput is when the first output delta went to the client.
	firstOutput time.Duration
	detail      string
	// broken: the lane must not serve again (cut, stalled, or the client
	// left mid-answer with the upstream still sending: closing the lane is
	// what cancels the upstream's request).
	broken bool
	// tooLarge: the upstream closed the connection on the message's size.
	tooLarge bool
}

// pump reads one request's events from src and forwards them to cl. Events
// before the first semantic one are held back, so a failure before any
// work can move the request unseen; a stream that goes quiet is caught by
// the idle deadline, not by the client's patience. settle records a
// completed response before its terminal event reaches the client, which
// may send its next request the moment it reads it.
func (s *Server) pump(ctx context.Context, r *request, account string, src eventSource, cl clientStream, h *head, settle func(*tracker)) pumpEnd {
	var end pumpEnd
	h.tr = &end.tr
	// Usage windows reported in the stream (codex.rate_limits) update the
	// account, as the HTTP headers do: with the turn's other records, before
	// its terminal event, or when the stream ends otherwise.
	folded := false
	foldLimits := func() {
		if end.tr.limits != nil && !folded {
			folded = true
			s.foldLimits(context.WithoutCancel(ctx), account, *end.tr.limits)
		}
	}
	defer foldLimits()
	type held struct {
		typ  string
		data []byte
	}
	var pending []held
	toucher := s.newToucher(r)
	defer src.stop()
	committed := false
	send := func(typ string, data []byte) error {
		if !committed {
			committed = true
			end.firstEvent = s.cfg.Now().Sub(r.start)
			for _, e := range pending {
				if err := cl.send(h, e.typ, e.data); err != nil {
					return err
				}
			}
			pending = nil
		}
		return cl.send(h, typ, data)
	}
	settled := false // the upstream's answer completed, and settle ran
	// clientGone ends an attempt whose client went away (it hung up, often
	// on purpose once it had what it wanted, or stopped reading): a
	// cancellation, never the account's failure. The upstream's request is
	// cancelled by closing its lane, unless the upstream had finished
	// already: then the lane, and what it now holds, serve the thread's
	// next request.
	clientGone := func(err error) pumpEnd {
		end.detail = "client: " + err.Error()
		end.facts = attemptEnd{Now: s.cfg.Now(), Committed: committed, Cancelled: true, ClientStalled: errors.Is(err, os.ErrDeadlineExceeded)}
		end.broken = !settled && end.tr.terminal == "" && !s.finishUnheard(ctx, r, src, &end.tr, settle)
		if !end.broken {
			end.detail += " after the upstream's terminal event"
		}
		return end
	}
	for {
		data, err := src.Next(ctx, s.cfg.StreamIdleTimeout)
		switch {
		case errors.Is(err, errStall):
			end.broken, end.detail = true, errStall.Error()
			end.facts = attemptEnd{Now: s.cfg.Now(), Stalled: true, Transport: errStall, Committed: committed}
			return s.endBroken(r, end, cl, h, "the upstream sent nothing for "+s.cfg.StreamIdleTimeout.String())
		case err != nil && ctx.Err() != nil:
			return clientGone(ctx.Err())
		case err != nil:
			end.broken = true
			if errors.Is(err, io.EOF) {
				err = nil
			} else {
				end.detail = err.Error()
			}
			end.facts = attemptEnd{Now: s.cfg.Now(), StreamCut: true, Transport: err, Committed: committed}
			end.tooLarge = isTooLarge(err)
			return s.endBroken(r, end, cl, h, "the upstream connection ended without a terminal event")
		}
		typ, _ := wire.EventType(data)
		end.tr.observe(typ, data)
		toucher.event()
		completed := typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete
		if wire.IsTerminal(typ) && !completed {
			// The upstream answered with an error of its own; the connection
			// and its chain are still sound.
			end.facts = attemptEnd{Now: s.cfg.Now(), Status: end.tr.failStatus, Err: end.tr.failure, Committed: committed}
			if !committed {
				// A failure before any work: nothing is sent yet, so the
				// request may still recover (strip ciphertext, move) or pass
				// the failure on; the held bookkeeping events are dropped.
				end.final = bytes.Clone(data) // the source may reuse its buffer
				return end
			}
			if err := send(typ, data); err != nil {
				return clientGone(err)
			}
			return end
		}
		if !committed && !end.tr.work && !completed {
			pending = append(pending, held{typ, bytes.Clone(data)}) // a copy: the source may reuse its buffer
			continue
		}
		if completed {
			foldLimits()
			settle(&end.tr)
			settled = true
			s.finishReservation(ctx, r, &end.tr)
		}
		if end.firstOutput == 0 && isOutputDelta(typ) {
			end.firstOutput = s.cfg.Now().Sub(r.start)
		}
		if err := send(typ, data); err != nil {
			return clientGone(err)
		}
		if completed {
			end.facts = attemptEnd{Now: s.cfg.Now(), Completed: true, Committed: true}
			return end
		}
	}
}

// finishUnheard reads what the upstream sent that the client, gone, will
// never hear, as far as it has arrived, and reports whether it ended with a
// terminal event: the upstream has finished, its lane is sound. A completed
// response is settled as if delivered (the upstream holds it, and the
// thread's next request builds on it); its usage counts, and its usage
// windows are folded with the stream's.
func (s *Server) finishUnheard(ctx context.Context, r *request, src eventSource, tr *tracker, settle func(*tracker)) bool {
	for {
		data, ok := src.Arrived()
		if !ok {
			return false
		}
		typ, _ := wire.EventType(data)
		tr.observe(typ, data)
		if !wire.IsTerminal(typ) {
			continue
		}
		if typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete {
			settle(tr)
			s.finishReservation(ctx, r, tr)
		}
		return true
	}
}

// isOutputDelta reports an event carrying output tokens the user sees: a
// delta of text, reasoning summary, or tool call arguments.
func isOutputDelta(typ string) bool {
	return strings.HasPrefix(typ, "response.") && strings.HasSuffix(typ, ".delta")
}

// endBroken ends an attempt whose stream broke or went quiet. Before any
// output the request may move, and the client has been sent nothing; after
// output, the client gets a response.failed event now (Codex retries it).
func (s *Server) endBroken(r *request, end pumpEnd, cl clientStream, h *head, msg string) pumpEnd {
	if !end.facts.Committed {
		return end
	}
	if err := cl.send(h, wire.EventResponseFailed, failedEvent(end.tr.responseID, r.id, "upstream_stream_interrupted", msg)); err != nil {
		end.detail += "; client: " + err.Error()
	}
	return end
}

// touchEvery is how often a streaming request refreshes its thread's
// continuity entry: often enough that an active thread never expires mid-use,
// rarely enough to keep the per-event path free of locks.
const touchEvery = 30 * time.Second

// toucher keeps a thread's continuity entry alive while its events flow.
type toucher struct {
	s    *Server
	key  continuity.Key
	on   bool
	last time.Time
}

func (s *Server) newToucher(r *request) *toucher {
	return &toucher{s: s, key: r.contKey(), on: r.ident.Key != "", last: s.cfg.Now()}
}

// event notes one event; it touches the entry at most every touchEvery.
func (t *toucher) event() {
	if !t.on {
		return
	}
	if now := t.s.cfg.Now(); now.Sub(t.last) >= touchEvery {
		t.last = now
		t.s.conts.Touch(t.key)
	}
}
