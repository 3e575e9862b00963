package wire

import (
	"net/http"
	"strings"
	"time"
)

// Headers an upstream sets on a 429 (or 503) to say when to try again.
const (
	// HeaderRetryAfter is RFC 9110's Retry-After: delay-seconds or an
	// HTTP-date.
	HeaderRetryAfter = "retry-after"
	// HeaderRetryAfterMs is OpenAI's finer Retry-After, in milliseconds
	// (the OpenAI SDKs read it before Retry-After).
	HeaderRetryAfterMs = "retry-after-ms"
)

// MaxRetryAfter bounds what ParseRetryAfter returns. A longer wait is
// clamped to it, not refused: the upstream did ask for a long pause (an API
// key's daily limit resets within a day), and retrying sooner than asked
// would only meet the same refusal, while waiting longer than a day on one
// header's word would park the account on what is more likely a bad value.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads how long an upstream asks the client to wait before
// trying again, as of now, and whether it said so in a form understood:
//
//   - retry-after-ms first: a non-negative decimal number of milliseconds,
//     possibly fractional ("1500", "20.5"), as OpenAI sends it;
//   - else Retry-After: delay-seconds, also possibly fractional as the
//     OpenAI SDKs accept it ("30", "0.5"), or an HTTP-date (the three
//     formats of http.ParseTime), taken relative to now; a date already
//     past means no wait, (0, true).
//
// A header that is absent, blank or malformed (a sign, an exponent, NaN, a
// unit, a list) is skipped, so a malformed retry-after-ms falls back to
// Retry-After; with neither usable the answer is (0, false). The result is
// clamped to [0, MaxRetryAfter]. Values are read exactly, without floating
// point: fractions finer than a nanosecond are dropped.
func ParseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get(HeaderRetryAfterMs)); v != "" {
		if d, ok := parseDecimalDuration(v, time.Millisecond); ok {
			return d, true
		}
	}
	v := strings.TrimSpace(h.Get(HeaderRetryAfter))
	if v == "" {
		return 0, false
	}
	if d, ok := parseDecimalDuration(v, time.Second); ok {
		return d, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := at.Sub(now) // saturates rather than overflows for far dates
	return min(max(d, 0), MaxRetryAfter), true
}

// parseDecimalDuration reads s, digits with an optional fraction ("12",
// "12.", "12.5", ".5"), as a count of unit, clamped to MaxRetryAfter.
func parseDecimalDuration(s string, unit time.Duration) (time.Duration, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || !allDigits(whole) || !allDigits(frac) {
		return 0, false
	}
	var n time.Duration // whole units, saturating at the cap
	for i := 0; i < len(whole); i++ {
		n = n*10 + time.Duration(whole[i]-'0')
		if n > MaxRetryAfter/unit {
			return MaxRetryAfter, true
		}
	}
	d := n * unit
	// The fraction of a unit, in nanoseconds: unit is at most a second, so
	// nine digits are all that can count.
	var f, scale time.Duration = 0, 1
	for i := 0; i < len(frac) && i < 9; i++ {
		f, scale = f*10+time.Duration(frac[i]-'0'), scale*10
	}
	d += f * unit / scale
	return min(d, MaxRetryAfter), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
