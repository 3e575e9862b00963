package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// hangUpAfter sends one request of thread over transport, reads its events
// until one of type until, and hangs up there, the way Codex drops its
// connection once it has its answer (the socket closed without a close
// frame; the response body closed unread).
func (h *harness) hangUpAfter(transport, thread, prompt, until string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	marker := `"type":"` + until + `"`
	if transport == "ws" {
		c := h.dialWS(sessionS, thread)
		msg := responseRequest(prompt)
		msg["type"] = "response.create"
		b, err := json.Marshal(msg)
		require.NoError(h.t, err)
		require.NoError(h.t, c.conn.Write(ctx, websocket.MessageText, b))
		for {
			_, data, err := c.conn.Read(ctx)
			require.NoError(h.t, err)
			if bytes.Contains(data, []byte(marker)) {
				break
			}
		}
		require.NoError(h.t, c.conn.CloseNow())
		return
	}
	b, err := json.Marshal(responseRequest(prompt))
	require.NoError(h.t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
	require.NoError(h.t, err)
	req.Header.Set("session-id", sessionS)
	req.Header.Set("thread-id", thread)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(h.t, err)
	require.Equal(h.t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		require.NoError(h.t, err, "the stream ended before %s", until)
		if strings.Contains(line, marker) {
			break
		}
	}
	require.NoError(h.t, resp.Body.Close()) // unread: the connection closes
}

// attemptsOf returns the attempt records of thread, oldest first.
func (h *harness) attemptsOf(thread string) []store.Attempt {
	h.t.Helper()
	atts, _, err := h.store.Attempts(context.Background(), storeFilterThread(thread))
	require.NoError(h.t, err)
	sort.Slice(atts, func(i, j int) bool {
		if !atts[i].StartedAt.Equal(atts[j].StartedAt) {
			return atts[i].StartedAt.Before(atts[j].StartedAt)
		}
		return atts[i].Seq < atts[j].Seq
	})
	return atts
}

// requireUnpenalised checks that an account is active with no cooldown.
func (h *harness) requireUnpenalised(simID string) {
	h.t.Helper()
	a, err := h.store.Account(context.Background(), h.ids[simID])
	require.NoError(h.t, err)
	assert.Equal(h.t, store.StatusActive, a.Status, "the account is not penalised")
	assert.True(h.t, a.StatusUntil.IsZero(), "no cooldown")
}

// A client that ends its stream early on purpose (Codex drops the
// connection once it has its final answer) is a normal cancellation, on
// both transports. While the upstream is still answering, its request is
// cancelled (its lane closed: the upstream sees the client go), the attempt
// is cancelled (499), nothing fails over, the account keeps its standing,
// and the thread's next request works on a fresh lane of the same account.
// Once the upstream had finished, the turn counts, and an HTTP thread's
// lane serves its next request.
func TestClientThatHangsUpOnceItHasItsAnswer(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport+", the upstream still answering", func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			thread := "019a4444-0000-7000-8000-0000000000" + map[string]string{"http": "a1", "ws": "a2"}[transport]
			// The text is done well before the rest of the response comes.
			h.hangUpAfter(transport, thread, "answer [[sim:events 3]] [[sim:gap 300ms]]", "response.output_text.done")

			rec := h.waitRequest(thread)
			assert.Equal(t, 499, rec.Status, "logged as closed by the client")
			assert.Equal(t, "cancelled", rec.ErrorCode)
			atts := h.attemptsOf(thread)
			require.Len(t, atts, 1, "nothing failed over, nothing was retried")
			assert.Equal(t, "cancelled", atts[0].Class)
			assert.Equal(t, 499, atts[0].Status)
			assert.Equal(t, "terminal", atts[0].Action)
			var first sim.Record
			require.Eventually(t, func() bool {
				recs := h.responseRecords(thread)
				require.Len(t, recs, 1, "the upstream got the request once")
				first = recs[0]
				return first.Done
			}, time.Minute, 10*time.Millisecond)
			assert.Equal(t, sim.OutcomeGone, first.Outcome, "the upstream's request was cancelled: it saw its client go")
			assert.NotContains(t, first.EventTypes, "response.completed")
			owner := first.Account
			h.requireUnpenalised(owner)
			assert.Eventually(t, func() bool { return h.relay.Bridge().Len() == 0 }, time.Minute, 10*time.Millisecond,
				"the lane, mid-answer, was closed")

			// The thread's next request: the same account, a fresh lane.
			if transport == "ws" {
				typ, _ := lastEvent(h.dialWS(sessionS, thread).turn(responseRequest("again")))
				require.Equal(t, "response.completed", typ)
			} else {
				resp, body := h.post(sessionS, thread, responseRequest("again"), nil)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
			}
			recs := h.responseRecords(thread)
			require.Len(t, recs, 2)
			assert.Equal(t, owner, recs[1].Account, "the thread stayed on its account")
			assert.NotEqual(t, recs[0].ConnID, recs[1].ConnID)
			assert.Equal(t, sim.OutcomeCompleted, recs[1].Outcome)
			h.requireUnpenalised(owner)
		})
		t.Run(transport+", after the last event", func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
			thread := "019a4444-0000-7000-8000-0000000000" + map[string]string{"http": "b1", "ws": "b2"}[transport]
			h.hangUpAfter(transport, thread, "answer", "response.completed")

			rec := h.waitRequest(thread)
			assert.Equal(t, http.StatusOK, rec.Status, "the client had its answer: the turn counts")
			atts := h.attemptsOf(thread)
			require.Len(t, atts, 1)
			assert.Equal(t, "ok", atts[0].Class)
			recs := h.responseRecords(thread)
			require.Len(t, recs, 1)
			assert.Equal(t, sim.OutcomeCompleted, recs[0].Outcome)
			h.requireUnpenalised(recs[0].Account)
			if transport == "ws" {
				// The connection's own lane ends with it.
				assert.Eventually(t, func() bool { return h.relay.Bridge().Len() == 0 }, time.Minute, 10*time.Millisecond)
				return
			}
			resp, body := h.post(sessionS, thread, responseRequest("again"), nil)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			recs = h.responseRecords(thread)
			require.Len(t, recs, 2)
			assert.Equal(t, recs[0].ConnID, recs[1].ConnID, "the thread's lane served its next request")
			atts = h.attemptsOf(thread)
			require.Len(t, atts, 2)
			assert.Contains(t, atts[1].Detail, "lane: reused")
		})
	}
}

// A client let go before its answer's end, once the upstream had finished
// (its terminal event waiting in the lane), costs the lane nothing: it
// serves the thread's next request, and the response the upstream
// completed is counted. The attempt is the client's doing, never the
// account's.
func TestClientLetGoAfterTheUpstreamFinishedKeepsTheLane(t *testing.T) {
	t.Parallel()
	// The client is let go a while after the relay's writes block: long
	// after the upstream sent its last event. The relay has far longer than
	// its default to read what the lane holds: on a machine short of CPU
	// reading it took more than the default 50ms once, and the lane was
	// hung up (the upstream taken for still answering).
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) {
		c.ClientWriteTimeout, c.HangUpAfter = 3*time.Second, 5*time.Second
	}, simAccount("a1", "org-a"))
	srv := httptest.NewUnstartedServer(h.relay)
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	const thread = "019a4444-0000-7000-8000-0000000000c1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := json.Marshal(responseRequest("flood me [[sim:words 5000]]")) // sent at once, larger than every buffer between
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/backend-api/codex/responses", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("session-id", sessionS)
	req.Header.Set("thread-id", thread)
	resp, err := (&http.Client{Transport: &http.Transport{DialContext: smallReader}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err, "the stream began") // then the client reads no more

	rec := h.waitRequest(thread)
	assert.Equal(t, 499, rec.Status)
	assert.Equal(t, "client_stalled", rec.ErrorCode)
	assert.Positive(t, rec.TotalTokens, "the response the upstream completed is counted")
	atts := h.attemptsOf(thread)
	require.Len(t, atts, 1)
	assert.Equal(t, "client_stalled", atts[0].Class)
	assert.Equal(t, 499, atts[0].Status)
	assert.Contains(t, atts[0].Detail, "after the upstream's terminal event")
	recs := h.responseRecords(thread)
	require.Len(t, recs, 1)
	assert.Equal(t, sim.OutcomeCompleted, recs[0].Outcome, "the upstream had finished")
	assert.Equal(t, 1, h.relay.Bridge().Len(), "the lane was kept")
	h.requireUnpenalised("a1")

	next, body := h.post(sessionS, thread, responseRequest("again"), nil)
	require.Equal(t, http.StatusOK, next.StatusCode, body)
	recs = h.responseRecords(thread)
	require.Len(t, recs, 2)
	assert.Equal(t, recs[0].ConnID, recs[1].ConnID, "the lane served the thread's next request")
	atts = h.attemptsOf(thread)
	require.Len(t, atts, 2)
	assert.Contains(t, atts[1].Detail, "lane: reused")
}

// The real Codex CLI ends its connection once it has its final answer
// (over WebSocket it drops the socket without a close frame): none of its
// requests is recorded as a failure, cancelled or penalised, and the relay
// logs nothing about it above debug.
func TestCodexHangingUpIsNoFailure(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			var logs logbuf.Buffer
			h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Logger = logs.Logger() }, simAccount("a1", "org-a"))
			codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: ws, Key: "unused"})
			// The answer trickles in, so the end of the stream is the
			// client's to take or leave.
			res, err := codex.Exec(context.Background(), `run it [[sim:tool exec_command {"cmd":"echo hangup-ok"}]] [[sim:gap 20ms]]`, codexcli.RunOptions{BypassSandbox: true})
			require.NoError(t, err)
			codexcli.RequireSuccess(t, res)
			assert.Contains(t, res.FinalMessage, "hangup-ok")
			if ws {
				assert.Empty(t, res.WebSocketFallback())
			}

			upstream := h.responseRecords(res.ThreadID)
			require.GreaterOrEqual(t, len(upstream), 2, "the tool call and its follow-up")
			var rows []store.RequestRecord
			require.Eventually(t, func() bool {
				rows, _, err = h.store.Requests(context.Background(), store.RequestFilter{ThreadID: res.ThreadID})
				return err == nil && len(rows) == len(upstream)
			}, time.Minute, 10*time.Millisecond, "every request Codex made is logged")
			for _, r := range rows {
				assert.Equal(t, http.StatusOK, r.Status, "request %s", r.ID)
				assert.Empty(t, r.ErrorCode, "request %s", r.ID)
			}
			for _, a := range h.attemptsOf(res.ThreadID) {
				assert.Equal(t, "ok", a.Class, "attempt of %s: %s", a.RequestID, a.Detail)
				assert.Equal(t, http.StatusOK, a.Status)
			}
			for _, r := range upstream {
				assert.Equal(t, sim.OutcomeCompleted, r.Outcome)
			}
			h.requireUnpenalised("a1")
			if ws {
				// The session's end is logged before its lane goes.
				require.Eventually(t, func() bool { return h.relay.Bridge().Len() == 0 }, time.Minute, 10*time.Millisecond,
					"Codex's connection ended, and its lane with it")
			}
			assert.NotContains(t, logs.String(), "level=WARN")
			assert.NotContains(t, logs.String(), "level=ERROR")
			assert.NotContains(t, logs.String(), "websocket session ended", "Codex dropping its socket is a normal hang-up")
		})
	}
}
