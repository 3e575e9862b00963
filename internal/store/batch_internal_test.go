package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedBatcher is a batcher behind a BatchGate (export_test.go) whose
// runs answer each q with "a:"+q and record their contexts; fail makes
// every run fail.
type gatedBatcher struct {
	batcher[string, string]
	*BatchGate
	mu   sync.Mutex
	ctxs []context.Context
	fail error
}

func newGatedBatcher() *gatedBatcher {
	g := &gatedBatcher{BatchGate: &BatchGate{open: make(chan struct{})}}
	g.run = func(ctx context.Context, qs []string) ([]string, error) {
		g.mu.Lock()
		g.ctxs = append(g.ctxs, ctx)
		g.mu.Unlock()
		if g.fail != nil {
			return nil, g.fail
		}
		as := make([]string, len(qs))
		for i, q := range qs {
			as[i] = "a:" + q
		}
		return as, nil
	}
	gateRun(g.BatchGate, &g.batcher)
	return g
}

type answer struct {
	q, a string
	err  error
}

// start calls do(q) on a goroutine of its own; its answer arrives on out.
func (g *gatedBatcher) start(ctx context.Context, q string, out chan<- answer) {
	go func() {
		a, err := g.do(ctx, q)
		out <- answer{q, a, err}
	}()
}

// leadAndQueue starts a first call, waits until it runs, then queues n
// more behind it.
func (g *gatedBatcher) leadAndQueue(t *testing.T, n int, ctxOf func(i int) context.Context) chan answer {
	t.Helper()
	out := make(chan answer, n+1)
	g.start(context.Background(), "lead", out)
	require.Eventually(t, func() bool { return len(g.Sizes()) == 1 }, time.Minute, time.Millisecond)
	for i := range n {
		g.start(ctxOf(i), fmt.Sprint("q", i), out)
	}
	require.Eventually(t, func() bool { return g.Queued() == n }, time.Minute, time.Millisecond)
	return out
}

func background(int) context.Context { return context.Background() }

// A lone call runs at once, under its own ctx; calls that arrive while it
// runs share the next run, at most batchMax each, and every caller gets
// its own answer. Afterwards the batcher is idle: a new call runs alone.
func TestBatcherGathersWhatArrivesMeanwhile(t *testing.T) {
	g := newGatedBatcher()
	n := batchMax + 5
	out := g.leadAndQueue(t, n, background)
	g.Open()
	got := map[string]string{}
	for range n + 1 {
		select {
		case a := <-out:
			require.NoError(t, a.err)
			got[a.q] = a.a
		case <-time.After(time.Minute):
			t.Fatal("a caller never had its answer")
		}
	}
	assert.Equal(t, "a:lead", got["lead"])
	for i := range n {
		assert.Equal(t, fmt.Sprint("a:q", i), got[fmt.Sprint("q", i)])
	}
	assert.Equal(t, []int{1, batchMax, 5}, g.Sizes())

	type key struct{}
	mine := context.WithValue(context.Background(), key{}, "mine")
	a, err := g.do(mine, "alone")
	require.NoError(t, err)
	assert.Equal(t, "a:alone", a)
	assert.Equal(t, []int{1, batchMax, 5, 1}, g.Sizes(), "idle again: a new call runs by itself")
	g.mu.Lock()
	assert.Equal(t, "mine", g.ctxs[len(g.ctxs)-1].Value(key{}), "a lone call runs under its caller's ctx")
	assert.Nil(t, g.ctxs[1].Value(key{}))
	g.mu.Unlock()
}

// A queued caller whose ctx ends has its error at once, and is left out of
// the next run.
func TestBatcherLeavesOutCallersGone(t *testing.T) {
	g := newGatedBatcher()
	ctx, cancel := context.WithCancel(context.Background())
	out := g.leadAndQueue(t, 3, func(i int) context.Context {
		if i == 1 {
			return ctx
		}
		return context.Background()
	})
	cancel()
	select {
	case a := <-out:
		assert.Equal(t, "q1", a.q)
		assert.ErrorIs(t, a.err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("a caller whose ctx ended still waits")
	}
	g.Open()
	for range 3 {
		a := <-out
		require.NoError(t, a.err)
		assert.Equal(t, "a:"+a.q, a.a)
	}
	assert.Equal(t, []int{1, 2}, g.Sizes())
}

// A run that fails fails every call it serves, and the batcher goes on.
func TestBatcherFailsTheWholeRun(t *testing.T) {
	g := newGatedBatcher()
	g.fail = errors.New("database away")
	out := g.leadAndQueue(t, 4, background)
	g.Open()
	for range 5 {
		a := <-out
		assert.EqualError(t, a.err, "database away", a.q)
	}
	g.fail = nil
	a, err := g.do(context.Background(), "later")
	require.NoError(t, err)
	assert.Equal(t, "a:later", a)
}
