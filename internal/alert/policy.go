// Package alert tells operators, through webhooks, about what needs them
// before users notice: an account that needs a new login or is out of
// usage, a pool with no account left, a key near its limit.
//
// It is three parts: the policy here (the retry schedule, and when a
// condition's change makes an event), pure and tested by tables; the
// formats (event.go: the signed generic JSON event and Slack's shape); and
// two loops on the store, the Watcher (watch.go), which evaluates the
// conditions and records their changes, and the Deliverer (deliver.go),
// which sends what is due. Both are safe to run on every replica: a change
// is recorded by one of them (store.TransitionAlert) and each try is made
// by the one that claimed it (store.ClaimDeliveries).
package alert

import "time"

// DefaultSchedule is how long a failed delivery waits before each retry:
// the first retries quick (a receiver restarting), then longer, six tries
// over about 31 minutes in all.
var DefaultSchedule = []time.Duration{5 * time.Second, 20 * time.Second, time.Minute, 5 * time.Minute, 25 * time.Minute}

// NextTry is when a delivery that failed its tries-th try (1 for the
// first) is tried again under schedule, and false when it is out of tries.
func NextTry(schedule []time.Duration, tries int, now time.Time) (time.Time, bool) {
	if tries < 1 || tries > len(schedule) {
		return time.Time{}, false
	}
	return now.Add(schedule[tries-1]), true
}

// DefaultQuiet is the quiet period of a condition: one that comes back
// within it of its last event is not sent again (nor its clearing), so a
// flapping account makes one pair of events, not one per flap.
const DefaultQuiet = 15 * time.Minute

// State is a condition's state as the store keeps it (store.AlertState).
type State struct {
	Firing bool
	// Quiet: firing, but came back within the quiet period of FiredAt, so
	// not sent; it is sent once the quiet period is over and it still
	// stands.
	Quiet   bool
	FiredAt time.Time // the last fired event; zero: none yet
}

// Emit is what a change of state sends.
type Emit int

const (
	EmitNone Emit = iota
	EmitFired
	EmitCleared
)

// Decide is the state machine of one condition: from prev, with the
// condition standing now (on) or not, the next state and what to send. A
// condition fires once when it starts standing and clears once when it
// stops; one that comes back within quiet of its last fired event stands
// quietly (nothing sent, its clearing neither), unless it still stands
// once the quiet period is over: then it fires.
func Decide(prev State, on bool, now time.Time, quiet time.Duration) (State, Emit) {
	withinQuiet := !prev.FiredAt.IsZero() && now.Sub(prev.FiredAt) < quiet
	switch {
	case on && !prev.Firing && withinQuiet:
		return State{Firing: true, Quiet: true, FiredAt: prev.FiredAt}, EmitNone
	case on && !prev.Firing, on && prev.Quiet && !withinQuiet:
		return State{Firing: true, FiredAt: now}, EmitFired
	case !on && prev.Firing && prev.Quiet:
		return State{FiredAt: prev.FiredAt}, EmitNone
	case !on && prev.Firing:
		return State{FiredAt: prev.FiredAt}, EmitCleared
	}
	return prev, EmitNone
}
