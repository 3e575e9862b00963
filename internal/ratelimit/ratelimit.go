// Package ratelimit limits attempts per client address: a token bucket per
// address, memory bounded whatever the number of addresses. The console's
// login counts every attempt (Allow); the admin API and the client routes
// count failed authentications only (Check before, Take after a failure),
// so a valid credential costs nothing until an address has failed too often,
// and is then refused with the rest.
package ratelimit

import (
	"math"
	"net"
	"sync"
	"time"
)

// The figures of every limit of the relay: a burst of DefaultBurst attempts
// per address, then one more every DefaultRefill.
const (
	DefaultBurst  = 5
	DefaultRefill = 30 * time.Second
)

// MaxAddrs bounds the addresses a Limiter remembers. When it is reached,
// addresses whose buckets have refilled (idle ones) are dropped first, then
// others: forgetting a limited address only lets it try sooner, and a spray
// from more addresses than this must not grow memory.
const MaxAddrs = 10000

// Limiter is a token bucket per client address: burst attempts, then one
// more every period. Addresses are keyed by Key. It is safe for concurrent
// use: burst, every and now are static after New; mu guards buckets.
type Limiter struct {
	burst int
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64   // may go below zero: failures Take found after a Check
	at     time.Time // when tokens was last brought up to date
}

// New returns a Limiter of burst attempts per address, refilled by one every
// period, on the clock now.
func New(burst int, every time.Duration, now func() time.Time) *Limiter {
	return &Limiter{burst: burst, every: every, now: now, buckets: map[string]*bucket{}}
}

// Allow takes one attempt for addr. When none is left it takes nothing and
// reports how long until the next one, rounded up to whole seconds (a
// Retry-After).
func (l *Limiter) Allow(addr string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(Key(addr), now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, l.wait(b)
}

// Check reports whether addr has an attempt left, taking none, and when it
// has not, how long until it has (whole seconds). An authentication checks
// first and calls Take when the credential turns out wrong.
func (l *Limiter) Check(addr string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[Key(addr)]
	if !ok {
		return true, 0
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		return true, 0
	}
	return false, l.wait(b)
}

// Take spends one attempt of addr: a failure. It takes one even when none
// is left, because failures that passed Check at the same moment all count:
// the bucket goes below zero and the address waits that much longer, so
// concurrent attempts do not buy more than the burst and the refill rate.
func (l *Limiter) Take(addr string) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bucket(Key(addr), now).tokens--
}

// bucket returns addr's bucket brought up to now, making it (full) when
// there is none. Called with mu held.
func (l *Limiter) bucket(key string, now time.Time) *bucket {
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= MaxAddrs {
			l.prune(now)
		}
		b = &bucket{tokens: float64(l.burst), at: now}
		l.buckets[key] = b
	}
	l.refill(b, now)
	return b
}

func (l *Limiter) wait(b *bucket) time.Duration {
	wait := time.Duration((1 - b.tokens) * float64(l.every))
	return time.Duration(math.Ceil(wait.Seconds())) * time.Second
}

func (l *Limiter) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(float64(l.burst), b.tokens+float64(elapsed)/float64(l.every))
		b.at = now
	}
}

// prune drops addresses whose buckets have refilled: they carry no state.
// When every address is still limited, it drops some anyway, so memory stays
// bounded. Called with mu held.
func (l *Limiter) prune(now time.Time) {
	for addr, b := range l.buckets {
		l.refill(b, now)
		if b.tokens >= float64(l.burst) {
			delete(l.buckets, addr)
		}
	}
	for addr := range l.buckets {
		if len(l.buckets) < MaxAddrs*9/10 {
			break
		}
		delete(l.buckets, addr)
	}
}

// Len reports how many addresses the limiter remembers.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// Key is the address a client is limited as: an IPv4 address as it is, an
// IPv6 address as its /64 (one host or network usually holds a whole /64,
// and would otherwise have 2^64 budgets), anything else as it is. addr is
// an IP, or host:port.
func Key(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return addr
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}
