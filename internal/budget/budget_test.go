package budget

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func TestSpan(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	kolkata := mustZone(t, "Asia/Kolkata")
	at := func(s string, loc *time.Location) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
		require.NoError(t, err)
		return v
	}
	now := at("2026-12-01 23:30", time.UTC) // a Tuesday
	cases := []struct {
		name       string
		w          Window
		loc        *time.Location
		now        time.Time
		start, end time.Time
	}{
		{"minute rolls", Minute, time.UTC, now, now.Add(-time.Minute + time.Millisecond), now},
		{"5h rolls", FiveHours, berlin, now, now.Add(-5*time.Hour + time.Millisecond), now},
		{"day in UTC", Day, time.UTC, now, at("2026-12-01 00:00", time.UTC), at("2026-12-02 00:00", time.UTC)},
		// 23:30 UTC is already Wednesday 00:30 in Berlin.
		{"day in Berlin", Day, berlin, now, at("2026-12-02 00:00", berlin), at("2026-12-03 00:00", berlin)},
		{"day in Kolkata (+05:30)", Day, kolkata, now, at("2026-12-02 00:00", kolkata), at("2026-12-03 00:00", kolkata)},
		{"week from Monday", Week, time.UTC, now, at("2026-11-30 00:00", time.UTC), at("2026-12-07 00:00", time.UTC)},
		{"week on a Sunday", Week, time.UTC, at("2026-12-06 12:00", time.UTC), at("2026-11-30 00:00", time.UTC), at("2026-12-07 00:00", time.UTC)},
		{"week on a Monday", Week, time.UTC, at("2026-11-30 00:00", time.UTC), at("2026-11-30 00:00", time.UTC), at("2026-12-07 00:00", time.UTC)},
		{"month", Month, time.UTC, now, at("2026-12-01 00:00", time.UTC), at("2027-01-01 00:00", time.UTC)},
		{"month in Berlin across a year", Month, berlin, at("2026-12-31 23:30", time.UTC), at("2027-01-01 00:00", berlin), at("2027-02-01 00:00", berlin)},
		// The day DST begins in Berlin is 23 hours long.
		{"day with a DST change", Day, berlin, at("2026-03-29 12:00", berlin), at("2026-03-29 00:00", berlin), at("2026-03-30 00:00", berlin)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start, end := c.w.Span(c.now, c.loc)
			assert.True(t, c.start.Equal(start), "start %v, want %v", start, c.start)
			assert.True(t, c.end.Equal(end), "end %v, want %v", end, c.end)
		})
	}
	s, e := Day.Span(at("2026-03-29 12:00", berlin), berlin)
	assert.Equal(t, 23*time.Hour, e.Sub(s), "the DST day")
}

func TestValidate(t *testing.T) {
	cases := []struct {
		l    Limit
		want string // "" valid
	}{
		{Limit{Tokens, FiveHours, 2e6}, ""},
		{Limit{CostUSD, Month, 50.25}, ""},
		{Limit{Requests, Minute, 60}, ""},
		{Limit{Concurrent, "", 2}, ""},
		{Limit{Requests, Minute, 0}, ""}, // a key that may do nothing
		{Limit{Concurrent, Day, 2}, "no window"},
		{Limit{Tokens, "", 5}, "window must be"},
		{Limit{Tokens, "year", 5}, "window must be"},
		{Limit{"bytes", Day, 5}, "metric must be"},
		{Limit{Tokens, Day, -1}, "max must be"},
		{Limit{Tokens, Day, 1.5}, "whole number"},
	}
	for _, c := range cases {
		err := c.l.Validate()
		if c.want == "" {
			assert.NoError(t, err, "%+v", c.l)
		} else if assert.Error(t, err, "%+v", c.l) {
			assert.Contains(t, err.Error(), c.want)
		}
	}
	assert.ErrorContains(t, ValidateAll([]Limit{{Tokens, Day, 1}, {Tokens, Day, 2}}), "tokens/day is given twice")
	assert.NoError(t, ValidateAll([]Limit{{Tokens, Day, 1}, {Tokens, Week, 2}, {CostUSD, Day, 3}}))
}

func TestCheck(t *testing.T) {
	tokens5h := Limit{Tokens, FiveHours, 1000}
	costMonth := Limit{CostUSD, Month, 50}
	conc := Limit{Concurrent, "", 2}
	reqMin := Limit{Requests, Minute, 1}
	cases := []struct {
		name    string
		ls      []Limit
		st      State
		refused string // "" admitted
	}{
		{"no limits", nil, State{}, ""},
		{"fresh key", []Limit{tokens5h}, State{Settled: []Use{{}}}, ""},
		{"below", []Limit{tokens5h}, State{Settled: []Use{{Tokens: 999}}}, ""},
		{"at max", []Limit{tokens5h}, State{Settled: []Use{{Tokens: 1000}}}, "tokens/5h"},
		{"reservations count", []Limit{tokens5h}, State{Settled: []Use{{Tokens: 500}}, Reserved: Use{Requests: 1, Tokens: 500}}, "tokens/5h"},
		{"max 1 admits one", []Limit{reqMin}, State{Settled: []Use{{}}}, ""},
		{"max 1, one in flight", []Limit{reqMin}, State{Settled: []Use{{}}, Reserved: Use{Requests: 1}}, "requests/minute"},
		{"max 1, one settled", []Limit{reqMin}, State{Settled: []Use{{Requests: 1}}}, "requests/minute"},
		{"concurrent counts in flight only", []Limit{conc}, State{Settled: []Use{{Requests: 99}}, Reserved: Use{Requests: 5}, InFlight: 1}, ""},
		{"concurrent full", []Limit{conc}, State{Settled: []Use{{}}, Reserved: Use{Requests: 2}, InFlight: 2}, "concurrent"},
		{"a completed reservation still counts its use", []Limit{reqMin}, State{Settled: []Use{{}}, Reserved: Use{Requests: 1}}, "requests/minute"},
		{"cost in dollars", []Limit{costMonth}, State{Settled: []Use{{CostNanos: 49_999_999_999}}}, ""},
		{"cost at max", []Limit{costMonth}, State{Settled: []Use{{CostNanos: 50_000_000_000}}}, "cost_usd/month"},
		{"several: the first that refuses", []Limit{tokens5h, costMonth, conc},
			State{Settled: []Use{{Tokens: 10}, {CostNanos: 60e9}, {}}, Reserved: Use{Requests: 2}, InFlight: 2}, "cost_usd/month"},
		{"max 0 refuses everything", []Limit{{Tokens, Day, 0}}, State{Settled: []Use{{}}}, "tokens/day"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.ls, c.st)
			if c.refused == "" {
				assert.Nil(t, r)
				return
			}
			if assert.NotNil(t, r) {
				assert.Equal(t, c.refused, r.Limit.Name())
			}
		})
	}
}

func TestRetryAt(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ev := func(ago time.Duration, tokens int64) Event {
		return Event{At: now.Add(-ago), Use: Use{Requests: 1, Tokens: tokens}}
	}
	l := Limit{Tokens, FiveHours, 1000}
	cases := []struct {
		name     string
		l        Limit
		events   []Event
		reserved Use
		want     time.Time
	}{
		{"the oldest leaving is enough", l, []Event{ev(time.Hour, 400), ev(4*time.Hour, 700)}, Use{},
			now.Add(time.Hour)},
		{"two must leave", l, []Event{ev(3*time.Hour, 500), ev(time.Hour, 500), ev(4*time.Hour, 500)}, Use{},
			now.Add(2 * time.Hour)},
		{"events outside the window do not count", l, []Event{ev(6*time.Hour, 5000), ev(2*time.Hour, 1000)}, Use{},
			now.Add(3 * time.Hour)},
		{"reservations alone fill it", l, []Event{ev(time.Hour, 100)}, Use{Requests: 1, Tokens: 2000},
			now.Add(time.Second)},
		{"calendar: the window's end", Limit{Tokens, Day, 10}, []Event{ev(time.Hour, 100)}, Use{},
			time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
		{"concurrent: soon", Limit{Concurrent, "", 1}, nil, Use{Requests: 1}, now.Add(time.Second)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := RetryAt(c.l, c.events, c.reserved, now, time.UTC, time.Second)
			assert.True(t, c.want.Equal(got), "got %v, want %v", got, c.want)
		})
	}
}

// TestOvershootBound runs requests of one key through admission,
// reservation and settlement in random interleavings, and checks the
// promise of the package: a request starts only while settled plus
// reserved is below max, and the final settled use exceeds max by less
// than what the requests in flight at the last admission used beyond their
// reservations, plus the last request's own use.
func TestOvershootBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	overshot := 0
	for round := range 500 {
		max := int64(1 + rng.IntN(5000))
		ls := []Limit{{Tokens, Day, float64(max)}}
		type flight struct{ est, actual int64 }
		var (
			settled  int64
			inFlight []flight
			bound    int64 // as of the last admission
		)
		for range 200 {
			if len(inFlight) > 0 && rng.IntN(2) == 0 {
				i := rng.IntN(len(inFlight))
				settled += inFlight[i].actual
				inFlight = append(inFlight[:i], inFlight[i+1:]...)
				continue
			}
			var reserved Use
			for _, f := range inFlight {
				reserved = reserved.Add(Use{Requests: 1, Tokens: f.est})
			}
			if r := Check(ls, State{Settled: []Use{{Tokens: settled}}, Reserved: reserved}); r != nil {
				require.GreaterOrEqual(t, settled+reserved.Tokens, max, "round %d: refused below max", round)
				continue
			}
			require.Less(t, settled+reserved.Tokens, max, "round %d: admitted at or over max", round)
			f := flight{est: int64(1 + rng.IntN(300)), actual: int64(rng.IntN(600))}
			bound = max + f.actual
			for _, g := range inFlight {
				bound += g.actual - g.est
			}
			inFlight = append(inFlight, f)
		}
		for _, f := range inFlight {
			settled += f.actual
		}
		if settled > max {
			overshot++
		}
		assert.Less(t, settled, bound, "round %d: settled %d beyond the bound %d", round, settled, bound)
	}
	assert.Positive(t, overshot, "the interleavings never overshot: the test shows nothing")
}

func TestEstimate(t *testing.T) {
	u := Estimate(4000, 1250, 10000) // gpt-5's prices in nanos per token
	assert.Equal(t, int64(1), u.Requests)
	assert.Equal(t, int64(1001+2048), u.Tokens)
	assert.Equal(t, int64(1001*1250+2048*10000), u.CostNanos)
}
