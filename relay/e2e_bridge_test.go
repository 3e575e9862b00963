package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// bridgeTurns runs a conversation of the real Codex CLI over HTTP: a turn
// with a tool call, then a resumed turn; between them, disturb does
// something to the lane. It returns the sim's records of the thread.
func bridgeTurns(t *testing.T, h *harness, disturb func(owner string)) []sim.Record {
	t.Helper()
	ctx := context.Background()
	one := 1
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused", RequestMaxRetries: &one, StreamMaxRetries: &one})
	first, err := codex.Exec(ctx, `list it [[sim:tool exec_command {"cmd":"echo bridge-tool-ok"}]]`, codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, first.Stderr)
	assert.Contains(t, first.FinalMessage, "bridge-tool-ok")
	recs := h.responseRecords(first.ThreadID)
	require.GreaterOrEqual(t, len(recs), 2, "the tool call and its follow-up")
	if disturb != nil {
		disturb(recs[0].Account)
	}
	second, err := codex.Resume(ctx, first.ThreadID, "and now?", codexcli.RunOptions{BypassSandbox: true}) // same tools: same shape
	require.NoError(t, err)
	require.Equal(t, 0, second.ExitCode, second.Stderr)
	return h.responseRecords(first.ThreadID)
}

// The real Codex CLI over HTTP through the bridge: after the first request,
// only new items go upstream, chained on the thread's lane.
func TestBridgeSendsOnlyNewItems(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	recs := bridgeTurns(t, h, nil)
	require.GreaterOrEqual(t, len(recs), 3)
	assert.Empty(t, recs[0].PreviousResponseID, "the first request goes in full")
	for i, r := range recs {
		assert.Equal(t, sim.TransportWS, r.Transport, "HTTP clients get WebSocket upstreams")
		assert.Equal(t, recs[0].ConnID, r.ConnID, "one lane serves the whole thread")
		if i == 0 {
			continue
		}
		assert.Equal(t, recs[i-1].ResponseID, r.PreviousResponseID, "request %d chains on the lane", i)
		assert.Less(t, r.InputCount, recs[0].InputCount, "request %d carries only new items", i)
	}
	sawOutput := false
	for _, o := range recs[1].ToolOutputs {
		sawOutput = sawOutput || strings.Contains(o.Output, "bridge-tool-ok")
	}
	assert.True(t, sawOutput, "the delta carried the tool output")

	atts, _, err := h.store.Attempts(context.Background(), storeFilterThread(recs[0].ThreadID))
	require.NoError(t, err)
	details := ""
	for _, a := range atts {
		details += a.Detail + "\n"
	}
	assert.Contains(t, details, "lane: opened, full")
	assert.Contains(t, details, "lane: reused, delta", "each request's lane use is in its attempt record")
}

// A lane killed between turns, an upstream that retires the connection, and
// an upstream that stalls: each turn completes (or fails in time and Codex's
// retry completes), and the next turn works.
func TestBridgeSurvivesLaneFailures(t *testing.T) {
	t.Run("lane killed between turns", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, simAccount("a1", "org-a"))
		recs := bridgeTurns(t, h, func(owner string) {
			require.Equal(t, 1, h.relay.Bridge().CloseAccount(h.ids[owner]), "the idle lane was closed")
		})
		last := recs[len(recs)-1]
		assert.Empty(t, last.PreviousResponseID, "a fresh lane gets the full request")
		assert.NotEqual(t, recs[0].ConnID, last.ConnID)
	})
	t.Run("connection limit reached", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, simAccount("a1", "org-a"))
		_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(time.Second), Times: 1})
		require.NoError(t, err)
		recs := bridgeTurns(t, h, func(string) { time.Sleep(1500 * time.Millisecond) }) // past the lane's age
		last := recs[len(recs)-1]
		assert.Equal(t, "completed", last.Outcome)
		assert.NotEqual(t, recs[0].ConnID, last.ConnID, "a new lane took over")
	})
	t.Run("upstream stalls after the first event", func(t *testing.T) {
		t.Parallel()
		h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.StreamIdleTimeout = time.Second }, simAccount("a1", "org-a"))
		_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultStall, Events: 1, After: 2, Times: 1})
		require.NoError(t, err)
		start := time.Now()
		recs := bridgeTurns(t, h, nil)
		assert.Less(t, time.Since(start), time.Minute, "the stall was detected by the relay's deadline")
		stalled := 0
		for _, r := range recs {
			if r.Outcome == sim.OutcomeStalled || r.Fault == sim.FaultStall {
				stalled++
			}
		}
		assert.Equal(t, 1, stalled, "one request stalled")
		assert.Equal(t, "completed", recs[len(recs)-1].Outcome, "the turn completed after the stall")
	})
}

// Root and child threads of one session, interleaved, never share a lane
// or a continuity entry.
func TestBridgeSeparatesThreadsOfOneSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	history := map[string][]any{}
	turn := func(thread, text string) sim.Record {
		history[thread] = append(history[thread], userMessage(text))
		req := responseRequest("")
		req["input"] = history[thread]
		resp, body := h.post(sessionS, thread, req, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		recs := h.responseRecords(thread)
		last := recs[len(recs)-1]
		history[thread] = append(history[thread], map[string]any{"type": "message", "role": "assistant", "id": "echo-" + last.ResponseID,
			"content": []any{map[string]any{"type": "output_text", "text": "x"}}})
		return last
	}
	r1 := turn(rootT, "root one")
	c1 := turn(childT, "child one")
	r2 := turn(rootT, "root two")
	c2 := turn(childT, "child two")
	assert.NotEqual(t, r1.ConnID, c1.ConnID, "root and child have lanes of their own")
	assert.Equal(t, r1.ConnID, r2.ConnID)
	assert.Equal(t, c1.ConnID, c2.ConnID)
	assert.Equal(t, r1.PromptCacheKey, c1.PromptCacheKey, "precondition: they share the prompt_cache_key")
	assert.Empty(t, r2.PreviousResponseID, "the client's history differs from what the upstream produced: full request")
	for _, r := range []sim.Record{r1, c1, r2, c2} {
		assert.NotContains(t, r.InputTypes, "function_call_output")
	}
	assert.Equal(t, 3, r2.InputCount, "root's history only: its turn, its answer, its new turn")
	assert.Equal(t, 3, c2.InputCount, "child's history only")
}

// 200 conversations at once through the bridge; afterwards no lane,
// lane goroutine or continuity entry outlives its deadline.
func TestBridgeUnderLoadLeavesNothingBehind(t *testing.T) {
	conts := continuity.New(continuity.Options{IdleTTL: 300 * time.Millisecond})
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		c.Continuity = conts
		c.Bridge = bridge.PoolConfig{IdleTimeout: 300 * time.Millisecond, SweepEvery: 50 * time.Millisecond, MaxLanesPerAccount: 256}
	}, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { h.relay.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()

	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thread := fmt.Sprintf("019a2222-0000-7000-8000-%012d", i)
			input := []any{userMessage(fmt.Sprintf("conversation %d", i))}
			for turnNo := range 2 {
				req := responseRequest("")
				req["input"] = input
				resp, body := h.post(fmt.Sprintf("019a3333-0000-7000-8000-%012d", i), thread, req, nil)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, "response.completed") {
					errs <- fmt.Errorf("conversation %d turn %d: %d %s", i, turnNo, resp.StatusCode, body)
					return
				}
				input = append(input, userMessage("more"))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	recs := h.responseRecords("")
	require.Len(t, recs, 2*n)
	for _, r := range recs {
		require.Equal(t, sim.TransportWS, r.Transport, "precondition: every request went over a lane")
	}

	require.Eventually(t, func() bool { return h.relay.Bridge().Len() == 0 }, time.Minute, 50*time.Millisecond, "idle lanes closed after their deadline")
	require.Eventually(t, func() bool { return laneReaders() == 0 }, time.Minute, 50*time.Millisecond, "no lane goroutine remains")
	time.Sleep(400 * time.Millisecond)
	conts.Sweep()
	entries, bytes := conts.Len()
	assert.Zero(t, entries, "continuity entries expired")
	assert.Zero(t, bytes)
	assert.Empty(t, h.relay.Lanes())
}

// laneReaders counts live lane reader goroutines.
func laneReaders() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "bridge.(*Lane).read")
}

// A bridged thread whose account becomes unavailable moves: its lane is
// retired and the new account gets the full request.
func TestBridgeMovesOffAnUnavailableAccount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	input := []any{userMessage("one")}
	send := func() sim.Record {
		req := responseRequest("")
		req["input"] = input
		resp, body := h.post(sessionS, rootT, req, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		recs := h.responseRecords(rootT)
		input = append(input, map[string]any{"type": "message", "role": "assistant", "id": "m-" + recs[len(recs)-1].ResponseID,
			"content": []any{map[string]any{"type": "output_text", "text": "x"}}}, userMessage("next"))
		return recs[len(recs)-1]
	}
	first := send()
	_, err := h.store.SetAccountStatus(ctx, h.ids[first.Account], store.StatusRateLimited, "test", time.Now().Add(time.Hour))
	require.NoError(t, err)
	moved := send()
	assert.NotEqual(t, first.Account, moved.Account)
	assert.Empty(t, moved.PreviousResponseID, "the new account's lane got the full request")
	assert.Equal(t, 3, moved.InputCount, "one, its answer, next")
	assert.Len(t, h.relay.Lanes(), 1, "the old lane was retired")
}

// A previous_response_id finds the lane that produced it (an exact alias),
// even from a request of another thread key.
func TestBridgeResponseAliasFindsItsLane(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	resp, body := h.post(sessionS, rootT, responseRequest("root"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	rootRec := h.responseRecords(rootT)[0]

	req := map[string]any{"model": "gpt-5.5-codex", "stream": true, "previous_response_id": rootRec.ResponseID, "input": []any{userMessage("continue")}}
	resp, body = h.post(sessionS, childT, req, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	all := h.responseRecords("")
	require.Len(t, all, 2)
	rec := all[1]
	assert.Equal(t, rootRec.ConnID, rec.ConnID, "served on the lane that produced the response")
	assert.Equal(t, "completed", rec.Outcome)
	assert.Equal(t, rootRec.ResponseID, rec.PreviousResponseID)
}

// A request waiting for lane capacity hears SSE keep-alive comments, then
// is served when a lane frees up.
func TestBridgeKeepsWaitingClientsAlive(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		c.Bridge = bridge.PoolConfig{MaxLanesPerAccount: 1, KeepAliveEvery: 50 * time.Millisecond, WaitTimeout: 20 * time.Second}
	}, simAccount("a1", "org-a"))
	slow := make(chan string, 1)
	go func() {
		_, body := h.post(sessionS, rootT, responseRequest("slow [[sim:delay 800ms]]"), nil)
		slow <- body
	}()
	require.Eventually(t, func() bool { return h.relay.Bridge().Len() == 1 }, time.Minute, 10*time.Millisecond, "the slow request holds the only lane")
	resp, body := h.post(sessionS, childT, responseRequest("waiting"), nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, ": keep-alive", "comments kept the connection alive while waiting")
	assert.Contains(t, body, "response.completed", "then the request was served")
	assert.Contains(t, <-slow, "response.completed")
}

// An upstream without a WebSocket endpoint (404/405/426 on the upgrade)
// serves HTTP clients over plain HTTP: the bridge steps aside.
func TestBridgeStepsAsideForHTTPOnlyUpstreams(t *testing.T) {
	for _, status := range []int{404, 405, 426} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"))
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultRefuseWebSocket, Status: status})
			require.NoError(t, err)
			for i := range 2 {
				resp, body := h.post(sessionS, rootT, responseRequest(fmt.Sprintf("turn %d", i)), nil)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
			}
			recs := h.responseRecords(rootT)
			require.Len(t, recs, 2)
			for _, r := range recs {
				assert.Equal(t, sim.TransportHTTP, r.Transport)
			}
		})
	}
}

// An upstream that keeps no chains on its connections refuses the bridge's
// delta; the same account then gets the full request, and the lane is not
// chained again. The HTTP client never sees the refusal.
func TestBridgeFallsBackToFullRequestsOnStatelessUpstreams(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a")}, Stateless: true}, func(*harness, *relay.Config) {})
	conv := &conversation{h: h, thread: rootT}
	for i := range 3 {
		resp, body := conv.turn(fmt.Sprintf("turn %d", i))
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	recs := h.responseRecords(rootT)
	var chained, refused int
	for _, r := range recs {
		if r.PreviousResponseID != "" {
			chained++
			assert.Equal(t, "previous_response_not_found", r.ErrorCode)
			refused++
		}
	}
	assert.Equal(t, 1, chained, "one chain tried, then full requests only")
	assert.Equal(t, 1, refused)
	assert.Len(t, recs, 4, "three turns, one of them retried in full")
}
