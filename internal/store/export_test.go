package store

import (
	"context"
	"slices"
	"sync"
)

// BatchGate holds the runs of a Store's batchers (binding reads, lease
// writes) until Open, so a test can queue calls behind a first one and see
// them served together.
type BatchGate struct {
	open   chan struct{}
	mu     sync.Mutex
	sizes  []int
	queued []func() int
}

// GateBatches puts a BatchGate in front of s's batchers. Call it before
// any call of s runs, or while none does.
func GateBatches(s *Store) *BatchGate {
	g := &BatchGate{open: make(chan struct{})}
	gateRun(g, &s.bindingReads)
	gateRun(g, &s.leaseWrites)
	return g
}

func gateRun[Q, A any](g *BatchGate, b *batcher[Q, A]) {
	run := b.run
	b.run = func(ctx context.Context, qs []Q) ([]A, error) {
		g.mu.Lock()
		g.sizes = append(g.sizes, len(qs))
		g.mu.Unlock()
		<-g.open
		return run(ctx, qs)
	}
	g.queued = append(g.queued, func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	})
}

// Open lets every run go, now and after.
func (g *BatchGate) Open() { close(g.open) }

// Sizes is the number of calls each run served, in the order they began.
func (g *BatchGate) Sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sizes)
}

// Queued is the number of calls waiting for a next run.
func (g *BatchGate) Queued() int {
	n := 0
	for _, q := range g.queued {
		n += q()
	}
	return n
}
