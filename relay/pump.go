package relay

import (
	"context"
	"errors"

	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// laneEnd is how one request's events on a lane ended.
type laneEnd struct {
	tr         tracker
	out        Outcome
	final      []byte // the event that ends the request for the client, when it was not sent
	committed  bool   // something reached the client
	firstEvent time.Duration
	status     int
	code       string
	detail     string
	// sameAccount: the upstream retired the connection before any work; a
	// fresh lane on the same account may take the request.
	sameAccount bool
	// broken: the lane must not serve again (cut, stalled, cancelled
	// mid-request, or its account failed).
	broken    bool
	clientErr error // the client could not be written to
}

// emitFunc forwards one upstream event to the client; tr is the tracker
// after the event.
type emitFunc func(typ string, data []byte, tr *tracker) error

// settleFunc records a completed response (bindings, owners, continuity,
// the lane's state) before its terminal event reaches the client, which may
// send its next request the moment it reads it.
type settleFunc func(tr *tracker)

// pumpLane reads one request's events from a lane and forwards them. Events
// before the first semantic one are held back, so a failure before any work
// can move the request unseen; a lane that goes quiet is detected by the
// idle deadline, not by the client's patience.
// eventSource yields one request's upstream events, pulled one at a time
// by pumpLane (the only caller), so forwarding an event costs no hand-off
// between goroutines.
type eventSource interface {
	// Next returns the next event's payload, valid until the next call. It
	// returns errStall when nothing arrived within idle, ctx's error once
	// ctx has ended, and any other error (io.EOF: a clean end) when the
	// source itself ended.
	Next(ctx context.Context, idle time.Duration) ([]byte, error)
	// stop releases the source's timer.
	stop()
}

// laneSource reads a lane's events.
type laneSource struct {
	l *bridge.Lane
	t *time.Timer // the idle deadline, reused across events
}

func newLaneSource(l *bridge.Lane) *laneSource { return &laneSource{l: l} }

func (s *laneSource) Next(ctx context.Context, idle time.Duration) ([]byte, error) {
	if s.t == nil {
		s.t = time.NewTimer(idle)
	} else {
		s.t.Reset(idle) // since Go 1.23 a Reset timer never delivers a stale tick
	}
	select {
	case data, ok := <-s.l.Events():
		if !ok {
			if err := s.l.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		return data, nil
	case <-s.t.C:
		return nil, errStall
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *laneSource) stop() {
	if s.t != nil {
		s.t.Stop()
	}
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

func (s *httpSource) stop() {
	if s.t != nil {
		s.t.Stop()
	}
}

func (s *Server) pumpLane(ctx context.Context, c *call, account string, l eventSource, emit emitFunc, settle settleFunc) laneEnd {
	var end laneEnd
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
	toucher := s.newToucher(c)
	defer l.stop()
	flush := func() error {
		if !end.committed {
			end.committed = true
			end.firstEvent = s.cfg.Now().Sub(c.start)
		}
		for _, h := range pending {
			if err := emit(h.typ, h.data, &end.tr); err != nil {
				return err
			}
		}
		pending = pending[:0]
		return nil
	}
	for {
		data, err := l.Next(ctx, s.cfg.StreamIdleTimeout)
		switch {
		case errors.Is(err, errStall):
			end.broken, end.detail = true, errStall.Error()
			return s.endBroken(c, end, AttemptEnd{Now: s.cfg.Now(), Stalled: true, Transport: errStall, WorkObserved: end.tr.work})
		case err != nil && ctx.Err() != nil:
			end.broken = true
			end.out = Outcome{Class: ClassCancelled, Action: ActionTerminal}
			end.clientErr = ctx.Err()
			return end
		case err != nil:
			end.broken = true
			if !errors.Is(err, io.EOF) {
				end.detail = err.Error()
			} else {
				err = nil
			}
			return s.endBroken(c, end, AttemptEnd{Now: s.cfg.Now(), StreamCut: true, Transport: err, WorkObserved: end.tr.work})
		}
		typ, _ := wire.EventType(data)
		end.tr.observe(typ, data)
		toucher.event()
		completed := typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete
		if wire.IsTerminal(typ) && !completed {
			end.out = Classify(AttemptEnd{Now: s.cfg.Now(), Status: end.tr.failStatus, Err: end.tr.failure, WorkObserved: end.tr.work})
			end.status, end.code = end.tr.failStatus, errCode(end.tr.failure)
			end.final = append([]byte(nil), data...) // the source may reuse its buffer
			if end.tr.failure != nil && end.tr.failure.Code == wire.CodeWebSocketConnectionLimitReached && !end.committed {
				end.out = Outcome{Class: ClassTransport, Action: ActionNext}
				end.sameAccount, end.broken = true, true
				return end
			}
			if end.out.Action == ActionNext && !end.committed {
				end.broken = end.out.Penalty != nil
				return end
			}
			if !end.committed {
				// A failure before any work: nothing is sent yet, so the
				// caller may still recover (strip ciphertext, move) or pass
				// the failure on; the held bookkeeping events are dropped.
				end.out.Action = ActionTerminal
				return end
			}
			if err := flush(); err != nil {
				end.clientErr, end.out = err, Outcome{Class: ClassCancelled, Action: ActionTerminal}
				return end
			}
			// The upstream answered the request with an error of its own;
			// the connection and its chain are still sound.
			end.out.Action = ActionTerminal
			return end
		}
		if !end.committed && !end.tr.work && !completed {
			pending = append(pending, held{typ, append([]byte(nil), data...)}) // a copy: the source may reuse its buffer
			continue
		}
		if completed {
			foldLimits()
			settle(&end.tr)
		}
		err = flush() // the held events, then this one
		if err == nil {
			err = emit(typ, data, &end.tr)
		}
		if err != nil {
			end.clientErr, end.broken = err, true
			end.out = Outcome{Class: ClassCancelled, Action: ActionTerminal}
			return end
		}
		if completed {
			end.status = http.StatusOK
			end.out = Outcome{Class: ClassOK, Action: ActionDone}
			return end
		}
	}
}

// endBroken ends an attempt whose lane broke or went quiet: before any work
// it may move on; after, the client gets a terminal event.
func (s *Server) endBroken(c *call, end laneEnd, e AttemptEnd) laneEnd {
	end.out = Classify(e)
	if end.out.Action == ActionNext && !end.committed {
		end.final = errorEvent(http.StatusBadGateway, apiError{Type: "server_error", Code: "upstream_stream_interrupted", Message: "the upstream connection ended before any output"})
		return end
	}
	end.out.Action = ActionTerminal
	msg := "the upstream connection ended without a terminal event"
	if e.Stalled {
		msg = "the upstream sent nothing for " + s.cfg.StreamIdleTimeout.String()
	}
	end.status = http.StatusBadGateway
	end.final = failedEvent(end.tr.responseID, c.id, "upstream_stream_interrupted", msg)
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

func (s *Server) newToucher(c *call) *toucher {
	return &toucher{s: s, key: c.contKey(), on: c.ident.Key != "", last: s.cfg.Now()}
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
