package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// compactionTrigger ends the input of a compaction request.
func compactionTrigger() map[string]any { return map[string]any{"type": "compaction_trigger"} }

// compactionPool is a relay in front of two accounts of org-a and one of
// org-b, plus a fallback account of org-a (it could read org-a's ciphertext,
// but a compaction never goes to the fallback group). The thread starts on
// a1; b1 and f1 have the most room.
func compactionPool(t *testing.T) *harness {
	t.Helper()
	fb := simAccount("f1", "org-a")
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("b1", "org-b"), fb)
	tags := []string{relay.FallbackTag}
	_, err := h.store.UpdateAccount(context.Background(), h.ids["f1"], store.AccountPatch{Tags: &tags})
	require.NoError(t, err)
	h.setUsed("a2", 50)
	h.setUsed("b1", 60)
	return h
}

// limitOwner puts a1 at its usage limit: the sim answers it 429
// usage_limit_reached (with resets_at) from now on. b1 then has the most
// room of all: the balancer alone would take it.
func (h *harness) limitOwner() {
	h.t.Helper()
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1"})
	require.NoError(h.t, err)
	h.setUsed("b1", 0)
}

// recordsOn returns the thread's response records on one sim account.
func (h *harness) recordsOn(thread, simID string) []sim.Record {
	var out []sim.Record
	for _, r := range h.responseRecords(thread) {
		if r.Account == simID {
			out = append(out, r)
		}
	}
	return out
}

// compactionAttempts waits until the thread has n attempt records that say
// they served a compaction (a request is logged once its client has the
// answer), and returns them oldest first.
func (h *harness) compactionAttempts(thread string, n int) []store.Attempt {
	h.t.Helper()
	var out []store.Attempt
	require.Eventually(h.t, func() bool {
		atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{ThreadID: thread})
		require.NoError(h.t, err)
		out = out[:0]
		for _, a := range atts {
			if strings.HasPrefix(a.Detail, "compaction (") {
				out = append(out, a)
			}
		}
		return len(out) >= n
	}, 10*time.Second, 10*time.Millisecond, "%d compaction attempts of thread %s", n, thread)
	slices.SortFunc(out, func(a, b store.Attempt) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// wsOutputItems returns the items of a WebSocket answer's output_item.done events.
func wsOutputItems(events []map[string]any) []any {
	var out []any
	for _, ev := range events {
		if ev["type"] == "response.output_item.done" {
			out = append(out, ev["item"])
		}
	}
	return out
}

func itemType(item any) string {
	m, _ := item.(map[string]any)
	typ, _ := m["type"].(string)
	return typ
}

// requireUsageLimit checks an answer that tells the client when the
// organisation's accounts come back: 429 usage_limit_reached with resets_at.
func requireUsageLimit(t *testing.T, status int, errBody json.RawMessage) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, status, "%s", errBody)
	var e struct {
		Type     string `json:"type"`
		ResetsAt int64  `json:"resets_at"`
	}
	require.NoError(t, json.Unmarshal(errBody, &e))
	assert.Equal(t, "usage_limit_reached", e.Type)
	assert.Greater(t, e.ResetsAt, time.Now().Unix(), "the client is told when to try again")
}

// An HTTP client compacts its thread with a compaction_trigger request: it
// goes to the thread's account and is recorded as a compaction; the turns
// after it carry the compaction item; when the owner hits its usage limit,
// the next turn moves to the organisation's other account, which reads the
// item. A compaction the organisation cannot serve is refused with the
// reset time, never sent to another organisation or the fallback group.
func TestCompactionOverHTTP(t *testing.T) {
	t.Parallel()
	h := compactionPool(t)
	conv := &conversation{h: h, thread: rootT}
	resp, body := conv.turn("hello")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "a1", h.threadAccount(rootT))

	compact := responseRequest("")
	compact["input"] = append(append([]any{}, conv.history...), compactionTrigger())
	resp, body = h.post(sessionS, rootT, compact, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	out := outputItems(t, body)
	require.Len(t, out, 1, "exactly one output item")
	require.Equal(t, "compaction", itemType(out[0]))
	recs := h.responseRecords(rootT)
	last := recs[len(recs)-1]
	assert.Equal(t, "a1", last.Account, "the compaction went to the thread's account")
	assert.Equal(t, "compaction_trigger", last.InputTypes[len(last.InputTypes)-1])
	atts := h.compactionAttempts(rootT, 1)
	require.Len(t, atts, 1, "the attempt is recorded as a compaction")
	assert.Equal(t, "compaction (compaction_trigger); lane: reused, delta", atts[0].Detail)

	// The client continues from the kept message and the item, as Codex does.
	conv.history = []any{userMessage("hello"), out[0]}
	resp, body = conv.turn("after the compaction")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	h.limitOwner()
	resp, body = conv.turn("and later")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	a2 := h.recordsOn(rootT, "a2")
	require.Len(t, a2, 1, "the organisation's other account took the turn")
	assert.Equal(t, []string{"message", "compaction", "message", "reasoning", "message", "message"}, a2[0].InputTypes,
		"the compaction item, no history from before it")
	assert.Equal(t, sim.OutcomeCompleted, a2[0].Outcome, "a2 read org-a's compaction item")
	assert.Empty(t, h.recordsOn(rootT, "b1"))

	// Neither account of org-a can serve now: the next compaction is
	// refused with a1's reset time.
	h.pause("a2")
	compact["input"] = append(append([]any{}, conv.history...), compactionTrigger())
	resp, body = h.post(sessionS, rootT, compact, nil)
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	requireUsageLimit(t, resp.StatusCode, e.Error)
	assert.Contains(t, body, "compacted only there")
	assert.Empty(t, h.recordsOn(rootT, "b1"), "another organisation cannot read the history")
	assert.Empty(t, h.recordsOn(rootT, "f1"), "nor is a compaction the fallback group's")
	atts = h.compactionAttempts(rootT, 2)
	assert.Equal(t, "no_account", atts[len(atts)-1].Class)
}

// Over WebSocket: a compaction chained on the connection's last response,
// a turn chained on the compaction, and, once the owner is limited, a turn
// rebuilt from continuity for the organisation's other account: it carries
// the compaction item and none of the history before it.
func TestCompactionOverWebSocket(t *testing.T) {
	t.Parallel()
	h := compactionPool(t)
	c := h.dialWS(sessionS, rootT)
	model := "gpt-5.5-codex"
	typ, r1 := lastEvent(c.turn(responseRequest("hello")))
	require.Equal(t, "response.completed", typ)
	require.Equal(t, "a1", h.threadAccount(rootT))

	events := c.turn(map[string]any{"model": model, "previous_response_id": r1, "input": []any{compactionTrigger()}})
	typ, rc := lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	out := wsOutputItems(events)
	require.Len(t, out, 1)
	require.Equal(t, "compaction", itemType(out[0]))
	assert.Len(t, h.compactionAttempts(rootT, 1), 1)

	typ, r3 := lastEvent(c.turn(map[string]any{"model": model, "previous_response_id": rc, "input": []any{userMessage("after the compaction")}}))
	require.Equal(t, "response.completed", typ)
	assert.Len(t, h.recordsOn(rootT, "a1"), 3, "hello, the compaction and the turn after it, all on a1's lane")

	h.limitOwner()
	events = c.turn(map[string]any{"model": model, "previous_response_id": r3, "input": []any{userMessage("and later")}})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	a2 := h.recordsOn(rootT, "a2")
	require.Len(t, a2, 1, "the organisation's other account took the turn")
	assert.Empty(t, a2[0].PreviousResponseID, "rebuilt in full from continuity")
	assert.Equal(t, []string{"message", "compaction", "message", "reasoning", "message", "message"}, a2[0].InputTypes,
		"the compaction item, no history from before it and no trigger")
	assert.Empty(t, h.recordsOn(rootT, "b1"))

	// Neither account of org-a can serve: the compaction is refused with
	// a1's reset time as an error event, and goes nowhere else.
	h.pause("a2")
	_, r4 := lastEvent(events)
	events = c.turn(map[string]any{"model": model, "previous_response_id": r4, "input": []any{compactionTrigger()}})
	ev := events[len(events)-1]
	require.Equal(t, "error", ev["type"], "%v", ev)
	status, _ := ev["status"].(float64)
	errBody, err := json.Marshal(ev["error"])
	require.NoError(t, err)
	requireUsageLimit(t, int(status), errBody)
	assert.Empty(t, h.recordsOn(rootT, "b1"))
	assert.Empty(t, h.recordsOn(rootT, "f1"))
}

// Codex over WebSocket keeps the first turn state of a turn, the prewarm's,
// and echoes it on the turn's later requests. When the compaction chained on
// the prewarm fails over from the limited owner to the organisation's other
// account, the turn that follows it (a full request echoing the prewarm's
// turn state) follows the compaction there, rather than failing closed on
// the owner; the owner's turn state never reaches the other account.
func TestCompactionFailoverKeepsTheTurnTogether(t *testing.T) {
	t.Parallel()
	h := compactionPool(t)
	first := h.dialWS(sessionS, rootT)
	events := first.turn(responseRequest("hello"))
	typ, _ := lastEvent(events)
	require.Equal(t, "response.completed", typ)
	history := append([]any{userMessage("hello")}, wsOutputItems(events)...)
	h.limitOwner() // a1's prewarms still pass: the sim's faults skip them

	// The next turn, on a new connection, as a resumed Codex sends it.
	c := h.dialWS(sessionS, rootT)
	prewarm := responseRequest("")
	prewarm["input"], prewarm["generate"] = history, false
	events = c.turn(prewarm)
	typ, pre := lastEvent(events)
	require.Equal(t, "response.completed", typ)
	ts := ""
	for _, ev := range events {
		if hs, ok := ev["headers"].(map[string]any); ok && ev["type"] == "response.metadata" {
			ts, _ = hs["x-codex-turn-state"].(string)
		}
	}
	require.NotEmpty(t, ts, "the prewarm's answer gives the turn its state")
	meta := map[string]any{"x-codex-turn-state": ts}

	events = c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": pre, "input": []any{compactionTrigger()}, "client_metadata": meta})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	out := wsOutputItems(events)
	require.Len(t, out, 1)
	events = c.turn(map[string]any{"model": "gpt-5.5-codex", "input": []any{userMessage("hello"), out[0], userMessage("after the compaction")}, "client_metadata": meta})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "the turn followed its compaction: %v", events[len(events)-1])

	a2 := h.recordsOn(rootT, "a2")
	require.Len(t, a2, 2, "the compaction and the turn after it")
	assert.Equal(t, "compaction_trigger", a2[0].InputTypes[len(a2[0].InputTypes)-1])
	assert.Equal(t, []string{"message", "compaction", "message"}, a2[1].InputTypes)
	for _, r := range a2 {
		assert.NotEqual(t, ts, r.ClientTurnState, "a1's turn state is not sent to a2")
	}
	assert.Empty(t, h.recordsOn(rootT, "b1"))
}

// A thread an exhausted pool put on the fallback group compacts there, on
// its own account, even once the pool has room again: no account of the
// pool can read what the fallback issued.
func TestCompactionStaysWithAThreadOnTheFallback(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("f1", "org-f"))
	ctx := context.Background()
	tags := []string{relay.FallbackTag}
	_, err := h.store.UpdateAccount(ctx, h.ids["f1"], store.AccountPatch{Tags: &tags})
	require.NoError(t, err)
	h.pause("a2")
	_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1", Times: 1})
	require.NoError(t, err)
	conv := &conversation{h: h, thread: rootT}
	resp, body := conv.turn("hello")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, relay.RecoveryFallback, resp.Header.Get(relay.RecoveryHeader))
	require.Equal(t, "f1", h.threadAccount(rootT))

	_, err = h.store.SetAccountStatus(ctx, h.ids["a2"], store.StatusActive, "", time.Time{})
	require.NoError(t, err)
	compact := responseRequest("")
	compact["input"] = append(append([]any{}, conv.history...), compactionTrigger())
	resp, body = h.post(sessionS, rootT, compact, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords(rootT)
	last := recs[len(recs)-1]
	assert.Equal(t, "f1", last.Account, "the thread's own account compacted it")
	assert.Equal(t, sim.OutcomeCompleted, last.Outcome)
	assert.Empty(t, h.recordsOn(rootT, "a2"))
}

// The legacy route, POST .../responses/compact: it goes to the thread's
// account, is recorded as a compaction, and its answer (the compacted
// transcript) becomes the thread's history, so a request chained on it is
// rebuilt from the transcript (here for the organisation's other account,
// once the owner is limited). Refused with the reset time when the
// organisation cannot serve it.
func TestLegacyCompactRoute(t *testing.T) {
	t.Parallel()
	h := compactionPool(t)
	conv := &conversation{h: h, thread: rootT}
	resp, body := conv.turn("hello")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	compact := func() (int, string) {
		req := responseRequest("")
		req["input"] = conv.history
		b, err := json.Marshal(req)
		require.NoError(t, err)
		hdr := http.Header{"Content-Type": {"application/json"}, "Session-Id": {sessionS}, "Thread-Id": {rootT}}
		code, _, body := h.raw(http.MethodPost, "/backend-api/codex/responses/compact", hdr, b)
		return code, body
	}
	code, body := compact()
	require.Equal(t, http.StatusOK, code, body)
	var doc struct {
		ID     string `json:"id"`
		Output []any  `json:"output"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.NotEmpty(t, doc.ID)
	require.Equal(t, "compaction", itemType(doc.Output[len(doc.Output)-1]))
	var compactRecs []sim.Record
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Route == sim.RouteCompact {
			compactRecs = append(compactRecs, r)
		}
	}
	require.Len(t, compactRecs, 1)
	assert.Equal(t, "a1", compactRecs[0].Account, "the compaction went to the thread's account")
	atts := h.compactionAttempts(rootT, 1)
	require.Len(t, atts, 1)
	assert.Contains(t, atts[0].Detail, "compaction (legacy_route)")

	// A client chained on the compaction, after the owner hit its limit.
	h.limitOwner()
	c := h.dialWS(sessionS, rootT)
	events := c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": doc.ID, "input": []any{userMessage("after the compaction")}})
	typ, _ := lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	a2 := h.recordsOn(rootT, "a2")
	require.Len(t, a2, 1)
	assert.Equal(t, []string{"message", "compaction", "message"}, a2[0].InputTypes, "the transcript, then the new message")
	assert.Empty(t, h.recordsOn(rootT, "b1"))

	h.pause("a2")
	code, body = compact()
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	requireUsageLimit(t, code, e.Error)
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Route == sim.RouteCompact {
			assert.Contains(t, []string{"a1"}, r.Account, "no other organisation, no fallback")
		}
	}
}

// The real Codex CLI compacts through the relay, over HTTP and over
// WebSocket. Named "OpenAI", Codex compacts remotely (a request whose input
// ends in compaction_trigger, answered with one compaction item) once its
// history passes the auto-compaction limit, here before every turn of a
// resumed thread. The compaction goes to the thread's account and is
// recorded as one; the turn after it carries the compaction item and
// succeeds; and when the owner hits its usage limit, the next compaction
// and turn move to the organisation's other account (never to org-b, which
// has the most room), which reads what a1 issued.
func TestCodexCompactsThroughTheRelay(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("b1", "org-b"))
			h.setUsed("a2", 50)
			h.setUsed("b1", 60)
			ctx := context.Background()
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused",
				Name: "OpenAI", ModelContextWindow: 16000, AutoCompactTokenLimit: 4000})
			run := func(res *codexcli.Result, err error) *codexcli.Result {
				t.Helper()
				require.NoError(t, err)
				codexcli.RequireSuccess(t, res)
				if ws {
					codexcli.RequireWebSocket(t, res)
				}
				return res
			}
			first := run(codex.Exec(ctx, "remember the word teal", codexcli.RunOptions{}))
			thread := first.ThreadID
			require.Equal(t, "a1", h.threadAccount(thread))

			second := run(codex.Resume(ctx, thread, "what was the word?", codexcli.RunOptions{}))
			assert.Contains(t, second.FinalMessage, "what was the word?", "the turn after the compaction was answered")
			recs := h.responseRecords(thread)
			compactionThenTurn(t, recs, "a1")

			h.limitOwner()
			third := run(codex.Resume(ctx, thread, "and now?", codexcli.RunOptions{}))
			assert.Contains(t, third.FinalMessage, "and now?")
			after := h.responseRecords(thread)[len(recs):]
			compactionThenTurn(t, after, "a2")
			compactions := 0
			for _, r := range h.responseRecords(thread) {
				assert.NotEqual(t, "b1", r.Account, "another organisation cannot read the thread")
				assert.NotEqual(t, "invalid_encrypted_content", r.ErrorCode)
				if r.RequestKind == "compaction" {
					compactions++
				}
			}
			assert.Len(t, h.compactionAttempts(thread, compactions), compactions,
				"every compaction attempt is recorded as one, a1's refused one too")
		})
	}
}

// A provider not named "OpenAI" makes Codex summarise by itself: an
// ordinary request (its last input item the summarisation prompt, no
// trigger) whose turn metadata says request_kind "compaction". The relay
// recognises it by that, keeps it with the thread's account, and the turn
// after it succeeds.
func TestCodexLocalCompactionIsRecognised(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("b1", "org-b"))
	h.setUsed("b1", 60)
	ctx := context.Background()
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), Key: "unused", ModelContextWindow: 16000, AutoCompactTokenLimit: 4000})
	first, err := codex.Exec(ctx, "remember the word teal", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, first)
	second, err := codex.Resume(ctx, first.ThreadID, "what was the word?", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, second)
	assert.Contains(t, second.FinalMessage, "what was the word?")
	var compactions []sim.Record
	for _, r := range h.responseRecords(first.ThreadID) {
		assert.Equal(t, "a1", r.Account)
		if r.RequestKind == "compaction" {
			compactions = append(compactions, r)
		}
	}
	require.Len(t, compactions, 1, "Codex compacted")
	assert.NotContains(t, compactions[0].InputTypes, "compaction_trigger", "by itself")
	atts := h.compactionAttempts(first.ThreadID, 1)
	assert.Contains(t, atts[0].Detail, "compaction (request_kind)")
}

// compactionThenTurn checks that recs hold a compaction request that
// completed on account (its input ending in the trigger), and after it a
// turn carrying the compaction item that completed there too.
func compactionThenTurn(t *testing.T, recs []sim.Record, account string) {
	t.Helper()
	at := -1
	for i, r := range recs {
		if r.RequestKind == "compaction" && r.Outcome == sim.OutcomeCompleted {
			at = i
			assert.Equal(t, account, r.Account, "the compaction")
			assert.Equal(t, "compaction_trigger", r.InputTypes[len(r.InputTypes)-1])
			break
		}
	}
	require.GreaterOrEqual(t, at, 0, "Codex compacted remotely through the relay: %+v", recs)
	for _, r := range recs[at+1:] {
		if r.RequestKind == "turn" && r.Outcome == sim.OutcomeCompleted {
			assert.Equal(t, account, r.Account, "the turn after the compaction")
			assert.Contains(t, r.InputTypes, "compaction", "the turn carries the compaction item")
			assert.NotContains(t, r.InputTypes, "compaction_trigger")
			return
		}
	}
	t.Fatalf("no completed turn after the compaction in %+v", recs)
}
