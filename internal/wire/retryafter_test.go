package wire

import (
	"math/big"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 21, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name   string
		ms, ra string // retry-after-ms and Retry-After; "" is absent
		want   time.Duration
		ok     bool
	}{
		{"absent", "", "", 0, false},
		{"blank", "  ", " ", 0, false},
		{"milliseconds", "1500", "", 1500 * time.Millisecond, true},
		{"fractional milliseconds", "20.5", "", 20500 * time.Microsecond, true},
		{"milliseconds win over seconds", "250", "30", 250 * time.Millisecond, true},
		{"malformed milliseconds fall back to seconds", "soon", "2", 2 * time.Second, true},
		{"negative milliseconds fall back to seconds", "-5", "3", 3 * time.Second, true},
		{"seconds", "", "30", 30 * time.Second, true},
		{"fractional seconds", "", "0.5", 500 * time.Millisecond, true},
		{"trailing dot", "", "7.", 7 * time.Second, true},
		{"leading dot", "", ".25", 250 * time.Millisecond, true},
		{"spaces around", "", " 7 ", 7 * time.Second, true},
		{"zero: try now", "", "0", 0, true},
		{"leading zeros", "", "0017", 17 * time.Second, true},
		{"fraction finer than a nanosecond dropped", "0.0000019", "", time.Nanosecond, true},
		{"a day is the most", "", "86400", MaxRetryAfter, true},
		{"over a day clamped", "", "86401", MaxRetryAfter, true},
		{"a fraction over a day clamped", "86400000.5", "86400.5", MaxRetryAfter, true},
		{"absurd seconds clamped", "", "99999999999999999999999999", MaxRetryAfter, true},
		{"absurd milliseconds clamped", "1" + strings.Repeat("0", 40) + ".5", "", MaxRetryAfter, true},
		{"HTTP-date", "", date(90 * time.Second), 90 * time.Second, true},
		{"RFC 850 date", "", now.Add(time.Hour).Format(time.RFC850), time.Hour, true},
		{"ANSI C date", "", now.Add(2 * time.Minute).Format(time.ANSIC), 2 * time.Minute, true},
		{"date now", "", date(0), 0, true},
		{"date past: try now", "", date(-time.Hour), 0, true},
		{"date in the year 1", "", "Mon, 01 Jan 0001 00:00:00 GMT", 0, true},
		{"date over a day away clamped", "", date(48 * time.Hour), MaxRetryAfter, true},
		{"date far away clamped", "", "Fri, 31 Dec 9999 23:59:59 GMT", MaxRetryAfter, true},
		{"negative seconds", "", "-5", 0, false},
		{"plus sign", "", "+5", 0, false},
		{"exponent", "", "1e3", 0, false},
		{"NaN", "NaN", "NaN", 0, false},
		{"infinity", "Inf", "+Inf", 0, false},
		{"hex", "0x10", "0x10", 0, false},
		{"a unit", "", "5s", 0, false},
		{"a list", "", "5, 6", 0, false},
		{"two dots", "1.2.3", "1.2.3", 0, false},
		{"a dot alone", ".", ".", 0, false},
		{"not a date", "", "Mon, 32 Foo 2026 12:00:00 GMT", 0, false},
		{"date without zone", "", "2026-05-21T12:01:00", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			if tc.ms != "" {
				h.Set(HeaderRetryAfterMs, tc.ms)
			}
			if tc.ra != "" {
				h.Set(HeaderRetryAfter, tc.ra)
			}
			d, ok := ParseRetryAfter(h, now)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, d)
		})
	}
}

// FuzzParseRetryAfter checks ParseRetryAfter against a reference that
// reads the decimal forms with a regular expression and exact rationals,
// and the date form with http.ParseTime: the result is always within [0,
// MaxRetryAfter], zero when not ok, never ok for values without a digit;
// and a wait given in seconds and the same instant given as an HTTP-date
// agree.
func FuzzParseRetryAfter(f *testing.F) {
	f.Add("", "30", int64(1_779_364_800), int64(90))
	f.Add("1500", "", int64(1_779_364_800), int64(0))
	f.Add("20.5", "120", int64(0), int64(86_400))
	f.Add("soon", "Thu, 21 May 2026 12:01:30 GMT", int64(1_779_364_800), int64(86_401))
	f.Add("-5", "Thursday, 21-May-26 12:01:30 GMT", int64(1_779_364_800), int64(-90))
	f.Add("", "Thu May 21 12:01:30 2026", int64(1_779_364_800), int64(1)<<40)
	f.Add("NaN", "1e3", int64(-62_135_596_800), int64(0))
	f.Add(".5", "99999999999999999999999999.999999999999", int64(253_402_300_799), int64(59))
	f.Add(" 0 ", "0017.", int64(1), int64(-1)<<62)
	f.Add("", "86400.000000001", int64(1_779_364_800), int64(86_399))
	f.Fuzz(func(t *testing.T, ms, ra string, nowUnix, secs int64) {
		now := time.Unix(nowUnix, 0)
		h := http.Header{}
		if ms != "" {
			h.Set(HeaderRetryAfterMs, ms)
		}
		if ra != "" {
			h.Set(HeaderRetryAfter, ra)
		}
		d, ok := ParseRetryAfter(h, now)
		if d < 0 || d > MaxRetryAfter || !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(ms %q, Retry-After %q) = %v, %v: out of [0, %v]", ms, ra, d, ok, MaxRetryAfter)
		}
		if ok && !strings.ContainsAny(ms+ra, "0123456789") {
			t.Fatalf("ParseRetryAfter(ms %q, Retry-After %q) = %v, true: no digit in either", ms, ra, d)
		}
		wantD, wantOK := referenceRetryAfter(ms, ra, now)
		if d != wantD || ok != wantOK {
			t.Fatalf("ParseRetryAfter(ms %q, Retry-After %q, now %v) = %v, %v; reference %v, %v", ms, ra, now, d, ok, wantD, wantOK)
		}

		// The same instant in seconds and as an HTTP-date: they agree,
		// and a date already past is no wait. Dates have whole seconds
		// and four-digit years.
		now = time.Unix(1+mod(nowUnix, 253_402_300_799-2*86_400), 0).UTC()
		secs = mod(secs, 2*86_400+1)
		fromDelay, ok := ParseRetryAfter(http.Header{"Retry-After": {strconv.FormatInt(secs, 10)}}, now)
		if !ok || fromDelay != min(time.Duration(secs)*time.Second, MaxRetryAfter) {
			t.Fatalf("Retry-After: %d = %v, %v", secs, fromDelay, ok)
		}
		at := now.Add(time.Duration(secs) * time.Second).Format(http.TimeFormat)
		fromDate, ok := ParseRetryAfter(http.Header{"Retry-After": {at}}, now)
		if !ok || fromDate != fromDelay {
			t.Fatalf("Retry-After: %s = %v, %v at %v; as seconds %v", at, fromDate, ok, now, fromDelay)
		}
		past := now.Add(-time.Duration(secs) * time.Second).Format(http.TimeFormat)
		if d, ok := ParseRetryAfter(http.Header{"Retry-After": {past}}, now); !ok || d != 0 {
			t.Fatalf("Retry-After: %s = %v, %v at %v; want no wait", past, d, ok, now)
		}
	})
}

// mod is n modulo m in [0, m).
func mod(n, m int64) int64 { return (n%m + m) % m }

var decimal = regexp.MustCompile(`^(?:[0-9]+\.?[0-9]*|\.[0-9]+)$`)

// referenceRetryAfter is ParseRetryAfter written the slow, obvious way.
func referenceRetryAfter(ms, ra string, now time.Time) (time.Duration, bool) {
	ms, ra = strings.TrimSpace(ms), strings.TrimSpace(ra)
	exact := func(s string, unit time.Duration) time.Duration {
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			panic("the regular expression let through " + s)
		}
		r.Mul(r, new(big.Rat).SetInt64(int64(unit)))
		ns := new(big.Int).Quo(r.Num(), r.Denom()) // floor, as both are positive
		if ns.Cmp(big.NewInt(int64(MaxRetryAfter))) > 0 {
			return MaxRetryAfter
		}
		return time.Duration(ns.Int64())
	}
	switch {
	case decimal.MatchString(ms):
		return exact(ms, time.Millisecond), true
	case decimal.MatchString(ra):
		return exact(ra, time.Second), true
	}
	at, err := http.ParseTime(ra)
	if err != nil {
		return 0, false
	}
	switch d := at.Sub(now); {
	case d < 0:
		return 0, true
	case d > MaxRetryAfter:
		return MaxRetryAfter, true
	default:
		return d, true
	}
}
