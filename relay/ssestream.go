package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// relaySSE forwards one request's upstream events, from a lane or an HTTP
// answer, to an SSE client, and maps how the stream ended to the attempt's
// outcome and, when nothing reached the client, the failure it may be sent.
//
// header holds the upstream's answer headers (rate limits, turn state);
// full is the whole input the upstream saw (nil when unknown: nothing is
// remembered); onDone records what only the transport knows (a lane's
// state) before the terminal event reaches the client.
func (s *Server) relaySSE(ctx context.Context, out *sseOut, c *call, ch choice, src eventSource, header http.Header,
	full []json.RawMessage, onDone func(tr *tracker)) (laneEnd, Outcome, *failure) {
	acct := ch.target.Account.ID
	turnState := header.Get(wire.HeaderTurnState)
	proxyTurnState := false
	emit := func(typ string, data []byte, tr *tracker) error {
		first := !out.committed
		out.commit(func(h http.Header) {
			passHeaders(h, header)
			c.markRecovery(h)
			c.noticeHeaders(h, ch.target)
			ts := cmp.Or(tr.turnState, turnState)
			if ts == "" && c.turnState == "" {
				// The upstream gave none: the relay issues one for the turn.
				ts, proxyTurnState = store.NewSecret("rts_"), true
			}
			turnState = ts
			if ts != "" {
				h.Set(wire.HeaderTurnState, ts)
			}
		})
		if n := c.noticeEvent(ch.target); first && n != nil {
			if err := out.event(wire.EventResponseMetadata, n); err != nil {
				return err
			}
		}
		s.metrics.eventsHTTP.Inc()
		return out.event(typ, data)
	}
	settle := func(tr *tracker) {
		if onDone != nil {
			onDone(tr)
		}
		if turnState != "" {
			s.owners.put(turnStateKey(turnState), owner{account: acct, scope: c.client.scope(), proxy: proxyTurnState})
		}
		if full != nil && c.ident.Key != "" && tr.responseID != "" {
			s.conts.Commit(c.contKey(), continuity.Turn{ResponseID: tr.responseID, Input: full, Output: tr.output,
				AccountID: acct, Organization: ch.target.Account.Organization, TurnState: turnState})
		}
		s.settle(context.WithoutCancel(ctx), c, ch, tr.responseID)
	}
	end := s.pumpLane(ctx, c, acct, src, emit, settle)
	tr := end.tr
	switch {
	case end.out.Action == ActionDone, end.clientErr != nil, end.out.Class == ClassCancelled:
		return end, end.out, nil
	case !out.committed && (end.out.Action == ActionNext || tr.failStatus != 0 || end.final == nil):
		// Nothing reached the client: an HTTP error it (or the next
		// account) can act on.
		body := errorJSON(apiError{Type: "server_error", Code: "upstream_stream_interrupted", Message: "the upstream ended before any output"})
		if tr.failure != nil {
			body = errorJSON(*tr.failure)
		}
		return end, end.out, &failure{status: statusOr(tr.failStatus, http.StatusBadGateway), body: body, class: end.out.Class}
	default:
		typ, _ := wire.EventType(end.final)
		if err := emit(typ, end.final, &tr); err != nil {
			return end, Outcome{Class: ClassCancelled, Action: ActionTerminal}, nil
		}
		return end, end.out, nil
	}
}
