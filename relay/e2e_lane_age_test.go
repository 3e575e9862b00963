package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay"
)

// laneConversation drives one thread turn by turn as its client would:
// over HTTP, resending the whole history every request (the bridge's
// case); over WebSocket, chaining each turn to the last response with only
// the new message (a client connection's own lane).
type laneConversation struct {
	t      *testing.T
	h      *harness
	thread string
	ws     *wsClient
	// history is what the client holds: its messages and the output items
	// it was sent.
	history []any
	lastID  string
}

func newLaneConversation(t *testing.T, h *harness, transport, thread string) *laneConversation {
	c := &laneConversation{t: t, h: h, thread: thread}
	if transport == "ws" {
		c.ws = h.dialWS(sessionS, thread)
	}
	return c
}

// turn sends one user message and returns the size of the whole history
// behind it (what a request in full carries).
func (c *laneConversation) turn(text string) int {
	c.t.Helper()
	c.history = append(c.history, userMessage(text))
	full := len(c.history)
	var completed map[string]any
	if c.ws == nil {
		req := responseRequest("")
		req["input"] = c.history
		resp, body := c.h.post(sessionS, c.thread, req, nil)
		require.Equal(c.t, http.StatusOK, resp.StatusCode, body)
		completed = completedEvent(c.t, body)
	} else {
		req := map[string]any{"model": "gpt-5.5-codex", "input": []any{userMessage(text)}}
		if c.lastID != "" {
			req["previous_response_id"] = c.lastID
		}
		events := c.ws.turn(req)
		require.Equal(c.t, "response.completed", events[len(events)-1]["type"], "%v", events[len(events)-1])
		completed = events[len(events)-1]
	}
	resp := completed["response"].(map[string]any)
	c.lastID = resp["id"].(string)
	c.history = append(c.history, resp["output"].([]any)...)
	return full
}

// completedEvent returns the response.completed event of an SSE body.
func completedEvent(t *testing.T, sse string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(sse, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if ok && strings.Contains(data, `"response.completed"`) {
			var ev map[string]any
			require.NoError(t, json.Unmarshal([]byte(data), &ev))
			return ev
		}
	}
	t.Fatalf("no response.completed in %q", sse)
	return nil
}

// handshakeTimes maps the sim's WebSocket connections to when they opened.
func handshakeTimes(h *harness) map[int64]time.Time {
	out := map[int64]time.Time{}
	for _, r := range h.sim.Records(sim.RecordFilter{Kind: sim.RecordHandshake}) {
		out[r.ConnID] = r.Time
	}
	return out
}

// A lane is retired at a turn boundary before the upstream's connection
// limit, on both kinds of lanes: with the relay's maximum age well below
// the upstream's, a conversation much longer than the upstream's limit
// never meets it. Every turn completes, each lane is replaced between two
// requests, and the request after each replacement goes in full on the new
// lane, rebuilt from continuity when the client chained to the old one.
func TestLanesRetireBeforeTheUpstreamConnectionLimit(t *testing.T) {
	t.Parallel()
	const (
		upstreamLimit = 1500 * time.Millisecond
		laneMaxAge    = 300 * time.Millisecond
	)
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
				c.Registry = reg
				c.Bridge.MaxAge = laneMaxAge
			}, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(upstreamLimit)})
			require.NoError(t, err)
			thread := map[string]string{"http": "019a3333-0000-7000-8000-0000000000a1", "ws": "019a3333-0000-7000-8000-0000000000a2"}[transport]
			conv := newLaneConversation(t, h, transport, thread)

			// Turns of about 100ms each, for well over twice the upstream's
			// limit: every lane lives through several of them.
			var fullSizes []int
			start := time.Now()
			for n := 1; n <= 6 || time.Since(start) < 2*upstreamLimit+laneMaxAge; n++ {
				require.Less(t, n, 200, "the conversation ends")
				fullSizes = append(fullSizes, conv.turn(fmt.Sprintf("turn %d [[sim:delay 100ms]]", n)))
			}

			recs := h.responseRecords(thread)
			require.Equal(t, len(fullSizes), len(recs), "one upstream request per turn: nothing was retried")
			opened := handshakeTimes(h)
			require.GreaterOrEqual(t, len(opened), 3, "the lanes were replaced")
			require.Greater(t, recs[len(recs)-1].Time.Sub(recs[0].Time), 2*upstreamLimit, "the conversation outlived the upstream's limit")
			account := recs[0].Account
			for i, r := range recs {
				assert.Equal(t, sim.OutcomeCompleted, r.Outcome, "turn %d completed", i+1)
				assert.Empty(t, r.ErrorCode, "turn %d met no error", i+1)
				assert.Equal(t, account, r.Account, "turn %d stayed on its account", i+1)
				assert.Less(t, r.Time.Sub(opened[r.ConnID]), upstreamLimit, "turn %d went on a connection younger than the upstream's limit", i+1)
				if i == 0 || r.ConnID != recs[i-1].ConnID {
					assert.Empty(t, r.PreviousResponseID, "turn %d, the first on its lane, goes in full", i+1)
					assert.Equal(t, fullSizes[i], r.InputCount, "turn %d carries the whole history", i+1)
				} else {
					assert.Equal(t, recs[i-1].ResponseID, r.PreviousResponseID, "turn %d chains on its lane", i+1)
					assert.Less(t, r.InputCount, fullSizes[i], "turn %d carries only what is new", i+1)
				}
			}
			for _, r := range h.sim.Records(sim.RecordFilter{}) {
				assert.NotEqual(t, wire.CodeWebSocketConnectionLimitReached, r.ErrorCode, "no request met the connection limit")
			}

			events := laneEvents(t, reg)
			assert.Equal(t, float64(len(opened)), events["opened"], "every upstream connection is a lane the relay opened")
			assert.Equal(t, float64(len(opened)-1), events["aged_out"], "each lane but the last was retired for its age")
			if transport == "ws" {
				assert.Equal(t, float64(len(opened)-1), events["rebuilt"], "the client's chain went in full on each new lane")
			}
			var atts []store.Attempt
			require.Eventually(t, func() bool {
				atts, _, err = h.store.Attempts(context.Background(), storeFilterThread(thread))
				return err == nil && len(atts) == len(recs)
			}, time.Minute, 10*time.Millisecond, "one attempt per turn, each logged")
			for _, a := range atts {
				assert.Equal(t, "ok", a.Class, "%s", a.Detail)
			}
		})
	}
}

// With the relay's maximum age above the upstream's limit, the limit can
// still arrive while a request waits for its first event: the same
// account's fresh lane takes the request, in full (rebuilt from continuity
// for a chained WebSocket turn), the client sees a plain success, and the
// account is neither penalised nor left.
func TestConnectionLimitBeforeAnyWorkTakesAFreshLane(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a")) // the default maximum age: 55 minutes
			thread := map[string]string{"http": "019a3333-0000-7000-8000-0000000000b1", "ws": "019a3333-0000-7000-8000-0000000000b2"}[transport]
			conv := newLaneConversation(t, h, transport, thread)
			conv.turn("one")
			first := h.responseRecords(thread)
			require.Len(t, first, 1)
			owner := first[0].Account

			// The next lane the upstream accepts ages out after a second, and
			// the next turn takes two before its first event.
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(time.Second), Times: 1})
			require.NoError(t, err)
			require.Equal(t, 1, h.relay.Bridge().CloseAccount(h.ids[owner]), "the thread's idle lane closed: the next turn opens one")
			full := conv.turn("two [[sim:delay 2s]]")

			recs := h.responseRecords(thread)
			require.Equal(t, 3, len(recs), "the first turn, then the second twice")
			limited, retried := recs[1], recs[2]
			assert.Equal(t, wire.CodeWebSocketConnectionLimitReached, limited.ErrorCode, "the limit arrived before any work")
			assert.Equal(t, []string{wire.EventError}, limited.EventTypes, "nothing but the limit was sent")
			assert.NotEqual(t, limited.ConnID, retried.ConnID, "a fresh lane took the request")
			assert.Equal(t, owner, limited.Account)
			assert.Equal(t, owner, retried.Account, "on the same account")
			assert.Equal(t, sim.OutcomeCompleted, retried.Outcome)
			assert.Empty(t, retried.PreviousResponseID, "in full")
			assert.Equal(t, full, retried.InputCount, "with the whole history")
			assert.Zero(t, len(h.sim.Records(sim.RecordFilter{Account: otherAccount(owner), Kind: sim.RecordMessage})), "nothing failed over")

			var rows []store.RequestRecord
			require.Eventually(t, func() bool {
				rows, _, err = h.store.Requests(context.Background(), store.RequestFilter{ThreadID: thread})
				return err == nil && len(rows) == 2
			}, time.Minute, 10*time.Millisecond, "both turns were logged")
			for _, row := range rows {
				assert.Equal(t, http.StatusOK, row.Status, "the client saw success")
			}
			second := rows[0] // newest first
			atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{RequestID: second.ID})
			require.NoError(t, err)
			require.Len(t, atts, 2, "the limit, then the fresh lane")
			sort.Slice(atts, func(i, j int) bool { return atts[i].Seq < atts[j].Seq })
			assert.Equal(t, "connection_limit", atts[0].Class)
			assert.Equal(t, "same_account", atts[0].Action)
			assert.Equal(t, "fresh_lane", atts[0].Recovery)
			assert.Equal(t, "ok", atts[1].Class)
			assert.Contains(t, atts[1].Detail, "lane: opened, full")
			for _, a := range atts {
				assert.Equal(t, h.ids[owner], a.AccountID, "the same account")
			}
			acct, err := h.store.Account(context.Background(), h.ids[owner])
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, acct.Status, "the account is not penalised")
			assert.True(t, acct.StatusUntil.IsZero(), "no cooldown")
		})
	}
}

func otherAccount(simID string) string {
	if simID == "a1" {
		return "a2"
	}
	return "a1"
}

// A lane the upstream ends between its opening and its first request (its
// age limit passing while the relay, under load, still works on the lane:
// here the relay is held at the lane's "opened" event until the upstream
// has closed it): the send fails on a connection the lane's reader saw
// end. The request takes a fresh lane on the same account, as when the
// limit answers a request; the account is not left, nor marked
// unreachable.
func TestLaneEndedBeforeTheRequestWentTakesAFreshLane(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			var hold atomic.Bool
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
				c.Bridge.OnEvent = func(e string) {
					if e == "opened" && hold.CompareAndSwap(true, false) {
						time.Sleep(500 * time.Millisecond) // the upstream ends the lane meanwhile
					}
				}
			}, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			thread := map[string]string{"http": "019a3333-0000-7000-8000-0000000000c1", "ws": "019a3333-0000-7000-8000-0000000000c2"}[transport]
			conv := newLaneConversation(t, h, transport, thread)
			conv.turn("one")
			owner := h.responseRecords(thread)[0].Account

			// The next lane the upstream accepts ends at once, before the
			// relay, held at its opening, sends the request on it.
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(time.Millisecond), Times: 1})
			require.NoError(t, err)
			require.Equal(t, 1, h.relay.Bridge().CloseAccount(h.ids[owner]), "the thread's idle lane closed: the next turn opens one")
			hold.Store(true)
			conv.turn("two")

			for _, rec := range h.sim.Records(sim.RecordFilter{Kind: sim.RecordMessage}) {
				assert.Equal(t, owner, rec.Account, "nothing went to the other account")
			}
			var atts []store.Attempt
			require.Eventually(t, func() bool {
				var err error
				atts, _, err = h.store.Attempts(context.Background(), store.AttemptFilter{ThreadID: thread})
				return err == nil && len(atts) == 3
			}, time.Minute, 10*time.Millisecond, "both turns were logged")
			sort.Slice(atts, func(i, j int) bool { return atts[i].StartedAt.Before(atts[j].StartedAt) || atts[i].Seq < atts[j].Seq })
			ended := atts[1]
			assert.Equal(t, "connection_limit", ended.Class, "detail: %s", ended.Detail)
			assert.Equal(t, "same_account", ended.Action)
			assert.Equal(t, "fresh_lane", ended.Recovery)
			assert.Contains(t, ended.Detail, "the upstream had ended the lane")
			assert.Equal(t, "ok", atts[2].Class)
			for _, a := range atts {
				assert.Equal(t, h.ids[owner], a.AccountID)
			}
			acct, err := h.store.Account(context.Background(), h.ids[owner])
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, acct.Status)
		})
	}
}
