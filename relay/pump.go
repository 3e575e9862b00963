package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/wire"
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
	// unwatch stops watching the request's context (see clientWent).
	unwatch func() bool
	// mu guards what the client's going sets in motion against this
	// source's reads: the timers touch the lane only while a read of this
	// source is under way, never once the request has let the lane go.
	mu sync.Mutex
	// reading is set while Next or Arrived reads the lane; the timers read
	// it under mu. Until the client has gone (went) no timer is armed, so
	// the per-event path sets it without the lock.
	reading atomic.Bool
	went    atomic.Bool
	hungUp  bool      // guarded by mu: the lane was hung up (or closed)
	wentAt  time.Time // guarded by mu: when the client was seen gone (zero: not yet)
	// hang hangs the lane up hangUpAfter after the client went, when a
	// read still waits; giveUp ends a read still under way hearOutFor
	// after it. hangUpAfter is static after newLaneSource.
	hang, giveUp *time.Timer
	hangUpAfter  time.Duration
}

// newLaneSource claims l's reading for a request about to be sent on it;
// hangUpAfter is Config.HangUpAfter.
func newLaneSource(l *bridge.Lane, hangUpAfter time.Duration) *laneSource {
	s := &laneSource{l: l, first: l.Claim(), hangUpAfter: hangUpAfter}
	s.hang = time.AfterFunc(time.Hour, s.hangUpIfReading)
	s.hang.Stop()
	s.giveUp = time.AfterFunc(time.Hour, s.interruptIfReading)
	s.giveUp.Stop()
	return s
}

// When a client goes away mid-answer, an event the upstream has sent
// already is read at once. One not there within hangUpAfter is taken for an
// upstream still answering: the lane hangs up (bridge.Lane.Hangup: its
// sending side closes, and the upstream, seeing its client go, stops and
// closes the connection), and what the upstream sent before it saw that is
// read until the upstream closes, for hearOutFor at most (an upstream
// that does not answer the hang-up); then the lane closes. So a response
// the upstream completed is settled and its usage logged whatever the
// relay's timing, and one it was still writing is cancelled. Closing the
// lane at once instead threw away a completion already in its socket
// whenever the relay's reader had not yet run (20 of 6,412 hang-ups in a
// 15-minute soak on a saturated machine), reading on for a while before
// closing it lost the completions that came during the relay's lag behind
// the upstream (85 in a 5-minute one). Hearing it out still misses a
// few on a saturated machine (3 of 6,351 hang-ups in 15 minutes with 1 s,
// 5 of 6,194 with 10 s; see docs/RELIABILITY.md): the wait is not what
// loses them, and the longer one only bounds an upstream that does not
// answer the hang-up. hangUpAfter is Config.HangUpAfter: the backlog must
// be read within it, which a machine short of CPU may not do (a test that
// asserts a finished upstream's lane is kept sets it longer).
const (
	hangUpAfter = 50 * time.Millisecond
	hearOutFor  = 10 * time.Second
)

func (s *laneSource) Next(ctx context.Context, idle time.Duration) ([]byte, error) {
	s.release()
	if !s.held {
		return s.handedOver(ctx, idle)
	}
	if s.unwatch == nil {
		// Once a request: an event costs no AfterFunc.
		s.unwatch = context.AfterFunc(ctx, s.clientWent)
	}
	s.setReading(true)
	if err := ctx.Err(); err != nil { // ended before clientWent could see the read
		s.setReading(false)
		return nil, err
	}
	data, err := s.read(ctx, idle)
	s.setReading(false)
	return data, err
}

// setReading marks a read of this source under way or over. Once the
// client has gone it takes mu, so that after a read is marked over no
// timer touches the lane (the request may let it go next).
func (s *laneSource) setReading(on bool) {
	if !s.went.Load() {
		s.reading.Store(on)
		return
	}
	s.mu.Lock()
	s.reading.Store(on)
	s.mu.Unlock()
}

// clientWent notes that the request's client has gone, and sets the
// timers going: a read under way is heard out as the const block above
// says (Arrived does the same for the reads after it).
func (s *laneSource) clientWent() {
	s.mu.Lock()
	first := s.wentAt.IsZero()
	if first {
		s.wentAt = time.Now()
		s.went.Store(true)
	}
	s.mu.Unlock()
	if first {
		s.hang.Reset(s.hangUpAfter)
		s.giveUp.Reset(hearOutFor)
	}
}

// hangUpIfReading hangs the lane up if a read of this source still waits.
func (s *laneSource) hangUpIfReading() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reading.Load() {
		s.hangUpLocked()
	}
}

// hangUpLocked hangs the lane up, once; a lane that cannot hang up is
// closed.
func (s *laneSource) hangUpLocked() {
	if s.hungUp {
		return
	}
	s.hungUp = true
	if !s.l.Hangup() {
		s.l.Interrupt()
	}
}

// interruptIfReading ends a read of this source still under way.
func (s *laneSource) interruptIfReading() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reading.Load() {
		s.hungUp = true
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
	s.clientWent()
	s.mu.Lock()
	gone := time.Since(s.wentAt)
	if gone >= s.hangUpAfter {
		s.hangUpLocked()
	}
	s.reading.Store(true)
	s.mu.Unlock()
	defer s.setReading(false)
	left := hearOutFor - gone
	if left <= 0 {
		return nil, false
	}
	data, err := s.read(context.Background(), left)
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
	}
	s.hang.Stop() // one that fires after this finds no read under way
	s.giveUp.Stop()
	s.l.Unclaim(s.first)
}

// httpSource reads an upstream's HTTP/SSE answer in the caller's goroutine.
// Its idle deadline cancels the upstream request (hang.cancel), which ends
// a blocked read.
type httpSource struct {
	r       *wire.SSEReader
	hang    *hangUp // its cancel ends the upstream request
	t       *time.Timer
	stalled atomic.Bool // set by the deadline's timer goroutine
}

// newHTTPSource reads body, the answer to a request made under hang's
// context (see newHangUp).
func newHTTPSource(body io.Reader, hang *hangUp) *httpSource {
	return &httpSource{r: wire.NewSSEReader(body, 0, 0), hang: hang}
}

func (s *httpSource) Next(ctx context.Context, idle time.Duration) ([]byte, error) {
	if s.t == nil {
		s.t = time.AfterFunc(idle, func() { s.stalled.Store(true); s.hang.cancel() })
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

// Arrived reads the next event as the lane's does once the client went:
// the request is cancelled hangUpAfter after the client was seen gone (an
// HTTP request has no half-close), and whatever arrives before that, a
// completion already on its way above all, is read.
func (s *httpSource) Arrived() ([]byte, bool) {
	s.hang.arm()
	ev, err := s.r.Next()
	if err != nil {
		return nil, false
	}
	return ev.Data, true
}

func (s *httpSource) stop() {
	if s.t != nil {
		s.t.Stop()
	}
}

// hangUp is an upstream HTTP request's way to end once its client has
// gone: not at once, which would throw away an answer already in the
// connection's buffers (the upstream bills it; the relay would never see
// its usage), but hangUpAfter later. Its context is the request's.
type hangUp struct {
	ctx       context.Context
	cancel    context.CancelFunc
	after     time.Duration
	once      sync.Once
	stopWatch func() bool
}

// newHangUp makes the context of an upstream request made for a client
// whose context is client: it keeps client's values, and ends after (the
// relay's: hangUpAfter) once client has ended, or at end.
func newHangUp(client context.Context, after time.Duration) *hangUp {
	h := &hangUp{after: after}
	h.ctx, h.cancel = context.WithCancel(context.WithoutCancel(client))
	h.stopWatch = context.AfterFunc(client, h.arm)
	return h
}

// arm cancels the request h.after from now, once.
func (h *hangUp) arm() {
	h.once.Do(func() { time.AfterFunc(h.after, h.cancel) })
}

// end cancels the request now.
func (h *hangUp) end() {
	h.stopWatch()
	h.cancel()
}

// pumpEnd is how one attempt's stream ended: its facts (a failure the
// client has not been sent among them, as its terminal event came), and
// what the attempt needs to finish (the lane's health, the timings).
type pumpEnd struct {
	facts      attemptEnd
	tr         tracker
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
	// account, as the HTTP headers do: queued for s.usage with the turn's
	// other records, before its terminal event, or when the stream ends
	// otherwise.
	folded := false
	foldLimits := func() {
		if end.tr.limits != nil && !folded {
			folded = true
			s.foldLimits(account, *end.tr.limits)
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
		end.facts = attemptEnd{Now: s.cfg.Now(), Began: true, Committed: committed, Cancelled: true, ClientStalled: errors.Is(err, os.ErrDeadlineExceeded)}
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
			end.facts = attemptEnd{Now: s.cfg.Now(), Began: true, Stalled: true, Transport: errStall, Committed: committed}
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
			end.facts = attemptEnd{Now: s.cfg.Now(), Began: true, StreamCut: true, Transport: err, Committed: committed}
			end.tooLarge = isTooLarge(err)
			return s.endBroken(r, end, cl, h, "the upstream connection ended without a terminal event")
		}
		typ, _ := wire.EventType(data)
		end.tr.observe(typ, data)
		toucher.event()
		if typ == wire.EventResponseCreated && h.created != nil && end.tr.responseID != "" {
			h.created(end.tr.responseID)
			h.created = nil
		}
		completed := typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete
		if wire.IsTerminal(typ) && !completed {
			// The upstream answered with an error of its own; the connection
			// and its chain are still sound.
			end.facts = attemptEnd{Now: s.cfg.Now(), Began: true, Status: end.tr.failStatus, Err: end.tr.failure, Committed: committed}
			if e := end.tr.failure; e != nil && e.Message != "" {
				end.detail = e.Message // the upstream's words, for the attempt record (masked there)
			}
			if !committed {
				// A failure before any work: nothing is sent yet, so the
				// request may still recover (strip ciphertext, move) or pass
				// the failure on; the held bookkeeping events are dropped.
				end.facts.Event = bytes.Clone(data) // the source may reuse its buffer
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
			end.facts = attemptEnd{Now: s.cfg.Now(), Began: true, Completed: true, Committed: true}
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
