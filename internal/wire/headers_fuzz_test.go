package wire

import (
	"math"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzParseRateLimitHeaders feeds the rate-limit headers arbitrary values,
// as an upstream may send them, and checks that a window is there exactly
// when its used-percent header holds a number, that what is read is what
// the headers said (a window length or reset that is not a number reads as
// zero, an absent header as absent), and that windows the relay writes with
// SetHeaders read back the same.
func FuzzParseRateLimitHeaders(f *testing.F) {
	for _, tc := range []struct {
		used, minutes, reset, secondaryUsed, credits, balance, active string
		percent                                                       float64
		windowMinutes                                                 int
		resetAt                                                       int64
	}{
		{"7", "300", "1779398785", "29", "false", "", "codex", 7, 300, 1779398785},
		{"12.5", "10080", "1700500000", "", "true", "9.50", "", 12.5, 10080, 1700500000},
		{"100", "", "", "100.0", "", "", "codex_other", 100, 0, 0},
		{"abc", "x", "-1", " 3", "maybe", "1", "", -0.5, -300, -1},
		{"", "300", "1779398785", "1e400", "TRUE", "", "", 1e308, 1, 1},
		{"0x1p-2", "+300", "0017", "1_000", "1", "", "", 5e-324, math.MaxInt, math.MaxInt64},
		{"NaN", "300", "1779398785", "+Inf", "t", "", "", math.Inf(1), 300, 1779398785},
	} {
		f.Add(tc.used, tc.minutes, tc.reset, tc.secondaryUsed, tc.credits, tc.balance, tc.active, tc.percent, tc.windowMinutes, tc.resetAt)
	}
	f.Fuzz(func(t *testing.T, used, minutes, reset, secondaryUsed, credits, balance, active string,
		percent float64, windowMinutes int, resetAt int64) {
		h := http.Header{}
		for k, v := range map[string]string{
			HeaderPrimaryUsedPercent: used, HeaderPrimaryWindowMinutes: minutes, HeaderPrimaryResetAt: reset,
			HeaderSecondaryUsedPercent: secondaryUsed, HeaderCreditsHasCredits: credits, HeaderCreditsBalance: balance,
			HeaderActiveLimit: active,
		} {
			if v != "" {
				h.Set(k, v)
			}
		}
		rl := ParseRateLimitHeaders(h)
		checkWindow(t, "primary", rl.Primary, used, minutes, reset)
		checkWindow(t, "secondary", rl.Secondary, secondaryUsed, "", "") // its window and reset headers absent
		assert.Equal(t, active, rl.ActiveLimit)
		if credits == "" {
			assert.Nil(t, rl.Credits, "no credits header, no credits")
		} else {
			has, _ := strconv.ParseBool(credits)
			assert.Equal(t, &Credits{HasCredits: has, Balance: balance}, rl.Credits)
		}

		// What the relay writes reads back the same. Percentages are
		// finite; a window length or reset time that is not positive is
		// not written, so it reads back as zero.
		if math.IsNaN(percent) || math.IsInf(percent, 0) {
			percent = 0
		}
		in := RateLimits{Primary: &RateLimitWindow{UsedPercent: percent, WindowMinutes: windowMinutes, ResetAt: resetAt}}
		h = http.Header{}
		in.SetHeaders(h)
		want := *in.Primary
		want.WindowMinutes, want.ResetAt = max(want.WindowMinutes, 0), max(want.ResetAt, 0)
		got := ParseRateLimitHeaders(h)
		require.NotNil(t, got.Primary, "headers %v", h)
		assert.Equal(t, want, *got.Primary, "headers %v", h)
		assert.Nil(t, got.Secondary)
		assert.Nil(t, got.Credits)
	})
}

// checkWindow checks that w is what the headers used, minutes and reset
// said: absent unless used parses as a number; a window length or reset
// that is not a number reads as zero, one out of range as the bound.
func checkWindow(t *testing.T, name string, w *RateLimitWindow, used, minutes, reset string) {
	t.Helper()
	p, err := strconv.ParseFloat(used, 64)
	if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
		assert.Nil(t, w, "%s: used percent %q is not a finite number: no window", name, used)
		return
	}
	require.NotNil(t, w, "%s: used percent %q", name, used)
	assert.Equal(t, p, w.UsedPercent, "%s used percent %q", name, used)
	wantMinutes, _ := strconv.Atoi(minutes)
	assert.Equal(t, wantMinutes, w.WindowMinutes, "%s window minutes %q", name, minutes)
	wantReset, _ := strconv.ParseInt(reset, 10, 64)
	assert.Equal(t, wantReset, w.ResetAt, "%s reset %q", name, reset)
}
