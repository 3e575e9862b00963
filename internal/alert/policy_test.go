package alert

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The retry schedule: quick first retries, at least five of them, over
// about half an hour.
func TestDefaultSchedule(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at, total := now, time.Duration(0)
	var waits []time.Duration
	for tries := 1; ; tries++ {
		next, ok := NextTry(DefaultSchedule, tries, at)
		if !ok {
			assert.Equal(t, 6, tries, "six tries in all: the first and five retries")
			break
		}
		waits = append(waits, next.Sub(at))
		total += next.Sub(at)
		at = next
	}
	assert.Equal(t, []time.Duration{5 * time.Second, 20 * time.Second, time.Minute, 5 * time.Minute, 25 * time.Minute}, waits)
	assert.InDelta(t, 30*time.Minute, total, float64(2*time.Minute), "about 30 minutes from the first try to the last")
	_, ok := NextTry(DefaultSchedule, 0, now)
	assert.False(t, ok)
}

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	quiet := 15 * time.Minute
	cases := []struct {
		name string
		prev State
		on   bool
		at   time.Time
		want State
		emit Emit
	}{
		{"never seen, not standing", State{}, false, t0, State{}, EmitNone},
		{"starts standing: fires", State{}, true, t0, State{Firing: true, FiredAt: t0}, EmitFired},
		{"still standing: nothing more", State{Firing: true, FiredAt: t0}, true, t0.Add(time.Hour), State{Firing: true, FiredAt: t0}, EmitNone},
		{"stops standing: clears", State{Firing: true, FiredAt: t0}, false, t0.Add(time.Minute), State{FiredAt: t0}, EmitCleared},
		{"still clear: nothing more", State{FiredAt: t0}, false, t0.Add(2 * time.Minute), State{FiredAt: t0}, EmitNone},
		{"back within the quiet period: stands quietly", State{FiredAt: t0}, true, t0.Add(5 * time.Minute), State{Firing: true, Quiet: true, FiredAt: t0}, EmitNone},
		{"a quiet one clearing: nothing", State{Firing: true, Quiet: true, FiredAt: t0}, false, t0.Add(6 * time.Minute), State{FiredAt: t0}, EmitNone},
		{"a quiet one still standing within the period: nothing", State{Firing: true, Quiet: true, FiredAt: t0}, true, t0.Add(14 * time.Minute), State{Firing: true, Quiet: true, FiredAt: t0}, EmitNone},
		{"a quiet one still standing past the period: fires", State{Firing: true, Quiet: true, FiredAt: t0}, true, t0.Add(quiet), State{Firing: true, FiredAt: t0.Add(quiet)}, EmitFired},
		{"back after the quiet period: fires", State{FiredAt: t0}, true, t0.Add(quiet), State{Firing: true, FiredAt: t0.Add(quiet)}, EmitFired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, emit := Decide(c.prev, c.on, c.at, quiet)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.emit, emit)
		})
	}
}
