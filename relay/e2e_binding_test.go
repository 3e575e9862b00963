package relay_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

const (
	sessionS = "019a1111-0000-7000-8000-000000000001"
	rootT    = "019a1111-0000-7000-8000-0000000000aa"
	childT   = "019a1111-0000-7000-8000-0000000000bb"
)

// Two threads of one session start on the same account; after one of them
// is moved, the other stays, and the process preference is not rewritten.
func TestSiblingsShareThenDiverge(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("a3", "org-a"))
	ctx := context.Background()

	resp, body := h.post(sessionS, rootT, responseRequest("root turn"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	root := h.responseRecords(rootT)
	require.Len(t, root, 1)
	first := root[0].Account

	// Make the balancer prefer another account: the child must still start
	// on the session's account, to share its prompt cache.
	require.NoError(t, h.store.UpdateUsage(ctx, h.ids[first], store.Window{UsedPercent: 95, Known: true, ResetAt: time.Now().Add(time.Hour)}, store.Window{}))
	resp, body = h.post(sessionS, childT, responseRequest("child turn"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	child := h.responseRecords(childT)
	require.Len(t, child, 1)
	assert.Equal(t, first, child[0].Account, "a sibling starts on the process session's account")

	// The root's next request fails on its account once (a 500 before any
	// output) and moves; only the root's row follows.
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultServerError, Account: first, Times: 1})
	require.NoError(t, err)
	resp, body = h.post(sessionS, rootT, responseRequest("root again"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "failover", resp.Header.Get("X-Codex-Relay-Recovery"))
	root = h.responseRecords(rootT)
	require.Len(t, root, 3)
	moved := root[2].Account
	require.NotEqual(t, first, moved, "the root moved")

	resp, body = h.post(sessionS, childT, responseRequest("child again"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	child = h.responseRecords(childT)
	require.Len(t, child, 2)
	assert.Equal(t, first, child[1].Account, "the sibling stayed")
	resp, body = h.post(sessionS, rootT, responseRequest("root third"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	root = h.responseRecords(rootT)
	assert.Equal(t, moved, root[len(root)-1].Account, "the moved root stays on its new account")

	rows, _, err := h.store.Bindings(ctx, store.BindingFilter{SessionID: sessionS})
	require.NoError(t, err)
	byThread := map[string]string{}
	sessionRows := 0
	for _, b := range rows {
		if b.Kind == store.BindSession {
			sessionRows++
			assert.Equal(t, h.ids[first], b.AccountID, "the process preference was not rewritten")
		} else {
			byThread[b.ThreadID] = b.AccountID
		}
	}
	assert.Equal(t, 1, sessionRows)
	assert.Equal(t, h.ids[moved], byThread[rootT])
	assert.Equal(t, h.ids[first], byThread[childT])
}

// What the client presents conflicts with 409 before anything goes
// upstream; an operator's pin moves the thread instead.
func TestConflictingHardOwnersFailBeforeUpstream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()

	// A response produced on one account, over HTTP (not rebuildable by a
	// thread that never saw it)...
	resp, body := h.post(sessionS, rootT, responseRequest("hello"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	producer := h.responseRecords(rootT)[0].Account
	prevID := completedID(t, body)
	other := "a1"
	if producer == "a1" {
		other = "a2"
	}
	// ...and an operator's pin of another session to the other account: the
	// pin wins, the thread moves; the pinned account cannot resolve the id,
	// so the client is told to resend the full request, which it serves.
	_, err := h.store.Pin(ctx, store.BindRawSession, "pinned-session", h.ids[other], "pin")
	require.NoError(t, err)
	const movedThread = "019a1111-0000-7000-8000-0000000000cc"
	req := responseRequest("continue")
	req["previous_response_id"] = prevID
	resp, body = h.post("pinned-session", movedThread, req, nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	assert.Contains(t, body, "previous_response_not_found")
	assert.Empty(t, h.responseRecords(movedThread), "no response was requested upstream")
	resp, body = h.post("pinned-session", movedThread, responseRequest("continue, in full"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords(movedThread)
	require.Len(t, recs, 1)
	assert.Equal(t, other, recs[0].Account, "the pinned account serves the thread")

	// A turn state issued by one account and a pin to the other conflict too.
	resp, body = h.post("", "019a1111-0000-7000-8000-0000000000dd", responseRequest("x"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	ts := resp.Header.Get("x-codex-turn-state")
	require.NotEmpty(t, ts, "the relay returns a turn state")
	tsOwner := h.responseRecords("019a1111-0000-7000-8000-0000000000dd")[0].Account
	pinTo := "a1"
	if tsOwner == "a1" {
		pinTo = "a2"
	}
	_, err = h.store.Pin(ctx, store.BindRawThread, "019a1111-0000-7000-8000-0000000000dd", h.ids[pinTo], "pin")
	require.NoError(t, err)
	before := len(h.sim.Records(sim.RecordFilter{}))
	resp, body = h.post("", "019a1111-0000-7000-8000-0000000000dd", responseRequest("y"), http.Header{"X-Codex-Turn-State": {ts}})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, body)
	assert.Contains(t, body, "continuity_owner_conflict")
	assert.Contains(t, body, "turn state", "the message names the evidence that conflicts")
	assert.NotContains(t, body, h.ids["a1"], "no account id reaches the client")
	assert.NotContains(t, body, h.ids["a2"])
	assert.Equal(t, before, len(h.sim.Records(sim.RecordFilter{})), "nothing went upstream")

	atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{Class: "conflict"})
	require.NoError(t, err)
	require.Len(t, atts, 1, "the conflict is a diagnostic")
	assert.Contains(t, atts[0].Detail, "turn_state", "the operator sees which evidence conflicts")
	assert.Contains(t, atts[0].Detail, "raw_thread")
}

// Over WebSocket, previous_response_id chains on the lane; when the lane's
// account becomes unavailable, the next request is rebuilt in full from
// continuity on another account, and the client connection survives.
func TestWebSocketChainsAndRebuildsOnAnotherAccount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	c := h.dialWS(sessionS, rootT)

	prewarm := responseRequest("warm up")
	prewarm["generate"] = false
	typ, warmID := lastEvent(c.turn(prewarm))
	require.Equal(t, "response.completed", typ)
	require.NotEmpty(t, warmID)

	next := map[string]any{"model": "gpt-5.5-codex", "previous_response_id": warmID, "input": []any{userMessage("first real turn")}}
	events := c.turn(next)
	typ, id1 := lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events)
	sawTurnState := false
	for _, ev := range events {
		if ev["type"] == "response.metadata" {
			sawTurnState = true
		}
	}
	assert.True(t, sawTurnState, "a turn state reaches the client as response.metadata")

	recs := h.responseRecords(rootT)
	require.Len(t, recs, 2)
	assert.Equal(t, warmID, recs[1].PreviousResponseID, "chained on the lane: only the new item went upstream")
	assert.Equal(t, 1, recs[1].InputCount)
	owner := recs[1].Account

	// The lane's account becomes unavailable between turns.
	_, err := h.store.SetAccountStatus(ctx, h.ids[owner], store.StatusPaused, "test", time.Time{})
	require.NoError(t, err)
	events = c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id1, "input": []any{userMessage("second turn")}})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events)
	recs = h.responseRecords(rootT)
	require.Len(t, recs, 3)
	last := recs[2]
	assert.NotEqual(t, owner, last.Account, "moved to another account")
	assert.Empty(t, last.PreviousResponseID, "the other account got a full request")
	assert.Equal(t, 5, last.InputCount, "full history: the prewarm's message, the first turn, its answer (reasoning + message), the new message")

	// A request whose previous response nobody holds asks Codex to resend.
	events = c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": "resp_unknown", "input": []any{userMessage("?")}})
	assert.Equal(t, "error", events[len(events)-1]["type"])
	assert.EqualValues(t, 400, events[len(events)-1]["status"])
	errObj := events[len(events)-1]["error"].(map[string]any)
	assert.Equal(t, "previous_response_not_found", errObj["code"])

	// The connection still serves.
	typ, _ = lastEvent(c.turn(responseRequest("full request after the error")))
	assert.Equal(t, "response.completed", typ)
}

// The upstream retiring a connection (websocket_connection_limit_reached)
// costs the client nothing: the relay opens a fresh lane and sends the full
// request, rebuilt from continuity, and the client's connection stays.
func TestWebSocketConnectionLimitIsInvisible(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(time.Second), Times: 1})
	require.NoError(t, err)
	c := h.dialWS(sessionS, rootT)
	typ, id1 := lastEvent(c.turn(responseRequest("one")))
	require.Equal(t, "response.completed", typ)

	// Let the lane pass its maximum age: the sim then sends the limit error
	// and closes it (idle), or answers the next message with it.
	time.Sleep(1500 * time.Millisecond)

	events := c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id1, "input": []any{userMessage("two")}})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events)
	recs := h.responseRecords(rootT)
	last := recs[len(recs)-1]
	assert.Empty(t, last.PreviousResponseID, "the fresh lane got the full request")
	assert.Equal(t, 4, last.InputCount)
	handshakes := 0
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Kind == sim.RecordHandshake {
			handshakes++
		}
	}
	assert.Equal(t, 2, handshakes, "one lane replaced by one")
}

// An upstream that keeps no chains refuses Codex's own chained request; the
// relay holds the history, so the same account gets the full request and
// the session stops chaining. The client never sees the refusal.
func TestWebSocketChainsOnAStatelessUpstream(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a")}, Stateless: true}, func(*harness, *relay.Config) {})
	c := h.dialWS(sessionS, rootT)
	typ, id := lastEvent(c.turn(responseRequest("one")))
	require.Equal(t, "response.completed", typ)
	for _, text := range []string{"two", "three"} {
		events := c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id, "input": []any{userMessage(text)}})
		typ, id = lastEvent(events)
		require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	}
	var refused int
	for _, r := range h.responseRecords(rootT) {
		if r.ErrorCode == "previous_response_not_found" {
			refused++
		}
	}
	assert.Equal(t, 1, refused, "one refusal, then full requests only")
}

// The relay deletes request records past their retention on its own, at
// start and then every minute; newer ones stay.
func TestRequestRecordsPastTheirRetentionGo(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	now := time.Now()
	for id, at := range map[string]time.Time{"req_old": now.Add(-40 * 24 * time.Hour), "req_new": now.Add(-time.Hour)} {
		require.NoError(t, st.RecordRequest(ctx, store.RequestRecord{ID: id, ThreadID: "t", Transport: "http", Path: "/v1/responses", Status: 200, StartedAt: at},
			[]store.Attempt{{RequestID: id, Seq: 1, ThreadID: "t", Class: "ok", StartedAt: at, EndedAt: at}}))
	}
	rl := relay.New(relay.Config{Store: st, Logger: testLogger(t)}) // the default retention: 30 days
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rl.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done; rl.Close() })
	require.Eventually(t, func() bool {
		rows, total, err := st.Requests(ctx, store.RequestFilter{})
		return err == nil && total == 1 && rows[0].ID == "req_new"
	}, time.Minute, 20*time.Millisecond, "the 40-day-old request went, the new one stayed")
	// The attempts go in the next statement: wait for it too.
	var atts []store.Attempt
	require.Eventually(t, func() bool {
		var err error
		atts, _, err = st.Attempts(ctx, store.AttemptFilter{})
		return err == nil && len(atts) == 1
	}, time.Minute, 20*time.Millisecond, "the 40-day-old attempt went, the new one stayed")
	assert.Equal(t, "req_new", atts[0].RequestID)
}

// The relay's housekeeping deletes console sessions past their absolute
// end, signed out or not, on its own; those still within it stay (a
// signed-out one is refused by its row until then).
func TestEndedConsoleSessionsGo(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	now := time.Now()
	for id, cs := range map[string]store.ConsoleSession{
		"ended":           {Expires: now.Add(-time.Minute)},
		"signed out, old": {Expires: now.Add(-time.Second), Revoked: now.Add(-time.Hour)},
		"standing":        {Expires: now.Add(time.Hour)},
		"signed out":      {Expires: now.Add(time.Hour), Revoked: now},
	} {
		cs.ID, cs.Created, cs.Seen = id, now.Add(-2*time.Hour), now.Add(-2*time.Hour)
		require.NoError(t, st.CreateConsoleSession(ctx, cs))
		if !cs.Revoked.IsZero() {
			require.NoError(t, st.RevokeConsoleSession(ctx, id, cs.Revoked))
		}
	}
	rl := relay.New(relay.Config{Store: st, Logger: testLogger(t)})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rl.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done; rl.Close() })
	require.Eventually(t, func() bool {
		_, err1 := st.ConsoleSession(ctx, "ended")
		_, err2 := st.ConsoleSession(ctx, "signed out, old")
		return errors.Is(err1, store.ErrNotFound) && errors.Is(err2, store.ErrNotFound)
	}, time.Minute, 20*time.Millisecond, "the ended sessions went")
	for _, id := range []string{"standing", "signed out"} {
		_, err := st.ConsoleSession(ctx, id)
		assert.NoError(t, err, "%s stays", id)
	}
}
