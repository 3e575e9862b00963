package web

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/ratelimit"
)

// Failed admin-token attempts on the admin API are audited in aggregate:
// one row per client address per failureWindow, whatever their number, for
// at most maxFailureTallies addresses a window (the attempts of further
// addresses share one more row).
const (
	failureWindow     = time.Minute
	maxFailureTallies = 1000
)

// authFailures gathers failed admin-token attempts into audit rows
// ("api.auth_failed", target the address as ratelimit.Key gives it): a
// window opens at the first failure, and when it has lasted failureWindow
// its rows are written, by a timer or by the first failure after it,
// whichever comes first, or by close. window, now, write and after are
// static; mu guards the rest.
type authFailures struct {
	window time.Duration
	now    func() time.Time
	write  func([]failureTally)
	// after arms a timer calling f after d and returns its stop
	// (time.AfterFunc; tests fire it by hand).
	after func(d time.Duration, f func()) (stop func() bool)

	mu      sync.Mutex
	start   time.Time // the open window's first failure; zero when none is open
	byAddr  map[string]*failureTally
	others  failureTally   // attempts of addresses past maxFailureTallies
	stop    func() bool    // the armed timer's; nil when none is armed
	gen     int            // the armed timer's number: an older one that fires does nothing
	closed  bool           // set by close: no timers any more
	writing sync.WaitGroup // writes of fired timers under way
}

// failureTally is the failed attempts of one address in one window.
type failureTally struct {
	addr    string    // "" for the others
	since   time.Time // the first of them
	wrong   int       // wrong tokens
	refused int       // refused by the rate limit before any check
}

func newAuthFailures(window time.Duration, now func() time.Time, write func([]failureTally)) *authFailures {
	return &authFailures{window: window, now: now, write: write, byAddr: map[string]*failureTally{},
		after: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
}

// add counts a failed attempt of addr: a wrong token, or one refused by the
// rate limit (refused). It writes the rows of a window that has ended.
func (f *authFailures) add(addr string, refused bool) {
	now := f.now()
	key := ratelimit.Key(addr)
	f.mu.Lock()
	due := f.takeDue(now)
	if f.closed {
		// Stopping: nothing will write a tally later, so this one goes now.
		f.mu.Unlock()
		t := failureTally{addr: key, since: now}
		t.count(refused)
		f.write(append(due, t))
		return
	}
	if f.start.IsZero() {
		f.start = now
		f.arm(f.window)
	}
	t, ok := f.byAddr[key]
	switch {
	case ok:
	case len(f.byAddr) < maxFailureTallies:
		t = &failureTally{addr: key, since: now}
		f.byAddr[key] = t
	default:
		t = &f.others
		if t.since.IsZero() {
			t.since = now
		}
	}
	t.count(refused)
	f.mu.Unlock()
	f.write(due)
}

func (t *failureTally) count(refused bool) {
	if refused {
		t.refused++
	} else {
		t.wrong++
	}
}

// arm starts the timer that ends the open window after d. Called with mu
// held.
func (f *authFailures) arm(d time.Duration) {
	f.gen++
	gen := f.gen
	f.stop = f.after(d, func() { f.fire(gen) })
}

// fire is timer gen's: it writes the open window's rows once the window has
// lasted, else waits for the rest of it.
func (f *authFailures) fire(gen int) {
	now := f.now()
	f.mu.Lock()
	if f.closed || gen != f.gen {
		f.mu.Unlock()
		return
	}
	f.stop = nil
	due := f.takeDue(now)
	if !f.start.IsZero() {
		// The clock says the window is still open (a clock behind the
		// timer's): look again when it should have ended.
		f.arm(min(max(f.start.Add(f.window).Sub(now), time.Second), f.window))
	}
	f.writing.Add(1)
	f.mu.Unlock()
	defer f.writing.Done()
	f.write(due)
}

// close writes the open window's rows, however young, and waits for the
// writes of fired timers. Later failures are written one by one.
func (f *authFailures) close() {
	f.mu.Lock()
	f.closed = true
	due := f.takeAll()
	f.mu.Unlock()
	f.write(due)
	f.writing.Wait()
}

// takeDue takes the open window's tallies when it has lasted. Called with mu
// held.
func (f *authFailures) takeDue(now time.Time) []failureTally {
	if f.start.IsZero() || now.Sub(f.start) < f.window {
		return nil
	}
	return f.takeAll()
}

// takeAll takes the open window's tallies, oldest first, and closes it.
// Called with mu held.
func (f *authFailures) takeAll() []failureTally {
	out := make([]failureTally, 0, len(f.byAddr)+1)
	for _, t := range f.byAddr {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b failureTally) int { return cmp.Or(a.since.Compare(b.since), cmp.Compare(a.addr, b.addr)) })
	if f.others.wrong+f.others.refused > 0 {
		out = append(out, f.others)
	}
	clear(f.byAddr)
	f.others, f.start = failureTally{}, time.Time{}
	if f.stop != nil {
		f.stop()
		f.stop = nil
	}
	f.gen++
	return out
}

// detail is the tally's audit detail: "N failed admin-token attempts since
// T", and how many of them the rate limit refused unchecked.
func (t failureTally) detail() string {
	n := t.wrong + t.refused
	s := fmt.Sprintf("%d failed admin-token attempts since %s", n, t.since.UTC().Format(time.RFC3339))
	if n == 1 {
		s = fmt.Sprintf("1 failed admin-token attempt at %s", t.since.UTC().Format(time.RFC3339))
	}
	if t.addr == "" {
		s += fmt.Sprintf(", from addresses beyond the first %d of the window", maxFailureTallies)
	}
	if t.refused > 0 {
		s += fmt.Sprintf(" (%d of them refused by the rate limit without a check)", t.refused)
	}
	return s
}

// auditAuthFailures writes tallies to the audit log, one row each.
func (s *Server) auditAuthFailures(tallies []failureTally) {
	for _, t := range tallies {
		target := t.addr
		if target == "" {
			target = "other addresses"
		}
		s.auditAs(context.Background(), who{Actor: actorAnonymous, Address: t.addr}, "api.auth_failed", target, t.detail())
	}
}
