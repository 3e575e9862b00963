package ratelimit

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestAllowTakesABurstThenOnePerPeriod(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	l := New(3, 30*time.Second, clk.Now)
	for i := range 3 {
		ok, _ := l.Allow("192.0.2.1")
		require.True(t, ok, "attempt %d", i+1)
	}
	ok, wait := l.Allow("192.0.2.1")
	assert.False(t, ok)
	assert.Equal(t, 30*time.Second, wait)
	ok, _ = l.Allow("192.0.2.2")
	assert.True(t, ok, "another address has its own bucket")
	clk.Add(10 * time.Second)
	_, wait = l.Allow("192.0.2.1")
	assert.Equal(t, 20*time.Second, wait, "the wait counts down")
	clk.Add(20 * time.Second)
	ok, _ = l.Allow("192.0.2.1")
	assert.True(t, ok, "one more after the period")
}

// Check takes nothing; Take spends an attempt even past zero, so failures
// that passed Check together are paid for by a longer wait.
func TestCheckAndTakeCountFailuresOnly(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	l := New(2, 30*time.Second, clk.Now)
	for range 100 {
		ok, _ := l.Check("192.0.2.1")
		require.True(t, ok, "checks alone (successes) never limit")
	}
	assert.Zero(t, l.Len(), "a check remembers nothing")
	l.Take("192.0.2.1")
	ok, _ := l.Check("192.0.2.1")
	assert.True(t, ok)
	l.Take("192.0.2.1")
	ok, wait := l.Check("192.0.2.1")
	assert.False(t, ok)
	assert.Equal(t, 30*time.Second, wait)
	l.Take("192.0.2.1") // a failure that passed Check with the last one
	_, wait = l.Check("192.0.2.1")
	assert.Equal(t, 60*time.Second, wait, "the overshoot is waited for")
	ok, _ = l.Allow("192.0.2.1")
	assert.False(t, ok, "Allow and Check share the bucket")
	clk.Add(60 * time.Second)
	ok, _ = l.Check("192.0.2.1")
	assert.True(t, ok)
}

func TestForgetsIdleAddresses(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	l := New(2, time.Second, clk.Now)
	for i := range MaxAddrs {
		ok, _ := l.Allow("a" + strconv.Itoa(i))
		require.True(t, ok)
	}
	clk.Add(time.Hour)
	ok, _ := l.Allow("new")
	assert.True(t, ok)
	assert.Equal(t, 1, l.Len(), "refilled buckets are dropped when the table is full")
	for i := range 2 * MaxAddrs {
		l.Allow("b" + strconv.Itoa(i))
	}
	assert.LessOrEqual(t, l.Len(), MaxAddrs, "memory stays bounded under many addresses")
	for i := range 2 * MaxAddrs {
		l.Take("c" + strconv.Itoa(i))
	}
	assert.LessOrEqual(t, l.Len(), MaxAddrs, "failures from many addresses too")
}

func TestKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":                  "192.0.2.7",
		"192.0.2.7:4711":             "192.0.2.7",
		"::ffff:192.0.2.7":           "192.0.2.7",
		"2001:db8:1:2:aaaa::1":       "2001:db8:1:2::/64",
		"[2001:db8:1:2:bbbb::9]:443": "2001:db8:1:2::/64",
		"2001:db8:1:3::1":            "2001:db8:1:3::/64",
		"not an address":             "not an address",
	} {
		assert.Equal(t, want, Key(in), in)
	}
	clk := &clock{t: time.Unix(0, 0)}
	l := New(1, time.Minute, clk.Now)
	l.Take("2001:db8:1:2::1")
	ok, _ := l.Check("2001:db8:1:2::ffff")
	assert.False(t, ok, "a /64 is one client")
	ok, _ = l.Check("2001:db8:1:3::1")
	assert.True(t, ok)
}
