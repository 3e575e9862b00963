package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// A usage limit before any work: the same request goes to the next account;
// Codex never sees it and exits 0; the limited account rests until its reset.
func TestCodexUsageLimitBeforeWorkFailsOver(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			h.setUsed("a2", 90) // the thread starts on a1
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1", Times: 1})
			require.NoError(t, err)
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused"})
			res, err := codex.Exec(context.Background(), "hello", codexcli.RunOptions{})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, res.Stdout+res.Stderr)
			var accounts []string
			for _, r := range h.responseRecords(res.ThreadID) {
				if r.Generate != nil && !*r.Generate {
					continue // the WebSocket prewarm
				}
				accounts = append(accounts, r.Account)
			}
			assert.Equal(t, []string{"a1", "a2"}, accounts, "the limited account, then the next one")
			for _, r := range h.responseRecords(res.ThreadID) {
				if r.Account == "a2" {
					assert.Empty(t, r.ClientTurnState, "a turn state issued by a1 is not sent to a2")
				}
			}
			a1, err := h.store.Account(context.Background(), h.ids["a1"])
			require.NoError(t, err)
			assert.Equal(t, store.StatusRateLimited, a1.Status)
			assert.False(t, a1.StatusUntil.IsZero(), "until its reset")
			assert.Equal(t, "a2", h.threadAccount(res.ThreadID))
			atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{Recovery: "failover"})
			require.NoError(t, err)
			assert.Len(t, atts, 1)
		})
	}
}

// A usage limit after output began: nothing is replayed; Codex gets a
// terminal error; the account is penalised so the next turn goes elsewhere.
func TestCodexUsageLimitAfterOutputIsTerminal(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	h.setUsed("a2", 90)
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1", InStream: true, Events: 5, Times: 1})
	require.NoError(t, err)
	zero := 0
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused", RequestMaxRetries: &zero, StreamMaxRetries: &zero})
	res, err := codex.Exec(context.Background(), "hello [[sim:words 30]]", codexcli.RunOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, 0, res.ExitCode, "Codex got a terminal error")
	recs := h.responseRecords(res.ThreadID)
	require.Len(t, recs, 1, "nothing was replayed on another account")
	assert.Equal(t, "a1", recs[0].Account)
	a1, err := h.store.Account(context.Background(), h.ids["a1"])
	require.NoError(t, err)
	assert.Equal(t, store.StatusRateLimited, a1.Status, "the account rests")
}

// An account rate-limited by a 429 comes back by itself once its reset has
// passed: no restart, no operator.
func TestRateLimitedAccountReturnsAfterItsReset(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	// resets_at travels in whole seconds, so the rest may end up to a
	// second before the sim's own reset: leave room on both sides.
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1", Times: 1, ResetsIn: sim.Duration(3 * time.Second)})
	require.NoError(t, err)
	resp, body := h.post(sessionS, rootT, responseRequest("one"), nil)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	var answer struct {
		Error struct {
			ResetsAt int64 `json:"resets_at"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &answer), body)
	require.NotZero(t, answer.Error.ResetsAt, body)
	resetsAt := time.Unix(answer.Error.ResetsAt, 0)
	assert.Equal(t, store.StatusRateLimited, statusOf(t, h, "a1"))

	resp, _ = h.post(sessionS, rootT, responseRequest("too soon"), nil)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "still resting before its reset")
	time.Sleep(time.Until(resetsAt) + 300*time.Millisecond)
	resp, body = h.post(sessionS, rootT, responseRequest("after the reset"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, store.StatusActive, statusOf(t, h, "a1"), "a success clears the limit")
}

// A request counts as in flight on its account while it runs (the balancer
// and the console read it), over the bridge and over plain HTTP, and stops
// counting when it ends, here by the client giving up on a stalled stream.
func TestInFlightCountsARequestWhileItRuns(t *testing.T) {
	for _, bridged := range []bool{true, false} {
		t.Run(map[bool]string{true: "bridge", false: "http"}[bridged], func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.DisableBridge = !bridged }, simAccount("a1", "org-a"))
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultStall, Events: 1, Times: 1})
			require.NoError(t, err)
			body, err := json.Marshal(responseRequest("stall"))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.codexBaseURL()+"/responses", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			a1 := h.ids["a1"]
			require.Eventually(t, func() bool { return h.relay.InFlight(a1) == 1 }, time.Minute, 10*time.Millisecond, "in flight while stalled")
			cancel()
			<-done
			require.Eventually(t, func() bool { return h.relay.InFlight(a1) == 0 }, time.Minute, 10*time.Millisecond, "and no more once it ended")
		})
	}
}

// An account whose upstream takes connections and never answers costs the
// first new thread its deadline (it then fails over before any output),
// and not the next ones: they go straight to an account that answers,
// while the dead one is passed over for a while.
func TestDeadUpstreamIsPassedOverByNewThreads(t *testing.T) {
	t.Parallel()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int64
	var held sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { hole.Close(); close(done); held.Wait() })
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			held.Go(func() { <-done; c.Close() }) // holds it, answers nothing
		}
	}()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		up := relay.NewUpstreamWith(relay.UpstreamOptions{})
		up.DialTimeout = time.Second
		c.Upstream, c.StreamIdleTimeout = up, time.Second
	}, simAccount("live", "org-a"))
	ctx := context.Background()
	_, err = h.store.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "dead", Organization: "org-a", Priority: 10,
		BaseURL: "http://" + hole.Addr().String() + "/v1"}, store.Credentials{APIKey: "sk-dead"})
	require.NoError(t, err)

	for i := range 3 {
		resp, sse := h.post(fmt.Sprintf("019b1111-0000-7000-8000-%012d", i), "", responseRequest("hello"), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, sse)
		require.NotEmpty(t, completedID(t, sse), "thread %d completed", i)
	}
	assert.Equal(t, int64(1), accepted.Load(), "only the first new thread tried the dead upstream")
	recs := h.responseRecords("")
	require.Len(t, recs, 3)
	for _, r := range recs {
		assert.Equal(t, "live", r.Account)
	}
}
