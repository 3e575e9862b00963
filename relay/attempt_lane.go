package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// maxLaneMessageBytes bounds a message the relay sends over an upstream
// lane; a larger request goes as a plain HTTP request instead. Upstream
// WebSocket endpoints refuse large messages (the simulated one at 16 MiB,
// like the real one), and a refused message would otherwise look like a cut
// stream and be tried on every account.
const maxLaneMessageBytes = 15 << 20

// httpOnlyFor is how long an account that refused WebSocket upgrades is
// served over plain HTTP before its lanes are tried again.
const httpOnlyFor = 10 * time.Minute

// attemptLane serves p over the client's upstream lane on ch's account: the
// client's own chain when the lane holds it, only the new items when the
// lane's history is a prefix of the request (HTTP clients resend the whole
// history every time), else the full request. done is false when the
// attempt must go as HTTP instead: the upstream has no WebSocket endpoint,
// or the message is larger than a lane takes.
func (s *Server) attemptLane(ctx context.Context, r *request, p plan, ch *choice, cl clientStream, h *head, key bridge.Key) (res attemptResult, done bool) {
	acct := ch.target.Account.ID
	now := s.cfg.Now()
	if !p.known() && !s.pool.Holds(key, acct, p.prev) {
		// Neither continuity nor the lane holds the chain: no lane is opened
		// only to say so.
		return chainUnknown(now, p), true
	}
	header := s.upstreamHeader(r, p, acct)
	dial := func(ctx context.Context) (*bridge.Lane, error) {
		l, err := s.openLane(ctx, ch.target, header)
		if l != nil {
			l.SessionID, l.ThreadID = r.ident.Session, r.ident.Thread
		}
		return l, err
	}
	if s.cfg.Upstream.egressChanged(ch.target.Account) {
		// Its lanes were dialed through the proxy it named before.
		s.pool.CloseAccount(acct)
	}
	lease, err := s.pool.Acquire(ctx, key, acct, dial, func() { cl.waiting(h) })
	if err != nil {
		var refused *upgradeRefusedError
		if errors.As(err, &refused) {
			// The upstream speaks HTTP only: this request, and the account's
			// next ones for a while, go over plain HTTP.
			s.httpOnly.mark(acct, now.Add(httpOnlyFor))
			return res, false
		}
		res.detail = "lane: " + err.Error()
		res.facts = dialFailure(now, err, ctx.Err() != nil)
		return res, true
	}
	switch {
	case lease.Fork:
		res.detail = "lane: forked"
	case lease.Fresh:
		res.detail = "lane: opened"
	default:
		res.detail = "lane: reused"
	}
	if lease.Fresh {
		// The upgrade answer's usage windows, as an HTTP answer's headers.
		s.foldUsage(acct, lease.Lane.Header)
	}
	out, err := planLaneMessage(lease.State, p)
	if errors.Is(err, errChainUnknown) {
		lease.Release(lease.State, true) // the lane moved on meanwhile
		return chainUnknown(now, p), true
	}
	if err != nil {
		lease.Release(lease.State, true)
		res.detail = joinDetail(res.detail, err.Error())
		res.facts = attemptEnd{Now: now, Status: http.StatusBadRequest,
			Err: &wire.Error{Type: wire.TypeInvalidRequest, Code: "invalid_json", Message: "the request body could not be rewritten for the upstream"}}
		return res, true
	}
	if len(out.msg) > maxLaneMessageBytes {
		lease.Release(lease.State, true)
		return attemptResult{}, false
	}
	res.sentFull = out.full
	if p.prev != "" && out.full {
		s.metrics.lanes.WithLabelValues("rebuilt").Inc() // the client's chain went in full, from continuity
	}
	if out.prev == "" {
		s.metrics.lanes.WithLabelValues("full").Inc()
		res.detail += ", full"
	} else {
		s.metrics.lanes.WithLabelValues("delta").Inc()
		res.detail += ", delta"
	}
	msg := out.msg
	if !s.turnStateFor(r, p, acct) {
		// The client's turn state is not this account's own (another account
		// issued it, or the relay made it up): the upstream must not see it.
		msg = withoutMetadataKey(msg, wire.HeaderTurnState)
	}
	l := lease.Lane
	h.upstream = l.Header
	src := newLaneSource(l, s.cfg.HangUpAfter) // claimed before the request goes: its first event is this request's
	l.Requests.Add(1)
	if err := l.Send(ctx, msg); err != nil {
		src.stop()
		lease.Release(lease.State, false)
		if isTooLarge(err) || isTooLarge(l.Err()) {
			return attemptResult{}, false // over the upstream's message limit: HTTP takes it
		}
		res.detail = joinDetail(res.detail, "send: "+err.Error())
		res.facts = attemptEnd{Now: now, Transport: err, Cancelled: ctx.Err() != nil}
		if lerr := l.Err(); lerr != nil && ctx.Err() == nil {
			// The lane's reader saw the connection end before the request
			// went: the upstream retired it (under load a lane can wait
			// past the upstream's age limit between its opening and its
			// first request), not an upstream that does not answer.
			res.detail = joinDetail(res.detail, "the upstream had ended the lane: "+lerr.Error())
			res.facts = attemptEnd{Now: now, LaneGone: true}
		}
		return res, true
	}
	settle := func(tr *tracker) {
		h.decideTurnState(r, cl)
		// The lane now holds the history then the output; the matched
		// prefix is not fingerprinted twice.
		var history []string
		if out.input != nil {
			history = make([]string, 0, len(out.input)+len(tr.output))
			history = append(history, out.known...)
			history = append(history, bridge.Fingerprints(out.input[len(out.known):])...)
			history = append(history, bridge.Fingerprints(tr.output)...)
		}
		lease.Release(bridge.State{ResponseID: tr.responseID, History: history, Shape: out.shape, NoChain: lease.State.NoChain}, true)
		s.settle(ctx, r, ch, h, tr, out.input)
	}
	s.watchStored(ctx, r, ch, h)
	end := s.pump(ctx, r, acct, src, cl, h, settle)
	if e := end.tr.failure; e != nil && (end.tr.failStatus == http.StatusUnauthorized || e.Code == wire.CodeWebSocketConnectionLimitReached) {
		// The lane's credentials went stale, or the upstream retires the
		// connection: the next attempt needs a fresh one.
		end.broken = true
	}
	if e := end.tr.failure; e != nil && e.Code == wire.CodePreviousResponseNotFound && out.prev != "" && !end.facts.Committed {
		if p.known() {
			// The upstream refused a chain on its own connection: it keeps
			// none. The same account gets the full request, and this lane
			// is not chained again.
			end.facts.ChainRefused = true
			lease.Release(bridge.State{NoChain: true}, !end.broken)
			s.metrics.lanes.WithLabelValues("chain_refused").Inc()
		}
	}
	if !end.facts.Completed {
		lease.Release(lease.State, !end.broken)
	}
	if end.tooLarge && !end.facts.Committed {
		// The upstream closed the lane on the message's size: the same
		// account takes it over HTTP, and no other account is spent on it.
		return attemptResult{}, false
	}
	return res.finish(end), true
}

// laneMessage is what goes over a lane for one attempt.
type laneMessage struct {
	msg  []byte
	prev string // the response it chains to ("": the full request)
	// input is the whole history behind msg (nil when unknown), known the
	// fingerprints of its prefix the lane already held.
	input []json.RawMessage
	known []string
	shape [32]byte
	// full: the body held the whole history, or the relay chose the delta;
	// false when the client's own chain went as it came.
	full bool
}

// errChainUnknown is a request chained to a response neither the lane nor
// continuity holds.
var errChainUnknown = errors.New("previous_response_id unknown to the lane and to continuity")

// planLaneMessage decides what p becomes on a lane in state st. Pure.
func planLaneMessage(st bridge.State, p plan) (laneMessage, error) {
	out := laneMessage{shape: bridge.Shape(p.body)}
	if p.prev != "" && st.ResponseID == p.prev && !st.NoChain {
		// The client chains on this very lane.
		msg, err := bridge.Message(p.body)
		out.msg, out.prev, out.input = msg, p.prev, p.input
		if p.input != nil && len(st.History) <= len(p.input) {
			out.known = st.History
		}
		return out, err
	}
	full, ok := p.full()
	if !ok {
		return out, errChainUnknown
	}
	out.input, out.full = full.input, true
	if delta, from := bridge.Plan(st, out.shape, full.input); delta {
		msg, err := bridge.Chain(full.body, full.input[from:], st.ResponseID)
		out.msg, out.prev, out.known = msg, st.ResponseID, st.History
		return out, err
	}
	msg, err := bridge.Message(full.body)
	out.msg = msg
	return out, err
}

// chainUnknown ends an attempt chained to a response neither the lane nor
// continuity holds: Codex resends the full request on
// previous_response_not_found.
func chainUnknown(now time.Time, p plan) attemptResult {
	res := attemptResult{detail: errChainUnknown.Error()}
	res.facts = attemptEnd{Now: now, Status: http.StatusBadRequest, Err: &wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodePreviousResponseNotFound,
		Message: "previous response " + p.prev + " is not held by this relay or its upstream connection; send the full request"}}
	return res
}

// dialFailure is the facts of a lane that could not be had: an upgrade the
// upstream answered like a request (401, 429, ...), no capacity, or a dial
// that failed.
func dialFailure(now time.Time, err error, cancelled bool) attemptEnd {
	var de *dialStatusError
	switch {
	case errors.As(err, &de):
		return attemptEnd{Now: now, Status: de.status, Err: de.err, Cancelled: cancelled}
	case errors.Is(err, bridge.ErrNoCapacity):
		return attemptEnd{Now: now, LaneCapacity: true, Cancelled: cancelled}
	}
	return attemptEnd{Now: now, Transport: err, Cancelled: cancelled}
}

// turnStateFor decides whether the client's turn state may go to account:
// only when that account issued it upstream (never one the relay made up,
// nor one whose account failed this request).
func (s *Server) turnStateFor(r *request, p plan, account string) bool {
	if r.turnState == "" {
		return true
	}
	if p.released {
		return false
	}
	o, ok := s.owners.get(turnStateKey(r.turnState))
	return ok && !o.proxy && o.account == account
}

// upstreamHeader is the client's headers as they may go to account: its
// turn state header only to the account that issued it.
func (s *Server) upstreamHeader(r *request, p plan, account string) http.Header {
	if r.header.Get(wire.HeaderTurnState) == "" || s.turnStateFor(r, p, account) {
		return r.header
	}
	h := r.header.Clone()
	h.Del(wire.HeaderTurnState)
	return h
}
