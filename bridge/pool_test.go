package bridge

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// upstream is a loopback WebSocket server whose connections stay open until
// the client closes them; it counts connections.
type upstream struct {
	srv   *httptest.Server
	dials atomic.Int64
	live  atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		u.live.Add(1)
		defer u.live.Add(-1)
		for {
			if _, _, err := c.Read(r.Context()); err != nil {
				return
			}
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) dialer(account string, now func() time.Time) Dialer {
	return func(ctx context.Context) (*Lane, error) {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(u.srv.URL, "http"), nil)
		if err != nil {
			return nil, err
		}
		u.dials.Add(1)
		return NewLane(c, account, nil, now()), nil
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newTestPool(t *testing.T, cfg PoolConfig) (*Pool, *fakeClock, *[]string) {
	clk := &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	var mu sync.Mutex
	var events []string
	cfg.Now = clk.Now
	cfg.OnEvent = func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	p := NewPool(cfg)
	t.Cleanup(p.Close)
	return p, clk, &events
}

var root = Key{Thread: "v1:st:root", Scope: "k"}
var child = Key{Thread: "v1:st:child", Scope: "k"}

func TestCanonicalLaneIsReusedWithItsState(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{})
	ctx := context.Background()
	l1, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	assert.True(t, l1.Fresh)
	assert.False(t, l1.Fork)
	owner, ok := p.Owner(root)
	assert.True(t, ok, "a live lane names its account, even while busy")
	assert.Equal(t, "acc_a", owner)
	st := State{ResponseID: "resp_1", History: []string{"a", "b"}}
	l1.Release(st, true)
	l1.Release(st, true) // twice is harmless

	k, ok := p.Alias("resp_1")
	assert.True(t, ok)
	assert.Equal(t, root, k, "the response id finds its lane")
	assert.True(t, p.Holds(root, "acc_a", "resp_1"), "the lane holds the chain up to its last response")
	assert.False(t, p.Holds(root, "acc_b", "resp_1"), "on its own account only")
	assert.False(t, p.Holds(root, "acc_a", "resp_0"))
	assert.False(t, p.Holds(child, "acc_a", "resp_1"))

	l2, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	assert.False(t, l2.Fresh, "reused")
	assert.Same(t, l1.Lane, l2.Lane)
	assert.Equal(t, st, l2.State)
	l2.Release(State{ResponseID: "resp_2"}, true)
	_, ok = p.Alias("resp_1")
	assert.False(t, ok, "an older alias goes when the lane moves on")
	assert.EqualValues(t, 1, u.dials.Load())
	assert.Equal(t, 1, p.Len())
}

func TestConcurrentRequestGetsAForkReleasedWithIt(t *testing.T) {
	u := newUpstream(t)
	p, clk, events := newTestPool(t, PoolConfig{})
	ctx := context.Background()
	canon, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	fork, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	assert.True(t, fork.Fork)
	assert.NotSame(t, canon.Lane, fork.Lane)
	assert.Equal(t, 2, p.Len())
	assert.Len(t, p.Infos(), 2)

	fork.Release(State{ResponseID: "resp_fork"}, true)
	assert.Equal(t, 1, p.Len(), "a fork is released with its request, not kept idle")
	assert.False(t, fork.Lane.Alive())
	_, ok := p.Alias("resp_fork")
	assert.False(t, ok, "a fork's responses do not alias the thread's lane")
	canon.Release(State{ResponseID: "resp_1"}, true)
	assert.Contains(t, *events, "forked")

	// Another thread of the same session never shares the lane.
	other, err := p.Acquire(ctx, child, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	assert.NotSame(t, canon.Lane, other.Lane)
	assert.Empty(t, other.State.ResponseID)
	other.Release(State{}, true)
}

func TestLaneRetiredForAnotherAccountAgeOrFailure(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{MaxAge: time.Hour})
	ctx := context.Background()
	l, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	l.Release(State{ResponseID: "r1"}, true)

	moved, err := p.Acquire(ctx, root, "acc_b", u.dialer("acc_b", clk.Now), nil)
	require.NoError(t, err)
	assert.True(t, moved.Fresh, "a lane on another account is retired, not reused")
	assert.Empty(t, moved.State.ResponseID, "the new lane holds nothing: the request goes in full")
	assert.False(t, l.Lane.Alive())
	moved.Release(State{ResponseID: "r2"}, true)

	clk.Add(time.Hour)
	aged, err := p.Acquire(ctx, root, "acc_b", u.dialer("acc_b", clk.Now), nil)
	require.NoError(t, err)
	assert.True(t, aged.Fresh, "a lane at its maximum age is replaced before the upstream's limit")
	aged.Release(State{}, false)
	assert.False(t, aged.Lane.Alive(), "an unhealthy lane is closed")
	assert.Equal(t, 0, p.Len())
	_, ok := p.Owner(root)
	assert.False(t, ok)
}

// A lane past its maximum age is retired only at a turn boundary, between
// two requests, never under one: the sweeper passes a busy lane by, a
// concurrent request gets a fork, and the request after gets a fresh lane
// holding nothing (so it goes in full), counted as aged out. A thread's
// bridge lane and a client connection's direct lane alike.
func TestAgedLaneIsRetiredOnlyAtATurnBoundary(t *testing.T) {
	for name, k := range map[string]Key{"bridge": root, "direct": {Thread: root.Thread, Scope: root.Scope, Conn: "ws_1"}} {
		t.Run(name, func(t *testing.T) {
			u := newUpstream(t)
			p, clk, events := newTestPool(t, PoolConfig{MaxAge: 55 * time.Minute, IdleTimeout: 2 * time.Hour})
			ctx := context.Background()
			busy, err := p.Acquire(ctx, k, "acc_a", u.dialer("acc_a", clk.Now), nil)
			require.NoError(t, err)

			clk.Add(time.Hour) // past the maximum age, mid-request
			p.Sweep()
			assert.True(t, busy.Lane.Alive(), "the sweeper never closes a lane under a request")
			fork, err := p.Acquire(ctx, k, "acc_a", u.dialer("acc_a", clk.Now), nil)
			require.NoError(t, err)
			assert.True(t, fork.Fork, "a concurrent request gets a lane of its own")
			fork.Release(State{}, true)
			assert.True(t, busy.Lane.Alive(), "nor does another request")
			busy.Release(State{ResponseID: "r1"}, true)

			next, err := p.Acquire(ctx, k, "acc_a", u.dialer("acc_a", clk.Now), nil)
			require.NoError(t, err)
			assert.True(t, next.Fresh, "the next request gets a fresh lane")
			assert.Empty(t, next.State.ResponseID, "holding nothing: the request goes in full")
			assert.False(t, busy.Lane.Alive(), "the aged lane was closed at the turn boundary")
			assert.Equal(t, []string{"opened", "forked", "released", "aged_out", "opened"}, *events)
			next.Release(State{ResponseID: "r2"}, true)

			clk.Add(time.Hour)
			p.Sweep()
			assert.False(t, next.Lane.Alive(), "an idle aged lane is closed by the sweeper")
			assert.Equal(t, "aged_out", (*events)[len(*events)-1])
			assert.Equal(t, 0, p.Len())
		})
	}
}

func TestCapacityWaitHasADeadlineAndKeepsTheClientAlive(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{MaxLanesPerAccount: 1, WaitTimeout: 20 * time.Second})
	ctx := context.Background()
	held, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)

	got := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(ctx, child, "acc_a", u.dialer("acc_a", clk.Now), nil)
		assert.NoError(t, err)
		got <- l
	}()
	select {
	case <-got:
		t.Fatal("the cap was not enforced")
	case <-time.After(100 * time.Millisecond):
	}
	held.Release(State{}, false) // frees the slot
	select {
	case l := <-got:
		require.NotNil(t, l)
		l.Release(State{}, true)
	case <-time.After(time.Minute):
		t.Fatal("the waiter did not get the freed slot")
	}

	// At the cap, an idle lane of another thread gives way at once.
	third, err := p.Acquire(ctx, Key{Thread: "third"}, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err, "the idle child lane was evicted for a request in hand")
	_, ok := p.Owner(child)
	assert.False(t, ok)
	third.Release(State{}, true)

	// A busy lane does not give way: the next thread waits out the deadline.
	short := NewPool(PoolConfig{MaxLanesPerAccount: 1, WaitTimeout: 150 * time.Millisecond, Now: clk.Now})
	defer short.Close()
	busy, err := short.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	_, err = short.Acquire(ctx, child, "acc_a", u.dialer("acc_a", clk.Now), nil)
	assert.ErrorIs(t, err, ErrNoCapacity)
	busy.Release(State{}, true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	blocked, err := short.Acquire(cctx, Key{Thread: "third"}, "acc_a", u.dialer("acc_a", clk.Now), nil)
	assert.Nil(t, blocked)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestDialFailureFreesTheSlot(t *testing.T) {
	p, _, _ := newTestPool(t, PoolConfig{MaxLanesPerAccount: 1})
	boom := errors.New("dial refused")
	for range 3 {
		_, err := p.Acquire(context.Background(), root, "acc_a", func(context.Context) (*Lane, error) { return nil, boom }, nil)
		assert.ErrorIs(t, err, boom)
	}
	assert.Equal(t, 0, p.Len())
	_, ok := p.Owner(root)
	assert.False(t, ok)
}

func TestSweepClosesIdleLanesAndCloseEndsAll(t *testing.T) {
	u := newUpstream(t)
	p, clk, events := newTestPool(t, PoolConfig{IdleTimeout: time.Minute})
	ctx := context.Background()
	a, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	a.Release(State{ResponseID: "r"}, true)
	b, err := p.Acquire(ctx, child, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)

	clk.Add(2 * time.Minute)
	p.Sweep()
	assert.Equal(t, 1, p.Len(), "the idle lane closed; the busy one stays")
	assert.False(t, a.Lane.Alive())
	assert.Contains(t, *events, "idle_closed")

	p.Close()
	assert.False(t, b.Lane.Alive(), "Close ends busy lanes too")
	b.Release(State{}, true)
	_, err = p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	assert.ErrorIs(t, err, ErrClosed)
	require.Eventually(t, func() bool { return u.live.Load() == 0 }, time.Minute, 10*time.Millisecond, "every upstream connection ended")
}

func TestCloseAccountAndForget(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{})
	ctx := context.Background()
	for _, k := range []Key{root, child} {
		l, err := p.Acquire(ctx, k, "acc_a", u.dialer("acc_a", clk.Now), nil)
		require.NoError(t, err)
		l.Release(State{}, true)
	}
	p.Forget(root)
	assert.Equal(t, 1, p.Len())
	assert.Equal(t, 1, p.CloseAccount("acc_a"))
	assert.Equal(t, 0, p.Len())

	busy, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	idle, err := p.Acquire(ctx, child, "acc_b", u.dialer("acc_b", clk.Now), nil)
	require.NoError(t, err)
	idle.Release(State{}, true)
	assert.Equal(t, 1, p.RetireAll(), "every idle lane closes at once, whatever its account; not the busy one")
	assert.Equal(t, 1, p.Len())
	assert.True(t, busy.Lane.Alive(), "a busy lane is never cut mid-turn")
	busy.Release(State{ResponseID: "resp_1"}, true)
	assert.False(t, busy.Lane.Alive(), "it is retired at its turn boundary")
	assert.Equal(t, 0, p.Len())
	_, ok := p.Alias("resp_1")
	assert.False(t, ok, "a retired lane leaves no alias")
}

// A thread's lanes are its bridge lane and every client connection's direct
// lane; forgetting the thread retires all of them, and each closes at its
// own turn boundary.
func TestForgetRetiresEveryLaneOfTheThread(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{})
	ctx := context.Background()
	conn1, conn2 := root, root
	conn1.Conn, conn2.Conn = "ws_1", "ws_2"
	other := child
	other.Conn = "ws_3"
	leases := map[string]*Lease{}
	for name, k := range map[string]Key{"bridge": root, "conn1": conn1, "conn2": conn2, "other": other} {
		l, err := p.Acquire(ctx, k, "acc_a", u.dialer("acc_a", clk.Now), nil)
		require.NoError(t, err)
		leases[name] = l
	}
	assert.Equal(t, 4, p.Len(), "a connection's direct lane is its own, beside the thread's bridge lane")
	leases["bridge"].Release(State{ResponseID: "resp_b"}, true)
	leases["conn1"].Release(State{ResponseID: "resp_1"}, true)
	_, ok := p.Alias("resp_1")
	assert.False(t, ok, "a direct lane's responses are no alias for other requests")
	_, ok = p.Alias("resp_b")
	assert.True(t, ok)

	p.Forget(Key{Thread: root.Thread, Scope: root.Scope, Conn: "whatever"})
	assert.False(t, leases["bridge"].Lane.Alive(), "idle: closed at once")
	assert.False(t, leases["conn1"].Lane.Alive())
	assert.True(t, leases["conn2"].Lane.Alive(), "busy: kept until its turn ends")
	for _, in := range p.Infos() {
		assert.Equal(t, in.Key == conn2, in.Retiring, "%v: operators see the busy lane retiring", in.Key)
	}
	assert.True(t, leases["other"].Lane.Alive(), "another thread is untouched")
	leases["conn2"].Release(State{ResponseID: "resp_2"}, true)
	assert.False(t, leases["conn2"].Lane.Alive())
	_, ok = p.Owner(conn2)
	assert.False(t, ok)
	assert.Equal(t, 1, p.Len())

	kinds := map[string]int{}
	for _, in := range p.Infos() {
		kinds[in.Kind]++
	}
	assert.Equal(t, map[string]int{"direct": 1}, kinds)
	p.Drop(other)
	assert.False(t, leases["other"].Lane.Alive(), "a connection that ended drops its lane, busy or not")
	assert.Equal(t, 0, p.Len())
	leases["other"].Release(State{}, true) // the ended request's release is harmless
	assert.Equal(t, 0, p.Len())
}

// Retire closes the one lane its key names: a thread's bridge lane, not
// the direct lanes of the thread's WebSocket clients; a busy one at its
// release.
func TestRetireClosesOnlyTheLaneItNames(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{})
	ctx := context.Background()
	conn := root
	conn.Conn = "ws_1"
	bridgeLease, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	direct, err := p.Acquire(ctx, conn, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	direct.Release(State{ResponseID: "resp_1"}, true)

	p.Retire(root)
	assert.True(t, bridgeLease.Lane.Alive(), "busy: kept until its request ends")
	assert.True(t, direct.Lane.Alive(), "a WebSocket client's own lane is not the bridge lane")
	bridgeLease.Release(State{ResponseID: "resp_b"}, true)
	assert.False(t, bridgeLease.Lane.Alive(), "closed at its release")
	_, ok := p.Owner(root)
	assert.False(t, ok)
	_, ok = p.Alias("resp_b")
	assert.False(t, ok, "its response is no alias any more")

	again, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	again.Release(State{}, true)
	p.Retire(root)
	assert.False(t, again.Lane.Alive(), "idle: closed at once")
	assert.True(t, direct.Lane.Alive())
	assert.Equal(t, 1, p.Len())
}

// Direct lanes and bridge lanes count against one cap per account.
func TestOneCapForEveryKindOfLane(t *testing.T) {
	u := newUpstream(t)
	p, clk, _ := newTestPool(t, PoolConfig{MaxLanesPerAccount: 2, WaitTimeout: 50 * time.Millisecond})
	ctx := context.Background()
	direct := child
	direct.Conn = "ws_1"
	a, err := p.Acquire(ctx, direct, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	b, err := p.Acquire(ctx, root, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err)
	open, max := p.AccountLanes("acc_a")
	assert.Equal(t, 2, open)
	assert.Equal(t, 2, max)
	other := child
	other.Conn = "ws_2"
	_, err = p.Acquire(ctx, other, "acc_a", u.dialer("acc_a", clk.Now), nil)
	assert.ErrorIs(t, err, ErrNoCapacity, "a third lane of any kind waits for room")
	a.Release(State{}, true)
	c, err := p.Acquire(ctx, other, "acc_a", u.dialer("acc_a", clk.Now), nil)
	require.NoError(t, err, "an idle lane of another key gives way")
	assert.False(t, a.Lane.Alive(), "evicted")
	b.Release(State{}, true)
	c.Release(State{}, true)
	open, _ = p.AccountLanes("acc_a")
	assert.Equal(t, 2, open)
}
