package wire

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRateLimitHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		rl   RateLimits
		want map[string]string
	}{
		{
			"full",
			RateLimits{
				Primary:     &RateLimitWindow{UsedPercent: 12.5, WindowMinutes: 300, ResetAt: 1700000000},
				Secondary:   &RateLimitWindow{UsedPercent: 40, WindowMinutes: 10080, ResetAt: 1700500000},
				Credits:     &Credits{HasCredits: true, Balance: "9.50"},
				ActiveLimit: "codex",
			},
			map[string]string{
				HeaderPrimaryUsedPercent: "12.5", HeaderPrimaryWindowMinutes: "300", HeaderPrimaryResetAt: "1700000000",
				HeaderSecondaryUsedPercent: "40", HeaderSecondaryWindowMinutes: "10080", HeaderSecondaryResetAt: "1700500000",
				HeaderCreditsHasCredits: "true", HeaderCreditsBalance: "9.50", HeaderActiveLimit: "codex",
			},
		},
		{"empty", RateLimits{}, map[string]string{}},
		{
			"primary only",
			RateLimits{Primary: &RateLimitWindow{UsedPercent: 100}},
			map[string]string{HeaderPrimaryUsedPercent: "100"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			tt.rl.SetHeaders(h)
			got := map[string]string{}
			for k := range h {
				got[http.CanonicalHeaderKey(k)] = h.Get(k)
			}
			want := map[string]string{}
			for k, v := range tt.want {
				want[http.CanonicalHeaderKey(k)] = v
			}
			assert.Equal(t, want, got)
			assert.Equal(t, tt.rl, ParseRateLimitHeaders(h))
		})
	}
}

func TestParseRateLimitHeadersLenient(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set(HeaderPrimaryUsedPercent, "abc")
	h.Set(HeaderSecondaryUsedPercent, "3")
	h.Set(HeaderSecondaryWindowMinutes, "x")
	h.Set(HeaderCreditsHasCredits, "maybe")
	rl := ParseRateLimitHeaders(h)
	assert.Nil(t, rl.Primary)
	require.NotNil(t, rl.Secondary)
	assert.Equal(t, RateLimitWindow{UsedPercent: 3}, *rl.Secondary)
	require.NotNil(t, rl.Credits)
	assert.False(t, rl.Credits.HasCredits)
}

func TestRateLimitsEvent(t *testing.T) {
	t.Parallel()
	rl := RateLimits{
		Primary:   &RateLimitWindow{UsedPercent: 7, WindowMinutes: 300, ResetAt: 1100},
		Secondary: &RateLimitWindow{UsedPercent: 29, WindowMinutes: 10080, ResetAt: 900},
		Credits:   &Credits{},
	}
	b, err := json.Marshal(NewRateLimitsEvent("plus", rl, 1000))
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"codex.rate_limits","plan_type":"plus",
		"rate_limits":{"allowed":true,"limit_reached":false,
			"primary":{"used_percent":7,"window_minutes":300,"reset_at":1100,"reset_after_seconds":100},
			"secondary":{"used_percent":29,"window_minutes":10080,"reset_at":900}},
		"credits":{"has_credits":false,"unlimited":false}}`, string(b))

	reached := NewRateLimitsEvent("plus", RateLimits{Secondary: &RateLimitWindow{UsedPercent: 100}}, 0)
	assert.True(t, reached.RateLimits.LimitReached)
	assert.False(t, reached.RateLimits.Allowed)
	assert.Nil(t, reached.RateLimits.Primary)
}
