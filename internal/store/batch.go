package store

import (
	"context"
	"sync"
)

// batchMax bounds the calls one batch serves.
const batchMax = 64

// batcher runs the calls that arrive while one of its runs is under way
// together, as its next run: under a burst of new threads, many requests
// share one round trip (one read of their bindings, one write of their
// lane leases) instead of queueing for the pool's connections one each.
//
// A call that finds no run under way runs at once, by itself, under its
// own ctx: alone, a request waits exactly as it would without the batcher.
// Calls that arrive meanwhile queue; when that run ends, a goroutine of
// the batcher's own runs them, up to batchMax at a time, until none is
// left, and then ends. Those runs go without their callers' cancellation,
// under sharedReadTimeout; each caller waits as long as its ctx lets it,
// and a call whose caller has gone is left out of the next run. Safe for
// concurrent use.
type batcher[Q, A any] struct {
	// run answers qs, one answer for each, in their order, or fails them
	// all.
	run func(ctx context.Context, qs []Q) ([]A, error)

	mu    sync.Mutex
	busy  bool               // guarded by mu: a run is under way
	queue []*batchCall[Q, A] // guarded by mu: calls for the next run
}

type batchCall[Q, A any] struct {
	ctx  context.Context
	q    Q
	a    A
	err  error
	done chan struct{} // closed once a and err are set
}

// do answers q: at once when no run is under way, else in the next run.
func (b *batcher[Q, A]) do(ctx context.Context, q Q) (A, error) {
	var zero A
	b.mu.Lock()
	if !b.busy {
		b.busy = true
		b.mu.Unlock()
		defer b.next()
		as, err := b.run(ctx, []Q{q})
		if err != nil {
			return zero, err
		}
		return as[0], nil
	}
	c := &batchCall[Q, A]{ctx: ctx, q: q, done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.a, c.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// next ends a run: what queued meanwhile goes to a goroutine that runs it,
// or, with nothing queued, the batcher is idle again.
func (b *batcher[Q, A]) next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.busy = false
		return
	}
	go b.drain()
}

// drain runs the queued calls, batchMax at a time, until none is left.
func (b *batcher[Q, A]) drain() {
	for {
		calls, qs := b.take()
		if len(calls) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), sharedReadTimeout)
		as, err := b.run(ctx, qs)
		cancel()
		for i, c := range calls {
			if err != nil {
				c.err = err
			} else {
				c.a = as[i]
			}
			close(c.done)
		}
	}
}

// take removes up to batchMax queued calls whose callers still wait; with
// none, it marks the batcher idle.
func (b *batcher[Q, A]) take() ([]*batchCall[Q, A], []Q) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var calls []*batchCall[Q, A]
	n := 0
	for ; n < len(b.queue) && len(calls) < batchMax; n++ {
		if c := b.queue[n]; c.ctx.Err() == nil {
			calls = append(calls, c)
		}
	}
	b.queue = b.queue[n:]
	if len(calls) == 0 {
		b.queue, b.busy = nil, false
		return nil, nil
	}
	qs := make([]Q, len(calls))
	for i, c := range calls {
		qs[i] = c.q
	}
	return calls, qs
}
