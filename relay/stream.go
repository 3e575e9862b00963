package relay

import (
	"cmp"
	"net/http"
	"strings"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// clientStream is the client side of one request: how its answer reaches
// the client. The SSE client (sse.go) and the WebSocket client
// (websocket.go) each implement it; the attempt loop and the attempts see
// nothing else of the transport. Its methods are called from the request's
// own goroutine, one at a time.
type clientStream interface {
	// lane names the upstream lane the request's attempts use; ok is false
	// when it uses none (plain HTTP upstream requests).
	lane(r *request) (k bridge.Key, ok bool)
	// send forwards one event of the answer; the first one commits the
	// answer with what h says (status, headers, notices).
	send(h *head, typ string, data []byte) error
	// fail answers a failure the client has not seen.
	fail(h *head, f *failure) error
	// reply answers with a whole JSON document (the legacy compact route).
	reply(h *head, status int, body []byte) error
	// waiting tells the client the relay is still at work (it waits for
	// lane capacity), so its connection stays up.
	waiting(h *head)
	// issueTurnState is the turn state the relay gives the client when the
	// upstream gives none: one per turn over HTTP, one per connection over
	// WebSocket. The SSE client announces the turn state with its answer's
	// head (a header, decided at the first event), the WebSocket client as
	// an event before the answer's end (decided when it completes).
	issueTurnState() string
}

// head is what one attempt's answer carries besides its events.
type head struct {
	// upstream holds the upstream answer's headers: rate limits, request
	// ids, and the turn state a lane's upgrade answer gave.
	upstream http.Header
	recovery string // the recovery that led to this attempt ("" none)
	// limits is what the client is told of its limits (the request's; nil:
	// nothing known), in place of the upstream's figures.
	limits *wire.RateLimits
	notice string // the fallback notice ("" none)
	// released: the account that issued the client's turn state failed this
	// request before any work (plan.released); the state now binds the
	// turn to the account that answers.
	released bool
	// tr follows the upstream's stream (its turn state, when it sends one).
	tr *tracker
	// turnState is the turn state the answer gives the client, once
	// decided; proxy marks one the relay issued (the upstream never saw it).
	turnState string
	proxy     bool
	decided   bool
	// created, when set, records a stored response as an object of its
	// account once its id is known (response.created), before the client
	// has the id: a background stream the client leaves is read on through
	// any replica, and charged when read finished.
	created func(responseID string)
}

// decideTurnState fixes, once, the turn state the answer gives: the
// upstream's (from the stream, or its answer's headers), else, when the
// client echoed none, one the relay issues, so the turn's later requests
// stay on this account.
func (h *head) decideTurnState(r *request, cl clientStream) {
	if h.decided {
		return
	}
	h.decided = true
	var streamed string
	if h.tr != nil {
		streamed = h.tr.turnState
	}
	h.turnState = cmp.Or(streamed, h.upstream.Get(wire.HeaderTurnState))
	if h.turnState == "" && r.turnState == "" {
		h.turnState, h.proxy = cl.issueTurnState(), true
	}
}

// setHeaders writes the answer's own headers: the upstream's that Codex
// reads, the client's limits, the recovery, the fallback notice and the
// turn state.
func (h *head) setHeaders(dst http.Header) {
	passHeaders(dst, h.upstream)
	setLimitHeaders(dst, h.limits)
	if h.recovery != "" {
		dst.Set(RecoveryHeader, h.recovery)
	}
	if h.notice != "" {
		dst.Set(FallbackHeader, h.notice)
	}
	if h.turnState != "" {
		dst.Set(wire.HeaderTurnState, h.turnState)
	}
}

// RecoveryHeader names the last recovery action a request needed.
const RecoveryHeader = "X-Codex-Relay-Recovery"

// passHeaders copies upstream answer headers Codex reads: turn state,
// request ids, Codex's other x-codex-* headers. The serving account's own
// limits are not among them (see isAccountLimitHeader): the client is told
// its own.
func passHeaders(dst, src http.Header) {
	for k, vs := range src {
		lk := strings.ToLower(k)
		if (strings.HasPrefix(lk, "x-codex-") || lk == "x-request-id" || strings.HasPrefix(lk, "openai-")) && !isAccountLimitHeader(lk) {
			dst[k] = append([]string(nil), vs...)
		}
	}
}

// newTurnState issues a turn state of the relay's own.
func newTurnState() string { return store.NewSecret("rts_") }
