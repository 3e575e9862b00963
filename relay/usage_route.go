package relay

import (
	"context"
	"math"
	"net/http"
	"slices"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// The routes at which Codex asks its usage for /status, at its
// chatgpt_base_url: /wham/usage when that URL holds /backend-api (so
// chatgpt_base_url = "http://relay/backend-api"), /api/codex/usage
// otherwise, served here under /backend-api too.
const (
	usagePathWham  = "/backend-api/wham/usage"
	usagePathCodex = "/backend-api/api/codex/usage"
)

// chatGPTAnswer is a route of the ChatGPT backend the relay answers
// itself (no account is asked): its two spellings and its answer for the
// client.
type chatGPTAnswer struct {
	paths  [2]string
	answer func(s *Server, r *http.Request, cl client) (any, error)
}

// chatGPTAnswers are those routes: Codex's usage for /status (the same
// figures the client's answers carry, see reportLimits, in the shape of
// the ChatGPT backend's usage payload) and its workspace routing discovery
// (through the relay, the workspace Codex is signed into is the relay,
// with no residency constraint, so its requests stay at the configured
// base URLs; the one workspace listed is the one Codex names, its
// ChatGPT-Account-Id, which it requires to find there, or "relay").
var chatGPTAnswers = []chatGPTAnswer{
	{paths: [2]string{usagePathWham, usagePathCodex}, answer: func(s *Server, r *http.Request, cl client) (any, error) {
		uses, err := s.keyUseNow(r.Context(), cl.key)
		if err != nil {
			return nil, err
		}
		rl, err := s.reportFor(r.Context(), cl.key, uses)
		if err != nil {
			return nil, storeUnavailable("read accounts", err)
		}
		return usagePayloadOf(rl, s.cfg.Now().Unix()), nil
	}},
	{paths: [2]string{accountsCheckWham, accountsCheckCodex}, answer: func(_ *Server, r *http.Request, _ client) (any, error) {
		return accountsCheckOf(r.Header.Get(wire.HeaderChatGPTAccountID)), nil
	}},
}

// serveChatGPTAnswer answers r itself when it is one of chatGPTAnswers,
// for its client key (a wrong key is refused as on every client route;
// only GET is served), and reports whether it was one.
func (s *Server) serveChatGPTAnswer(w http.ResponseWriter, r *http.Request) bool {
	i := slices.IndexFunc(chatGPTAnswers, func(a chatGPTAnswer) bool { return slices.Contains(a.paths[:], r.URL.Path) })
	if i < 0 {
		return false
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		writeError(w, http.StatusMethodNotAllowed, apiError{Type: "invalid_request_error", Code: "method_not_allowed", Message: "use GET"})
		return true
	}
	cl, ok := s.admit(w, r)
	if !ok {
		return true
	}
	v, err := chatGPTAnswers[i].answer(s, r, cl)
	if err != nil {
		s.writeFailure(w, err)
		return true
	}
	b := mustJSON(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return true
}

// The routes at which a ChatGPT-login Codex discovers its workspace's
// routing (which backend origin serves it) before it reads its account
// (app-server account/read, the TUI's start) and, with the built-in
// provider, before every turn: as for usage, under /wham at a
// chatgpt_base_url holding /backend-api, /api/codex otherwise.
const (
	accountsCheckWham  = "/backend-api/wham/accounts/check"
	accountsCheckCodex = "/backend-api/api/codex/accounts/check"
)

// accountsCheck is the ChatGPT backend's accounts/check answer as Codex
// decodes it: the workspaces, their order and the default.
type accountsCheck struct {
	Accounts        []accountEntry `json:"accounts"`
	AccountOrdering []string       `json:"account_ordering"`
	DefaultID       string         `json:"default_account_id"`
}

type accountEntry struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	PlanType string `json:"plan_type"`
	// Origin NO_CONSTRAINT: Codex keeps its configured chatgpt_base_url
	// and provider base_url (the relay's) rather than a discovered origin.
	Origin    string `json:"workspace_backend_origin"`
	Override  string `json:"account_routing_override"`
	Structure string `json:"structure"`
}

// accountsCheckOf lists the one workspace named id (the client's
// ChatGPT-Account-Id; "relay" when it is absent or not a plain id).
func accountsCheckOf(id string) accountsCheck {
	if id == "" || !validObjectID(id) {
		id = "relay"
	}
	return accountsCheck{
		Accounts: []accountEntry{{ID: id, Name: "Codex Relay", PlanType: planTeam, Origin: "NO_CONSTRAINT",
			Override: "NO_CONSTRAINT", Structure: "workspace"}},
		AccountOrdering: []string{id}, DefaultID: id,
	}
}

// planTeam is the plan the relay says it serves, in the usage payload and
// the workspace list: a shared pool, a team's.
const planTeam = "team"

// keyUseNow reads a key's use as an admission would count it, through
// one that only checks (it reserves nothing): nil for a key without
// limits.
func (s *Server) keyUseNow(ctx context.Context, k store.ClientKey) ([]limitUse, error) {
	if len(k.Limits) == 0 {
		return nil, nil
	}
	a, err := s.cfg.Store.Admit(ctx, store.Admission{Key: k, Replica: s.cfg.Replica.ID, LiveSince: s.ReplicaLiveSince(),
		Location: s.cfg.Location, Now: s.cfg.Now()})
	if err != nil {
		return nil, storeUnavailable("check the client key's limits", err)
	}
	return limitUseOf(k.Limits, a), nil
}

// usagePayload is the ChatGPT backend's usage answer as Codex decodes it
// (its RateLimitStatusPayload): every window figure a whole number.
type usagePayload struct {
	// PlanType is required by Codex, from a fixed list: the relay serves a
	// shared pool, and names it a team's.
	PlanType  string          `json:"plan_type"`
	RateLimit *usageRateLimit `json:"rate_limit"`
	// Credits stays null: the relay keeps no credit balance for a key.
	Credits *wire.Credits `json:"credits"`
}

type usageRateLimit struct {
	Allowed         bool          `json:"allowed"`
	LimitReached    bool          `json:"limit_reached"`
	PrimaryWindow   *statusWindow `json:"primary_window"`
	SecondaryWindow *statusWindow `json:"secondary_window"`
}

type statusWindow struct {
	UsedPercent        int   `json:"used_percent"`
	LimitWindowSeconds int   `json:"limit_window_seconds"`
	ResetAfterSeconds  int64 `json:"reset_after_seconds"`
	ResetAt            int64 `json:"reset_at"`
}

// usagePayloadOf is rl in the usage payload's shape, at unix time now; no
// window known is a null rate_limit.
func usagePayloadOf(rl wire.RateLimits, now int64) usagePayload {
	p := usagePayload{PlanType: planTeam}
	if rl.Primary == nil && rl.Secondary == nil {
		return p
	}
	window := func(w *wire.RateLimitWindow) *statusWindow {
		if w == nil {
			return nil
		}
		uw := &statusWindow{UsedPercent: int(math.Round(w.UsedPercent)), LimitWindowSeconds: w.WindowMinutes * 60, ResetAt: w.ResetAt}
		if w.ResetAt > now {
			uw.ResetAfterSeconds = w.ResetAt - now
		}
		return uw
	}
	reached := rl.Primary != nil && rl.Primary.UsedPercent >= 100 || rl.Secondary != nil && rl.Secondary.UsedPercent >= 100
	p.RateLimit = &usageRateLimit{Allowed: !reached, LimitReached: reached, PrimaryWindow: window(rl.Primary), SecondaryWindow: window(rl.Secondary)}
	return p
}
