package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
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
// eventSource is where one request's upstream events come from: a lane, or
// an HTTP/SSE answer (an upstream that speaks HTTP only).
type eventSource interface {
	// Events delivers event payloads in order; closed when the source ends.
	Events() <-chan []byte
	// Err reports why the source ended.
	Err() error
}

var _ eventSource = (*bridge.Lane)(nil)

func (s *Server) pumpLane(ctx context.Context, c *call, account string, l eventSource, emit emitFunc, settle settleFunc) laneEnd {
	var end laneEnd
	defer func() {
		// Usage windows reported in the stream (codex.rate_limits) update
		// the account, as the HTTP headers do.
		if end.tr.limits != nil {
			s.foldLimits(context.WithoutCancel(ctx), account, *end.tr.limits)
		}
	}()
	type held struct {
		typ  string
		data []byte
	}
	var pending []held
	toucher := s.newToucher(c)
	idle := time.NewTimer(s.cfg.StreamIdleTimeout)
	defer idle.Stop()
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
		pending = nil
		return nil
	}
	for {
		var data []byte
		var ok bool
		select {
		case data, ok = <-l.Events():
		case <-idle.C:
			end.broken, end.detail = true, errStall.Error()
			return s.endBroken(c, end, AttemptEnd{Now: s.cfg.Now(), Stalled: true, Transport: errStall, WorkObserved: end.tr.work})
		case <-ctx.Done():
			end.broken = true
			end.out = Outcome{Class: ClassCancelled, Action: ActionTerminal}
			end.clientErr = ctx.Err()
			return end
		}
		if !ok {
			err := l.Err()
			end.broken, end.detail = true, fmt.Sprint(err)
			return s.endBroken(c, end, AttemptEnd{Now: s.cfg.Now(), StreamCut: true, Transport: err, WorkObserved: end.tr.work})
		}
		if !idle.Stop() {
			select {
			case <-idle.C:
			default:
			}
		}
		idle.Reset(s.cfg.StreamIdleTimeout)
		typ, _ := wire.EventType(data)
		end.tr.observe(typ, data)
		toucher.event()
		completed := typ == wire.EventResponseCompleted || typ == wire.EventResponseIncomplete
		if wire.IsTerminal(typ) && !completed {
			end.out = Classify(AttemptEnd{Now: s.cfg.Now(), Status: end.tr.failStatus, Err: end.tr.failure, WorkObserved: end.tr.work})
			end.status, end.code = end.tr.failStatus, errCode(end.tr.failure)
			end.final = data
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
		pending = append(pending, held{typ, data})
		if !end.committed && !end.tr.work && !completed {
			continue
		}
		if completed {
			settle(&end.tr)
		}
		if err := flush(); err != nil {
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

// sseSource reads an HTTP/SSE answer as an eventSource. Its reader goroutine
// ends when the body does; the owner closes the body (cancelling the
// request) and then waits on done.
type sseSource struct {
	events chan []byte
	done   chan struct{}
	mu     sync.Mutex
	err    error // guarded by mu
}

func newSSESource(body io.Reader) *sseSource {
	src := &sseSource{events: make(chan []byte, 64), done: make(chan struct{})}
	go func() {
		defer close(src.done)
		defer close(src.events)
		r := wire.NewSSEReader(body, 0, 0)
		for {
			ev, err := r.Next()
			if err != nil {
				src.mu.Lock()
				src.err = err
				src.mu.Unlock()
				return
			}
			src.events <- append([]byte(nil), ev.Data...)
		}
	}()
	return src
}

func (s *sseSource) Events() <-chan []byte { return s.events }

func (s *sseSource) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(s.err, io.EOF) {
		return nil
	}
	return s.err
}

// drain discards what is left so the reader can end.
func (s *sseSource) drain() {
	for range s.events {
	}
	<-s.done
}
