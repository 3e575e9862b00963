package relay

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/continuity"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// A thread whose events keep flowing never expires mid-use, however long
// the stream; one without activity does.
func TestActiveThreadIsTouchedByItsEvents(t *testing.T) {
	t.Parallel()
	clk := &testClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	conts := continuity.New(continuity.Options{IdleTTL: time.Hour, Now: clk.Now})
	s := New(Config{Store: testStore(t), Now: clk.Now, Continuity: conts, DisableBridge: true})
	active := &request{ident: Identity{Key: "v1:st:active"}}
	quiet := &request{ident: Identity{Key: "v1:st:quiet"}}
	for _, c := range []*request{active, quiet} {
		conts.Commit(c.contKey(), continuity.Turn{ResponseID: "r", Input: []json.RawMessage{json.RawMessage(`{"type":"message","id":"u"}`)}})
	}
	tch := s.newToucher(active)
	for range 3 * 60 * 6 { // three hours of events, ten seconds apart
		clk.Add(10 * time.Second)
		tch.event()
	}
	conts.Sweep()
	_, ok := conts.Lookup(active.contKey())
	assert.True(t, ok, "the streaming thread's entry lives on")
	_, ok = conts.Lookup(quiet.contKey())
	assert.False(t, ok, "the idle one expired")
}

// Soft rows of an active thread are refreshed once a sixtieth of their TTL
// has passed, not on every turn.
func TestNeedsTouch(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		ago  time.Duration
		ttl  time.Duration
		want bool
	}{
		{0, 6 * time.Hour, false},
		{5 * time.Minute, 6 * time.Hour, false},
		{6 * time.Minute, 6 * time.Hour, true},
		{2 * time.Hour, 6 * time.Hour, true},
		{time.Second, time.Minute, true},
		{500 * time.Millisecond, time.Minute, false},
	} {
		assert.Equal(t, tc.want, needsTouch(now.Add(-tc.ago), now, tc.ttl), "seen %s ago, ttl %s", tc.ago, tc.ttl)
	}
}

// fakeTimer is a guard timer the test fires itself.
type fakeTimer struct {
	armed bool
	d     time.Duration
	f     func()
}

func (t *fakeTimer) Reset(d time.Duration) bool { was := t.armed; t.armed, t.d = true, d; return was }
func (t *fakeTimer) Stop() bool                 { was := t.armed; t.armed = false; return was }

// fire runs the timer's function as the runtime would when it expires.
func (t *fakeTimer) fire() {
	if t.armed {
		t.armed = false
		t.f()
	}
}

// A write that does not finish within the timeout lets the client go; one
// that finishes disarms the guard, unless another write is still under way.
func TestWriteGuard(t *testing.T) {
	t.Parallel()
	var timer *fakeTimer
	stuck := 0
	g := &writeGuard{timeout: 30 * time.Second, onStuck: func() { stuck++ }, afterFunc: func(d time.Duration, f func()) guardTimer {
		timer = &fakeTimer{armed: true, d: d, f: f}
		return timer
	}}

	g.begin()
	require.NotNil(t, timer)
	assert.True(t, timer.armed, "armed while the write is under way")
	assert.Equal(t, 30*time.Second, timer.d)
	g.end()
	assert.False(t, timer.armed, "a finished write disarms it")
	timer.fire()
	assert.Zero(t, stuck, "a finished write is not stuck")

	g.begin()
	assert.True(t, timer.armed, "the next write re-arms the one timer")
	g.begin()
	g.end()
	assert.True(t, timer.armed, "the other write is still under way")
	assert.False(t, g.fired())
	timer.fire()
	assert.Equal(t, 1, stuck, "a stuck write lets the client go")
	assert.True(t, g.fired(), "and the guard says so: the write failed for a stalled client")
	g.end()
	assert.False(t, timer.armed)

	def := &writeGuard{onStuck: func() {}}
	def.afterFunc = g.afterFunc
	def.begin()
	assert.Equal(t, clientWriteTimeout, timer.d, "the default timeout")
	def.end()
}
