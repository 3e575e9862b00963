package wire

import (
	"math"
	"net/http"
	"strconv"
)

// Identity and continuity headers sent by Codex on every request and on the
// WebSocket handshake (see PROTOCOL.md), in canonical lower case.
const (
	HeaderSessionID        = "session-id"
	HeaderThreadID         = "thread-id"
	HeaderClientRequestID  = "x-client-request-id"
	HeaderWindowID         = "x-codex-window-id"
	HeaderTurnMetadata     = "x-codex-turn-metadata"
	HeaderTurnState        = "x-codex-turn-state"
	HeaderParentThreadID   = "x-codex-parent-thread-id"
	HeaderSubagent         = "x-openai-subagent"
	HeaderOriginator       = "originator"
	HeaderChatGPTAccountID = "chatgpt-account-id"
	HeaderOpenAIBeta       = "openai-beta"
)

// OpenAIBetaWebSockets is the OpenAI-Beta value Codex sends on the Responses
// WebSocket handshake.
const OpenAIBetaWebSockets = "responses_websockets=2026-02-06"

// Rate-limit headers an upstream sets on HTTP answers and on the WebSocket
// upgrade answer. Reset times are unix seconds.
const (
	HeaderPrimaryUsedPercent     = "x-codex-primary-used-percent"
	HeaderPrimaryWindowMinutes   = "x-codex-primary-window-minutes"
	HeaderPrimaryResetAt         = "x-codex-primary-reset-at"
	HeaderSecondaryUsedPercent   = "x-codex-secondary-used-percent"
	HeaderSecondaryWindowMinutes = "x-codex-secondary-window-minutes"
	HeaderSecondaryResetAt       = "x-codex-secondary-reset-at"
	HeaderCreditsHasCredits      = "x-codex-credits-has-credits"
	HeaderCreditsBalance         = "x-codex-credits-balance"
	HeaderActiveLimit            = "x-codex-active-limit"
)

// RateLimitWindow is one usage window of an account: how much of it is used
// (0 to 100), how long it is, and when it resets (unix seconds).
type RateLimitWindow struct {
	UsedPercent   float64 `json:"used_percent"`
	WindowMinutes int     `json:"window_minutes,omitempty"`
	ResetAt       int64   `json:"reset_at,omitempty"`
}

// Credits is the credit balance reported beside the usage windows.
type Credits struct {
	HasCredits bool   `json:"has_credits"`
	Unlimited  bool   `json:"unlimited"`
	Balance    string `json:"balance,omitempty"`
}

// RateLimits is what the rate-limit headers and the codex.rate_limits event
// carry: the primary (5-hour) and secondary (weekly) windows, credits, and
// the name of the limit in force. Nil parts are absent.
type RateLimits struct {
	Primary     *RateLimitWindow
	Secondary   *RateLimitWindow
	Credits     *Credits
	ActiveLimit string
}

// SetHeaders writes rl into h as rate-limit headers, replacing earlier ones.
func (rl RateLimits) SetHeaders(h http.Header) {
	setWindow := func(w *RateLimitWindow, used, minutes, reset string) {
		if w == nil {
			return
		}
		h.Set(used, strconv.FormatFloat(w.UsedPercent, 'f', -1, 64))
		if w.WindowMinutes > 0 {
			h.Set(minutes, strconv.Itoa(w.WindowMinutes))
		}
		if w.ResetAt > 0 {
			h.Set(reset, strconv.FormatInt(w.ResetAt, 10))
		}
	}
	setWindow(rl.Primary, HeaderPrimaryUsedPercent, HeaderPrimaryWindowMinutes, HeaderPrimaryResetAt)
	setWindow(rl.Secondary, HeaderSecondaryUsedPercent, HeaderSecondaryWindowMinutes, HeaderSecondaryResetAt)
	if rl.Credits != nil {
		h.Set(HeaderCreditsHasCredits, strconv.FormatBool(rl.Credits.HasCredits))
		if rl.Credits.Balance != "" {
			h.Set(HeaderCreditsBalance, rl.Credits.Balance)
		}
	}
	if rl.ActiveLimit != "" {
		h.Set(HeaderActiveLimit, rl.ActiveLimit)
	}
}

// ParseRateLimitHeaders reads the rate-limit headers of h. A window is
// present when its used-percent header is a finite number (NaN and Inf, which
// strconv accepts, would poison account selection and cannot be encoded as
// JSON); unparsable values are left zero rather than failing, since they
// come from an upstream.
func ParseRateLimitHeaders(h http.Header) RateLimits {
	window := func(used, minutes, reset string) *RateLimitWindow {
		p, err := strconv.ParseFloat(h.Get(used), 64)
		if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
			return nil
		}
		w := &RateLimitWindow{UsedPercent: p}
		w.WindowMinutes, _ = strconv.Atoi(h.Get(minutes))
		w.ResetAt, _ = strconv.ParseInt(h.Get(reset), 10, 64)
		return w
	}
	rl := RateLimits{
		Primary:     window(HeaderPrimaryUsedPercent, HeaderPrimaryWindowMinutes, HeaderPrimaryResetAt),
		Secondary:   window(HeaderSecondaryUsedPercent, HeaderSecondaryWindowMinutes, HeaderSecondaryResetAt),
		ActiveLimit: h.Get(HeaderActiveLimit),
	}
	if v := h.Get(HeaderCreditsHasCredits); v != "" {
		has, _ := strconv.ParseBool(v)
		rl.Credits = &Credits{HasCredits: has, Balance: h.Get(HeaderCreditsBalance)}
	}
	return rl
}

// RateLimitsEvent is the codex.rate_limits event an upstream sends over the
// WebSocket in place of the rate-limit headers, in the shape the ChatGPT
// backend uses:
//
//	{"type":"codex.rate_limits","plan_type":"plus",
//	 "rate_limits":{"allowed":true,"limit_reached":false,
//	   "primary":{"used_percent":7,"window_minutes":300,"reset_after_seconds":13168,"reset_at":1779398785},
//	   "secondary":{...}},
//	 "credits":{"has_credits":false,"unlimited":false}}
type RateLimitsEvent struct {
	Type       string              `json:"type"`
	PlanType   string              `json:"plan_type,omitempty"`
	RateLimits RateLimitsEventBody `json:"rate_limits"`
	Credits    *Credits            `json:"credits,omitempty"`
}

// RateLimitsEventBody is the "rate_limits" object of a RateLimitsEvent.
type RateLimitsEventBody struct {
	Allowed      bool              `json:"allowed"`
	LimitReached bool              `json:"limit_reached"`
	Primary      *EventLimitWindow `json:"primary"`
	Secondary    *EventLimitWindow `json:"secondary"`
}

// EventLimitWindow is a window in a RateLimitsEvent: a RateLimitWindow plus
// the seconds left until it resets.
type EventLimitWindow struct {
	RateLimitWindow
	ResetAfterSeconds int64 `json:"reset_after_seconds,omitempty"`
}

// NewRateLimitsEvent returns the event for rl as seen at unix time now. The
// limit counts as reached when a window is at 100 percent or more.
func NewRateLimitsEvent(planType string, rl RateLimits, now int64) RateLimitsEvent {
	window := func(w *RateLimitWindow) *EventLimitWindow {
		if w == nil {
			return nil
		}
		ew := &EventLimitWindow{RateLimitWindow: *w}
		if w.ResetAt > now {
			ew.ResetAfterSeconds = w.ResetAt - now
		}
		return ew
	}
	reached := rl.Primary != nil && rl.Primary.UsedPercent >= 100 ||
		rl.Secondary != nil && rl.Secondary.UsedPercent >= 100
	return RateLimitsEvent{
		Type:     EventRateLimits,
		PlanType: planType,
		RateLimits: RateLimitsEventBody{
			Allowed:      !reached,
			LimitReached: reached,
			Primary:      window(rl.Primary),
			Secondary:    window(rl.Secondary),
		},
		Credits: rl.Credits,
	}
}
