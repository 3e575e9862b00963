package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// upgradeRefusedError is an upstream that answered a WebSocket upgrade with
// a plain HTTP status (426 and the like): it serves HTTP only.
type upgradeRefusedError struct{ status int }

func (e *upgradeRefusedError) Error() string {
	return fmt.Sprintf("upstream refused the WebSocket upgrade with %d", e.status)
}

// httpOnly remembers accounts whose upstream refused WebSocket upgrades, so
// their HTTP clients are served over plain HTTP for a while.
type httpOnly struct {
	mu    sync.Mutex
	until map[string]time.Time // guarded by mu
}

func (h *httpOnly) mark(account string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.until == nil {
		h.until = map[string]time.Time{}
	}
	h.until[account] = until
}

func (h *httpOnly) has(account string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := h.until[account]
	if ok && !now.Before(u) {
		delete(h.until, account)
		return false
	}
	return ok
}

// httpOnlyFor is how long an account that refused WebSocket upgrades is
// served over plain HTTP before the bridge tries it again.
const httpOnlyFor = 10 * time.Minute

// bridgeable reports whether an HTTP request goes over a bridge lane: the
// bridge is on, the request is a Responses turn of a known thread, and the
// account's upstream speaks WebSocket.
func (s *Server) bridgeable(c *call, t Target) bool {
	return s.pool != nil && c.sub == "" && c.ident.Key != "" && !s.httpOnly.has(t.Account.ID, s.cfg.Now())
}

func (c *call) bridgeKey() bridge.Key {
	return bridge.Key{Thread: string(c.ident.Key), Scope: c.client.scope()}
}

// laneKey is the lane a request uses: the one that produced its
// previous_response_id when the pool knows it (an exact alias, within the
// client's scope), else its thread's.
func (s *Server) laneKey(c *call) bridge.Key {
	if p := c.fields.PreviousResponseID; p != "" {
		if k, ok := s.pool.Alias(p); ok && k.Scope == c.client.scope() {
			return k
		}
	}
	return c.bridgeKey()
}

// attemptBridge serves an HTTP request over the thread's upstream lane on
// ch's account: when the lane's history is a prefix of the request, only the
// new items go upstream, chained with previous_response_id; otherwise the
// full request. Events come back as SSE.
func (s *Server) attemptBridge(ctx context.Context, w http.ResponseWriter, out *sseOut, c *call, ch choice) (Outcome, *failure, attemptInfo) {
	acct := ch.target.Account.ID
	defer s.inFlight(acct)()
	var info attemptInfo
	now := s.cfg.Now()
	setHeaders := func(h http.Header) { c.markRecovery(h) }

	dial := func(ctx context.Context) (*bridge.Lane, error) {
		l, err := s.openLane(ctx, ch.target, c.header)
		if l != nil {
			l.SessionID, l.ThreadID = c.ident.Session, c.ident.Thread
		}
		return l, err
	}
	lease, err := s.pool.Acquire(ctx, s.laneKey(c), acct, dial, func() { out.keepAlive(setHeaders) })
	if err != nil {
		info.detail = "lane: " + err.Error()
		var refused *upgradeRefusedError
		if errors.As(err, &refused) {
			// The upstream speaks HTTP only: serve this request (and the
			// account's next ones, for a while) over plain HTTP.
			s.httpOnly.mark(acct, now.Add(httpOnlyFor))
			info.sameAccount = true
			return Outcome{Class: ClassTransport, Action: ActionNext}, &failure{status: http.StatusBadGateway,
				body: errorJSON(apiError{Type: "server_error", Code: "upstream_unreachable", Message: "the upstream refused a WebSocket"}), class: ClassTransport}, info
		}
		o, status, e := dialOutcome(now, err, ctx.Err() != nil)
		if errors.Is(err, bridge.ErrNoCapacity) {
			o.Class = "lane_capacity"
		}
		if e != nil {
			info.status, info.code = status, errCode(e)
			return o, &failure{status: status, body: errorJSON(*e), class: o.Class}, info
		}
		return o, &failure{status: http.StatusServiceUnavailable, body: errorJSON(apiError{Type: "server_error", Code: wire.CodeServerIsOverloaded,
			Message: "no upstream lane could be opened: " + err.Error()}), class: o.Class}, info
	}
	l := lease.Lane
	switch {
	case lease.Fork:
		info.detail = "lane: forked"
	case lease.Fresh:
		info.detail = "lane: opened"
	default:
		info.detail = "lane: reused"
	}

	// What to send: the delta when the lane holds a prefix of the request.
	full := c.fields.Input
	var newItems []json.RawMessage
	var known []string // fingerprints of full[:len(known)], when the lane's history matched them
	prev := ""
	shape := bridge.Shape(c.body)
	switch p := c.fields.PreviousResponseID; {
	case p != "" && lease.State.ResponseID == p:
		prev, newItems = p, c.fields.Input // the client chains on this very lane
		if resolved, err := s.fullInput(c); err == nil {
			full = resolved
		} else {
			full = nil
		}
	case p != "":
		resolved, err := s.fullInput(c)
		if err != nil {
			lease.Release(lease.State, true)
			info.status, info.code = http.StatusBadRequest, wire.CodePreviousResponseNotFound
			return Outcome{Class: ClassPrevNotFound, Action: ActionTerminal}, &failure{status: http.StatusBadRequest,
				body: errorJSON(apiError{Type: "invalid_request_error", Code: wire.CodePreviousResponseNotFound,
					Message: "previous response " + p + " is not held by this relay; send the full request"}), class: ClassPrevNotFound}, info
		}
		full, newItems = resolved, resolved
	default:
		newItems = full
		if delta, from := bridge.Plan(lease.State, shape, full); delta {
			prev, newItems, known = lease.State.ResponseID, full[from:], lease.State.History
		}
	}
	if prev != "" {
		s.metrics.lanes.WithLabelValues("delta").Inc()
		info.detail += ", delta"
	} else {
		s.metrics.lanes.WithLabelValues("full").Inc()
		info.detail += ", full"
	}
	msg, err := bridge.Chain(c.body, newItems, prev)
	if err != nil {
		lease.Release(lease.State, true)
		return Outcome{Class: ClassInvalid, Action: ActionTerminal}, &failure{status: http.StatusBadRequest,
			body: errorJSON(apiError{Type: "invalid_request_error", Code: "invalid_json", Message: err.Error()}), class: ClassInvalid}, info
	}
	l.Drain()
	l.Requests.Add(1)
	if err := l.Send(ctx, msg); err != nil {
		lease.Release(lease.State, false)
		info.detail += "; send: " + err.Error()
		o := Classify(AttemptEnd{Now: now, Transport: err, Cancelled: ctx.Err() != nil})
		return o, &failure{status: http.StatusBadGateway, body: errorJSON(apiError{Type: "server_error", Code: "upstream_unreachable",
			Message: "the upstream connection failed"}), class: o.Class}, info
	}

	onDone := func(tr *tracker) {
		// The lane now holds full then the output; the matched prefix is
		// not fingerprinted twice.
		history := make([]string, 0, len(full)+len(tr.output))
		history = append(history, known...)
		history = append(history, bridge.Fingerprints(full[len(known):])...)
		history = append(history, bridge.Fingerprints(tr.output)...)
		lease.Release(bridge.State{ResponseID: tr.responseID, History: history, Shape: shape, NoChain: lease.State.NoChain}, full != nil)
	}
	end, o, f := s.relaySSE(ctx, out, c, ch, newLaneSource(l), l.Header, full, onDone)
	info.tr, info.status, info.code, info.firstEvent = end.tr, end.status, end.code, end.firstEvent
	if end.detail != "" {
		info.detail += "; " + end.detail
	}
	info.sameAccount = end.sameAccount
	if o.Class == ClassPrevNotFound && prev != "" && c.fields.PreviousResponseID == "" && !end.committed {
		// The upstream refused a chain the relay made (it keeps none on its
		// connections): the same account gets the full request, and this
		// lane is not chained again.
		lease.Release(bridge.State{NoChain: true}, !end.broken)
		s.metrics.lanes.WithLabelValues("chain_refused").Inc()
		info.sameAccount, info.detail = true, info.detail+"; the upstream refused the chain: full request next"
		return Outcome{Class: ClassPrevNotFound, Action: ActionNext}, &failure{status: http.StatusBadGateway,
			body: errorJSON(apiError{Type: "server_error", Message: "the upstream refused a chained request"}), class: ClassPrevNotFound}, info
	}
	if o.Action != ActionDone {
		lease.Release(lease.State, !end.broken)
	}
	return o, f, info
}
