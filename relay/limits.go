package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// What Codex is told of its limits. Codex shows the rate-limit figures it
// is sent (the x-codex-primary-*/secondary-* headers over HTTP, a
// codex.rate_limits event over WebSocket, /wham/usage for /status with a
// ChatGPT login) as the limits that bind its user. Through the relay, what
// binds a user is their client key's own limits, or, without any, the
// pool's room for the key: never the serving account's figures, which
// change with every move between accounts and say nothing of the user.

// limitUse is one of a key's limits and its use in the current window, as
// admission counts it: settled plus reserved, in the limit's unit.
type limitUse struct {
	Limit budget.Limit
	Used  float64
	// Oldest is when the oldest settled use a rolling window counts
	// started (zero: none known).
	Oldest time.Time
}

// limitsInput is what the client is told of its limits depends on.
type limitsInput struct {
	Now      time.Time
	Location *time.Location // calendar windows
	// Key is the client key's limits and their use; only the windowed
	// tokens and cost_usd limits are reported.
	Key []limitUse
	// Pool is the accounts in the key's scope, with the usage windows the
	// relay stored from their upstreams: reported when the key has no
	// limit of its own to report.
	Pool []store.Account
}

// reportLimits is what the client is told of its limits: the key's
// tightest tokens or cost_usd window (the highest used percent; on a tie
// the longer window, which binds longer) as primary, and the tightest
// window of another length as secondary. A key without such limits is told
// the pool's room for it: the windows of the account in its scope with the
// most room (see poolLimits). Nil parts are unknown. Pure.
func reportLimits(in limitsInput) wire.RateLimits {
	type reported struct {
		w       wire.RateLimitWindow
		minutes int
	}
	var ws []reported
	for _, u := range in.Key {
		l := u.Limit
		if l.Metric != budget.Tokens && l.Metric != budget.CostUSD || l.Window == "" {
			continue
		}
		minutes := windowMinutes(l.Window, in.Now, in.Location)
		ws = append(ws, reported{w: wire.RateLimitWindow{UsedPercent: usedPercent(u.Used, l.Max),
			WindowMinutes: minutes, ResetAt: keyReset(u, in.Now, in.Location).Unix()}, minutes: minutes})
	}
	if len(ws) == 0 {
		return poolLimits(in.Pool, in.Now)
	}
	slices.SortStableFunc(ws, func(a, b reported) int {
		return cmp.Or(cmp.Compare(b.w.UsedPercent, a.w.UsedPercent), cmp.Compare(b.minutes, a.minutes))
	})
	rl := wire.RateLimits{Primary: &ws[0].w}
	for i := range ws[1:] {
		if w := &ws[1+i]; w.minutes != ws[0].minutes {
			rl.Secondary = &w.w
			break
		}
	}
	return rl
}

// usedPercent is used of max as Codex shows it: 0 to 100 (a limit may be
// overshot by requests in flight; a max of 0 admits nothing).
func usedPercent(used, max float64) float64 {
	if max <= 0 {
		return 100
	}
	return math.Min(100, math.Max(0, used/max*100))
}

// windowMinutes is a key window's length as Codex reads it: minute 1, 5h
// 300, day 1440, week 10080, and a month the current month's length in loc.
func windowMinutes(w budget.Window, now time.Time, loc *time.Location) int {
	switch w {
	case budget.Day:
		return 24 * 60
	case budget.Week:
		return 7 * 24 * 60
	case budget.Month:
		start, end := w.Span(now, loc)
		return int(end.Sub(start) / time.Minute)
	}
	return int(w.Rolling() / time.Minute)
}

// keyReset is when a key window next frees room: a rolling window when its
// oldest counted use leaves it (a window length from now when none is
// known), a calendar one at its next boundary.
func keyReset(u limitUse, now time.Time, loc *time.Location) time.Time {
	if d := u.Limit.Window.Rolling(); d > 0 {
		if at := u.Oldest.Add(d); !u.Oldest.IsZero() && at.After(now) {
			return at
		}
		return now.Add(d)
	}
	_, end := u.Limit.Window.Span(now, loc)
	return end
}

// poolLimits is the pool's room for a key: among the accounts in its scope
// that may serve (paused, disabled and signed-out accounts cannot; a
// rate-limited one counts, full), the one with the most room in its
// tightest window, with both its windows as its upstream last reported
// them. Accounts whose upstream never reported a window say nothing of
// their room and are passed over; with none left, nothing is known. A
// window whose reset has passed is reported empty, until its next reset.
func poolLimits(accounts []store.Account, now time.Time) wire.RateLimits {
	var best *store.Account
	bestRoom := -1.0
	for i := range accounts {
		a := &accounts[i]
		switch a.Status {
		case store.StatusPaused, store.StatusDisabled, store.StatusReauthRequired:
			continue
		}
		if !a.Primary.Known && !a.Secondary.Known {
			continue
		}
		if room := headroom(*a, now); room > bestRoom {
			best, bestRoom = a, room
		}
	}
	if best == nil {
		return wire.RateLimits{}
	}
	return wire.RateLimits{Primary: accountWindow(best.Primary, now), Secondary: accountWindow(best.Secondary, now)}
}

// accountWindow is a stored account window as the client is told it; nil
// when unknown.
func accountWindow(w store.Window, now time.Time) *wire.RateLimitWindow {
	if !w.Known {
		return nil
	}
	out := &wire.RateLimitWindow{UsedPercent: math.Min(100, math.Max(0, w.UsedPercent)), WindowMinutes: w.WindowMinutes}
	if w.ResetAt.IsZero() {
		return out
	}
	reset := w.ResetAt
	if !now.Before(reset) {
		// It reset since its upstream reported it: empty now, and, when its
		// length is known, due again a whole number of windows later.
		out.UsedPercent = 0
		if d := time.Duration(w.WindowMinutes) * time.Minute; d > 0 {
			reset = reset.Add(d * (now.Sub(reset)/d + 1))
		} else {
			reset = time.Time{}
		}
	}
	if !reset.IsZero() {
		out.ResetAt = reset.Unix()
	}
	return out
}

// limitsFor works out what r's client is told of its limits, once per
// request: from the use its admission read (a key with limits), and the
// accounts in its scope (the store's cached list: no database round trip).
// Nil when the accounts cannot be read.
func (s *Server) limitsFor(ctx context.Context, r *request) *wire.RateLimits {
	rl, err := s.reportFor(ctx, r.client.key, r.keyUse)
	if err != nil {
		return nil
	}
	return &rl
}

// clientLimits is what a client of key k is told of its limits on an
// answer that is no request of its own (/models, the goal routes): its use
// read as an admission would count it. Nil when it cannot be read.
func (s *Server) clientLimits(ctx context.Context, k store.ClientKey) *wire.RateLimits {
	uses, err := s.keyUseNow(ctx, k)
	if err != nil {
		return nil
	}
	rl, err := s.reportFor(ctx, k, uses)
	if err != nil {
		return nil
	}
	return &rl
}

// reportFor is what a client of key k, whose limits stand at uses, is told
// of its limits now (see reportLimits).
func (s *Server) reportFor(ctx context.Context, k store.ClientKey, uses []limitUse) (wire.RateLimits, error) {
	in := limitsInput{Now: s.cfg.Now(), Location: s.cfg.Location, Key: uses}
	if !reportsKeyLimits(k.Limits) {
		accounts, err := s.cfg.Store.Accounts(ctx)
		if err != nil {
			return wire.RateLimits{}, err
		}
		in.Pool = slices.DeleteFunc(accounts, func(a store.Account) bool { return !k.AllowsAccount(a) })
	}
	return reportLimits(in), nil
}

// reportsKeyLimits reports whether a key has a limit the client is told of
// (a windowed tokens or cost_usd limit).
func reportsKeyLimits(ls []budget.Limit) bool {
	return slices.ContainsFunc(ls, func(l budget.Limit) bool {
		return (l.Metric == budget.Tokens || l.Metric == budget.CostUSD) && l.Window != ""
	})
}

// limitUseOf pairs a key's limits with their use as an admission read it.
func limitUseOf(ls []budget.Limit, a store.Admitted) []limitUse {
	out := make([]limitUse, len(ls))
	for i, l := range ls {
		out[i].Limit = l
		if i < len(a.Used) {
			out[i].Used = a.Used[i]
		}
		if i < len(a.Oldest) {
			out[i].Oldest = a.Oldest[i]
		}
	}
	return out
}

// isAccountLimitHeader reports an upstream answer header that carries the
// serving account's own limits or plan, in any of the families Codex
// parses (x-codex-primary-*, x-codex-secondary-*, x-<limit>-primary-*, the
// credits, the limit's name): the relay sends its own figures instead. The
// OpenAI API's x-ratelimit-* headers are the account's too.
func isAccountLimitHeader(lower string) bool {
	if !strings.HasPrefix(lower, "x-") {
		return false
	}
	switch {
	case strings.HasPrefix(lower, "x-ratelimit-"), strings.HasPrefix(lower, "x-codex-credits-"),
		strings.Contains(lower, "-primary-"), strings.Contains(lower, "-secondary-"),
		strings.HasSuffix(lower, "-limit-name"), strings.HasSuffix(lower, "-active-limit"),
		lower == "x-codex-plan-type", lower == "x-codex-promo-message":
		return true
	}
	return false
}

// setLimitHeaders writes what the client is told of its limits as Codex's
// rate-limit headers (nil: nothing is known, and none is written).
func setLimitHeaders(h http.Header, rl *wire.RateLimits) {
	if rl != nil {
		rl.SetHeaders(h)
	}
}

// limitsEvent is what the client is told of its limits as the
// codex.rate_limits event Codex reads over WebSocket.
func (s *Server) limitsEvent(rl *wire.RateLimits) []byte {
	return mustJSON(wire.NewRateLimitsEvent("", *rl, s.cfg.Now().Unix()))
}

// scrubErrorEvent is an upstream's WebSocket error event as the client may
// see it: the serving account's limit headers in its "headers" member
// replaced by the client's own (Codex reads an error's headers as it reads
// an HTTP answer's). Any other event, or one that does not decode, is
// returned as it came.
func scrubErrorEvent(event []byte, rl *wire.RateLimits) []byte {
	if typ, _ := wire.EventType(event); typ != wire.EventError {
		return event
	}
	var ev map[string]json.RawMessage
	var headers map[string]string
	if json.Unmarshal(event, &ev) != nil || json.Unmarshal(ev["headers"], &headers) != nil && ev["headers"] != nil {
		return event
	}
	h := http.Header{}
	for k, v := range headers {
		if !isAccountLimitHeader(strings.ToLower(k)) {
			h[k] = []string{v}
		}
	}
	setLimitHeaders(h, rl)
	if len(h) == 0 && headers == nil {
		return event
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[strings.ToLower(k)] = v[0]
	}
	ev["headers"] = mustJSON(out)
	return mustJSON(ev)
}
