// Package budget is the arithmetic of client keys' limits: which window a
// limit counts over, whether a request may start given what its key has
// settled and reserved, and when a refused key may try again. Pure: the
// store gathers the figures, this package decides.
//
// A request is admitted while, for every limit of its key, the use settled
// in the limit's window plus the reservations of the key's requests in
// flight is below the limit's max (so max 1 admits exactly one request). An
// admitted request reserves an estimate; when it ends, its real use
// replaces the reservation. Requests in flight at once can therefore
// overshoot a limit by at most what they use beyond what was reserved when
// the last of them was admitted.
package budget

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
)

// Metric is what a limit counts.
type Metric string

// The metrics.
const (
	Requests   Metric = "requests"   // requests the upstream did work for
	Concurrent Metric = "concurrent" // requests in flight (no window)
	Tokens     Metric = "tokens"     // the upstream's usage.total_tokens
	CostUSD    Metric = "cost_usd"   // priced usage, in US dollars
)

// Window is the span a limit counts over.
type Window string

// The windows. Minute and 5h are rolling: the use of the last minute or
// five hours, sliding. Day, week (from Monday) and month are calendar
// windows in the relay's time zone.
const (
	Minute    Window = "minute"
	FiveHours Window = "5h"
	Day       Window = "day"
	Week      Window = "week"
	Month     Window = "month"
)

// Limit is one limit of a key, as the API and the store carry it.
type Limit struct {
	Metric Metric  `json:"metric"`
	Window Window  `json:"window,omitempty"`
	Max    float64 `json:"max"`
}

// Name names the limit for operators and the X-Codex-Relay-Limit header:
// "tokens/5h", "concurrent".
func (l Limit) Name() string {
	if l.Window == "" {
		return string(l.Metric)
	}
	return string(l.Metric) + "/" + string(l.Window)
}

// MaxLimits bounds the limits of one key.
const MaxLimits = 20

// Validate checks one limit.
func (l Limit) Validate() error {
	switch l.Metric {
	case Requests, Tokens, CostUSD:
		if _, ok := windowKinds[l.Window]; !ok {
			return fmt.Errorf("window must be one of minute, 5h, day, week, month for %s", l.Metric)
		}
	case Concurrent:
		if l.Window != "" {
			return errors.New("concurrent takes no window")
		}
	default:
		return fmt.Errorf("metric must be one of requests, concurrent, tokens, cost_usd (got %q)", l.Metric)
	}
	if math.IsNaN(l.Max) || math.IsInf(l.Max, 0) || l.Max < 0 || l.Max > 1e15 {
		return errors.New("max must be a number from 0 to 1e15")
	}
	if l.Metric != CostUSD && l.Max != math.Trunc(l.Max) {
		return fmt.Errorf("max must be a whole number for %s", l.Metric)
	}
	return nil
}

// ValidateAll checks a key's limits: each valid, at most MaxLimits, and no
// metric and window twice.
func ValidateAll(ls []Limit) error {
	if len(ls) > MaxLimits {
		return fmt.Errorf("at most %d limits", MaxLimits)
	}
	seen := map[string]bool{}
	for i, l := range ls {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("limit %d: %w", i+1, err)
		}
		if seen[l.Name()] {
			return fmt.Errorf("limit %d: %s is given twice", i+1, l.Name())
		}
		seen[l.Name()] = true
	}
	return nil
}

// windowKinds maps each windowed span to its rolling length (0: calendar).
var windowKinds = map[Window]time.Duration{Minute: time.Minute, FiveHours: 5 * time.Hour, Day: 0, Week: 0, Month: 0}

// Rolling is the length of a rolling window; 0 for a calendar one.
func (w Window) Rolling() time.Duration { return windowKinds[w] }

// Span is the window containing now: [start, end). A rolling window holds
// what started after now minus its length (start is one millisecond later:
// the store keeps milliseconds) and ends at now; a calendar one ends at its
// next boundary in loc.
func (w Window) Span(now time.Time, loc *time.Location) (start, end time.Time) {
	if d := w.Rolling(); d > 0 {
		return now.Add(-d + time.Millisecond), now
	}
	t := now.In(loc)
	y, m, d := t.Date()
	switch w {
	case Day:
		start = time.Date(y, m, d, 0, 0, 0, 0, loc)
		end = time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		start = time.Date(y, m, d-back, 0, 0, 0, 0, loc)
		end = time.Date(y, m, d-back+7, 0, 0, 0, 0, loc)
	case Month:
		start = time.Date(y, m, 1, 0, 0, 0, 0, loc)
		end = time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return start, end
}

// Use is an amount of use: settled in a window, reserved in flight, or
// estimated for one request.
type Use struct {
	Requests  int64
	Tokens    int64
	CostNanos int64 // billionths of a US dollar
}

// Add is u plus v.
func (u Use) Add(v Use) Use {
	return Use{Requests: u.Requests + v.Requests, Tokens: u.Tokens + v.Tokens, CostNanos: u.CostNanos + v.CostNanos}
}

// Of is the amount of u that limit l counts, in l's unit (US dollars for
// cost). Concurrent counts requests (in flight).
func (l Limit) Of(u Use) float64 {
	switch l.Metric {
	case Requests, Concurrent:
		return float64(u.Requests)
	case Tokens:
		return float64(u.Tokens)
	case CostUSD:
		return float64(u.CostNanos) / 1e9
	}
	return 0
}

// State is what a key has used, as one admission sees it.
type State struct {
	// Settled is the use settled in each limit's window, by index of the
	// key's limits (a concurrent limit's entry is ignored).
	Settled []Use
	// Reserved is the reservations of the key's requests not yet settled:
	// one request each, with its estimated tokens and cost, or its real
	// use once its response completed.
	Reserved Use
	// InFlight is how many of those are still under way (what concurrent
	// counts).
	InFlight int64
	// Oldest is, by index of the key's limits, when the oldest settled use
	// a rolling limit counts started: the window frees room once it
	// leaves. Zero for none, and for other limits.
	Oldest []time.Time
}

// Refusal is a limit a request may not start under.
type Refusal struct {
	Limit Limit
	Index int // the limit's index among the key's
	Used  float64
}

// Check decides an admission: nil when every limit admits the request, or
// the first limit that refuses it.
func Check(ls []Limit, st State) *Refusal {
	for i, l := range ls {
		if used := st.Used(i, l); !(used < l.Max) {
			return &Refusal{Limit: l, Index: i, Used: used}
		}
	}
	return nil
}

// Used is what limit l, the i-th of its key's, counts in st: the requests
// in flight for concurrent, else the use settled in its window plus the
// reservations.
func (st State) Used(i int, l Limit) float64 {
	if l.Metric == Concurrent {
		return float64(st.InFlight)
	}
	used := l.Of(st.Reserved)
	if i < len(st.Settled) {
		used += l.Of(st.Settled[i])
	}
	return used
}

// Event is one settled request's use at its start time, for working out
// when a rolling window admits again.
type Event struct {
	At  time.Time
	Use Use
}

// RetryAt is when a refused key may try again under limit l: a calendar
// window's end; for a rolling window, the earliest time at which enough of
// the settled use (events, in any order) has left the window that the use
// left plus reserved is below max again. A limit that only requests in
// flight exhaust (concurrent, or reservations alone at max) frees when one
// of them ends: retryIn after now.
func RetryAt(l Limit, events []Event, reserved Use, now time.Time, loc *time.Location, retryIn time.Duration) time.Time {
	if l.Metric == Concurrent {
		return now.Add(retryIn)
	}
	length := l.Window.Rolling()
	if length == 0 {
		_, end := l.Window.Span(now, loc)
		return end
	}
	evs := append([]Event(nil), events...)
	sort.Slice(evs, func(i, j int) bool { return evs[i].At.Before(evs[j].At) })
	used := l.Of(reserved)
	for _, e := range evs {
		if e.At.After(now.Add(-length)) {
			used += l.Of(e.Use)
		}
	}
	for _, e := range evs {
		if used < l.Max {
			break
		}
		if !e.At.After(now.Add(-length)) {
			continue
		}
		used -= l.Of(e.Use)
		if used < l.Max {
			return e.At.Add(length)
		}
	}
	return now.Add(retryIn) // what is left is in flight
}

// Estimate is what an admitted request reserves: one request, its input's
// tokens guessed from its size (about four bytes a token) plus an
// allowance for output, and their cost at inputNanos and outputNanos per
// token.
func Estimate(inputBytes int, inputNanosPerToken, outputNanosPerToken float64) Use {
	in := int64(inputBytes/4) + 1
	const outputAllowance = 2048
	cost := float64(in)*inputNanosPerToken + outputAllowance*outputNanosPerToken
	return Use{Requests: 1, Tokens: in + outputAllowance, CostNanos: int64(math.Round(cost))}
}
