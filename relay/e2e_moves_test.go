package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// An operator's decision takes effect at the thread's next request, on
// both transports, while the thread's lane on the old account is live: a
// lane is the relay's own means, never evidence against a pin. The next
// request goes to the new account with the thread's whole history (rebuilt
// from continuity over WebSocket, the client's own over HTTP), the old
// lane is retired, and nothing but the new account's answer reaches the
// client: no 409.
func TestOperatorDecisionsMoveAThreadAtItsNextRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	decisions := []struct {
		name string
		move func(h *harness, thread string)
		// forgets: the decision drops the thread's continuity too (a reset),
		// so a WebSocket client is asked to resend its request in full.
		forgets bool
	}{
		{"session pinned", func(h *harness, _ string) {
			_, err := h.store.Pin(ctx, store.BindRawSession, sessionS, h.ids["a2"], "pin")
			require.NoError(t, err)
		}, false},
		{"thread pinned", func(h *harness, thread string) {
			_, err := h.store.Pin(ctx, store.BindRawThread, thread, h.ids["a2"], "pin")
			require.NoError(t, err)
		}, false},
		{"account paused", func(h *harness, _ string) { h.pause("a1") }, false},
		{"account removed", func(h *harness, _ string) { require.NoError(t, h.store.DeleteAccount(ctx, h.ids["a1"])) }, false},
		{"session reset while its account fills up", func(h *harness, _ string) {
			h.setUsed("a1", 99)
			reset, err := h.store.ResetBindings(ctx, store.BindingReset{SessionID: sessionS})
			require.NoError(t, err)
			h.relay.Forget(reset)
		}, true},
	}
	for _, d := range decisions {
		for _, transport := range []string{"http", "ws"} {
			t.Run(d.name+" over "+transport, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
				h.setUsed("a2", 50) // the thread starts on a1
				thread := "019a5555-0000-7000-8000-00000000000" + map[string]string{"http": "1", "ws": "2"}[transport]
				var c *wsClient
				first := responseRequest("first turn")
				if transport == "http" {
					resp, body := h.post(sessionS, thread, first, nil)
					require.Equal(t, http.StatusOK, resp.StatusCode, body)
				} else {
					c = h.dialWS(sessionS, thread)
					typ, id := lastEvent(c.turn(first))
					require.Equal(t, "response.completed", typ)
					first = map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id}
				}
				require.Equal(t, "a1", h.responseRecords(thread)[0].Account)
				require.Len(t, h.laneAccounts(), 1, "the thread's lane is live on a1")

				d.move(h, thread)

				next := responseRequest("second turn")
				if transport == "http" {
					next["input"] = []any{userMessage("first turn"), userMessage("second turn")} // an HTTP client sends it all
					resp, body := h.post(sessionS, thread, next, nil)
					require.Equal(t, http.StatusOK, resp.StatusCode, "no 409: %s", body)
					assert.NotContains(t, body, "continuity_owner_conflict")
				} else {
					chained := first
					chained["input"] = []any{userMessage("second turn")}
					events := c.turn(chained)
					typ, _ := lastEvent(events)
					if d.forgets {
						// The reset dropped the history behind the chain:
						// Codex is asked to resend in full, and does.
						require.Equal(t, "error", typ)
						require.Equal(t, "previous_response_not_found", events[len(events)-1]["error"].(map[string]any)["code"])
						next["input"] = []any{userMessage("first turn"), userMessage("second turn")}
						typ, _ = lastEvent(c.turn(next))
					}
					require.Equal(t, "response.completed", typ, "no 409")
				}
				recs := h.responseRecords(thread)
				last := recs[len(recs)-1]
				assert.Equal(t, "a2", last.Account, "the new account serves the next request")
				assert.Empty(t, last.PreviousResponseID, "the new account gets the whole request")
				assert.GreaterOrEqual(t, last.InputCount, 2, "with the thread's history")
				assert.Equal(t, []string{h.ids["a2"]}, h.laneAccounts(), "the old lane retired, one lane on a2")
			})
		}
	}
}

// laneAccounts lists the accounts of the live lanes.
func (h *harness) laneAccounts() []string {
	var out []string
	for _, l := range h.relay.Lanes() {
		out = append(out, l.AccountID)
	}
	return out
}

// The real Codex CLI: a thread placed on one account, pinned by an
// operator to another while its bridge lane still lives (HTTP), or after
// its WebSocket ended; the resumed turn is served by the pinned account,
// with no 409, and Codex exits 0.
func TestCodexResumeFollowsAPin(t *testing.T) {
	t.Parallel()
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			h.setUsed("a2", 50)
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused"})
			ctx := context.Background()
			first, err := codex.Exec(ctx, `remember teal [[sim:tool exec_command {"cmd":"echo before-pin"}]]`, codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			require.Equal(t, 0, first.ExitCode, first.Stderr)
			for _, r := range h.responseRecords(first.ThreadID) {
				require.Equal(t, "a1", r.Account)
			}
			session := h.responseRecords(first.ThreadID)[0].SessionID
			require.NotEmpty(t, session)
			_, err = h.store.Pin(ctx, store.BindRawSession, session, h.ids["a2"], "pin")
			require.NoError(t, err)

			second, err := codex.Resume(ctx, first.ThreadID, "and now?", codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			require.Equal(t, 0, second.ExitCode, "no 409: %s", second.Stderr)
			recs := h.responseRecords(first.ThreadID)
			last := recs[len(recs)-1]
			assert.Equal(t, "a2", last.Account, "the pinned account serves the resumed turn")
			assert.GreaterOrEqual(t, last.InputCount, 3, "with the thread's history")
			atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{Class: "conflict"})
			require.NoError(t, err)
			assert.Empty(t, atts, "no conflict was recorded")
		})
	}
}

// Across replicas on one PostgreSQL: a pin made through one replica moves a
// thread whose lane lives on the other, at its next request, on both
// transports.
func TestPinMovesAThreadWhoseLaneLivesOnAnotherReplica(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t, "a1", "a2")
	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	ids := map[string]string{}
	accounts, err := setup.Accounts(context.Background())
	require.NoError(t, err)
	for _, acc := range accounts {
		ids[acc.Label] = acc.ID
	}
	require.NoError(t, setup.UpdateUsage(context.Background(), ids["a2"], store.Window{UsedPercent: 50, WindowMinutes: 300, ResetAt: time.Now().Add(time.Hour), Known: true}, store.Window{}))
	onB := &harness{t: t, sim: upstream, store: setup, relay: b.relay, srv: b.srv, ids: ids}
	onA := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv, ids: ids}

	// Over HTTP: the lane lives on b; the next request reaches a, which
	// forwards it to b, where the pin moves it.
	resp, body := onB.post(sessionS, rootT, responseRequest("on b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	c := onB.dialWS("019a6666-0000-7000-8000-000000000001", childT)
	typ, id := lastEvent(c.turn(responseRequest("ws on b")))
	require.Equal(t, "response.completed", typ)
	for _, r := range upstream.Records(sim.RecordFilter{}) {
		if r.Kind != sim.RecordHandshake && r.Route == sim.RouteResponses {
			require.Equal(t, "a1", r.Account)
		}
	}
	require.Len(t, onB.laneAccounts(), 2)

	_, err = setup.Pin(context.Background(), store.BindRawSession, sessionS, ids["a2"], "pin")
	require.NoError(t, err)
	_, err = setup.Pin(context.Background(), store.BindRawThread, childT, ids["a2"], "pin")
	require.NoError(t, err)

	next := responseRequest("on a now")
	next["input"] = []any{userMessage("on b"), userMessage("on a now")}
	resp, body = onA.post(sessionS, rootT, next, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "no 409: %s", body)
	typ, _ = lastEvent(c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": id, "input": []any{userMessage("again")}}))
	require.Equal(t, "response.completed", typ, "no 409")
	for _, thread := range []string{rootT, childT} {
		recs := onB.responseRecords(thread)
		assert.Equal(t, "a2", recs[len(recs)-1].Account, "thread %s moved to the pinned account", thread)
	}
	// b hears of the pins from the database's announcements, and retires
	// its lanes on a1 as it does: a moment after the turns above.
	assert.Eventually(t, func() bool {
		got := onB.laneAccounts()
		return len(got) == 2 && got[0] == ids["a2"] && got[1] == ids["a2"]
	}, time.Minute, 20*time.Millisecond, "b's lanes on a1 retired: %+v (a1 %s, a2 %s)", b.relay.Lanes(), ids["a1"], ids["a2"])
}

// A change of a key's account scope moves the key's threads off accounts
// it no longer holds, at their next request, on both transports: an open
// WebSocket's next turn is served under the new scope.
func TestKeyScopeChangeMovesAThreadAtItsNextRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			h.setUsed("a2", 50)
			k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "team", ScopeAccounts: []string{h.ids["a1"], h.ids["a2"]}})
			require.NoError(t, err)
			auth := http.Header{"Authorization": {"Bearer " + secret}}
			thread := "019a7777-0000-7000-8000-00000000000" + map[string]string{"http": "1", "ws": "2"}[transport]
			var c *wsClient
			var prevID string
			if transport == "http" {
				resp, body := h.post(sessionS, thread, responseRequest("first"), auth)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
			} else {
				c = h.dialWSWith(sessionS, thread, auth)
				var typ string
				typ, prevID = lastEvent(c.turn(responseRequest("first")))
				require.Equal(t, "response.completed", typ)
			}
			require.Equal(t, "a1", h.responseRecords(thread)[0].Account)

			k.ScopeAccounts = []string{h.ids["a2"]}
			_, err = h.store.UpdateClientKey(ctx, k)
			require.NoError(t, err)

			if transport == "http" {
				next := responseRequest("second")
				next["input"] = []any{userMessage("first"), userMessage("second")}
				resp, body := h.post(sessionS, thread, next, auth)
				require.Equal(t, http.StatusOK, resp.StatusCode, "no 409: %s", body)
			} else {
				typ, _ := lastEvent(c.turn(map[string]any{"model": "gpt-5.5-codex", "previous_response_id": prevID, "input": []any{userMessage("second")}}))
				require.Equal(t, "response.completed", typ)
			}
			recs := h.responseRecords(thread)
			last := recs[len(recs)-1]
			assert.Equal(t, "a2", last.Account, "the key's new scope holds at once")
			assert.GreaterOrEqual(t, last.InputCount, 2, "with the thread's history")
			assert.Equal(t, []string{h.ids["a2"]}, h.laneAccounts(), "the lane outside the scope retired")
		})
	}
}

// New threads arriving at the same instant spread over equal accounts:
// each selection sees the ones made before it (counted from the moment an
// account is selected), instead of all reading the same idle loads and
// landing on one account, where they would queue for its lanes.
func TestABurstOfNewThreadsSpreads(t *testing.T) {
	const accounts, threads = 4, 40
	for _, ws := range []bool{true, false} {
		t.Run(map[bool]string{true: "websocket", false: "http"}[ws], func(t *testing.T) {
			t.Parallel()
			var accts []sim.Account
			for i := range accounts {
				accts = append(accts, simAccount(fmt.Sprintf("a%d", i+1), "org-a"))
			}
			h := newHarness(t, accts...)
			session := func(i int) string { return fmt.Sprintf("019b0000-0000-7000-8000-%012d", i) }
			body := responseRequest("hello [[sim:delay 1500ms]]")
			turns := make([]func(), threads)
			for i := range threads {
				if ws {
					c := h.dialWS(session(i), "") // connected first: only the first turns start at once
					msg, err := json.Marshal(map[string]any{"type": "response.create", "model": body["model"], "input": body["input"]})
					require.NoError(t, err)
					turns[i] = func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if !assert.NoError(t, c.conn.Write(ctx, websocket.MessageText, msg)) {
							return
						}
						for {
							_, data, err := c.conn.Read(ctx)
							if !assert.NoError(t, err) {
								return
							}
							if typ, _ := wire.EventType(data); wire.IsTerminal(typ) {
								assert.Equal(t, wire.EventResponseCompleted, typ, string(data))
								return
							}
						}
					}
				} else {
					turns[i] = func() {
						resp, sse := h.post(session(i), "", body, nil)
						assert.Equal(t, http.StatusOK, resp.StatusCode, sse)
					}
				}
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			for _, turn := range turns {
				wg.Go(func() { <-start; turn() })
			}
			close(start)
			wg.Wait()
			per := map[string]int{}
			for _, r := range h.responseRecords("") {
				per[r.Account]++
			}
			t.Logf("new threads per account: %v", per)
			require.Len(t, per, accounts, "every account took some")
			for a, n := range per {
				assert.Equal(t, threads/accounts, n, "account %s: each selection saw the others", a)
			}
		})
	}
}
