package web

import (
	"math"
	"sync"
	"time"
)

// Login attempts per client address: a burst of loginBurst, then one more
// every loginRefill. Successful logins count too, so the limit cannot be
// reset by a token the attacker already has.
const (
	loginBurst  = 5
	loginRefill = 30 * time.Second
	// limiterMaxAddrs bounds the addresses remembered; full buckets (idle
	// addresses) are dropped first when it is reached.
	limiterMaxAddrs = 10000
)

// loginLimiter is a token bucket per client address. burst, every and now
// are static; mu guards buckets.
type loginLimiter struct {
	burst int
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

func newLoginLimiter(burst int, every time.Duration, now func() time.Time) *loginLimiter {
	return &loginLimiter{burst: burst, every: every, now: now, buckets: map[string]*bucket{}}
}

// allow takes one attempt for addr. When none is left it reports how long
// until the next one.
func (l *loginLimiter) allow(addr string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[addr]
	if !ok {
		if len(l.buckets) >= limiterMaxAddrs {
			l.prune(now)
		}
		b = &bucket{tokens: float64(l.burst), at: now}
		l.buckets[addr] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) * float64(l.every))
	return false, time.Duration(math.Ceil(wait.Seconds())) * time.Second
}

func (l *loginLimiter) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(float64(l.burst), b.tokens+float64(elapsed)/float64(l.every))
		b.at = now
	}
}

// prune drops addresses whose buckets have refilled: they carry no state.
// When every address is still limited, it drops some anyway (forgetting an
// address only lets it try sooner), so memory stays bounded. Called with mu
// held.
func (l *loginLimiter) prune(now time.Time) {
	for addr, b := range l.buckets {
		l.refill(b, now)
		if b.tokens >= float64(l.burst) {
			delete(l.buckets, addr)
		}
	}
	for addr := range l.buckets {
		if len(l.buckets) < limiterMaxAddrs*9/10 {
			break
		}
		delete(l.buckets, addr)
	}
}
