package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// outputItems returns the items of an SSE body's response.output_item.done events.
func outputItems(t *testing.T, sse string) []any {
	t.Helper()
	var out []any
	for _, line := range strings.Split(sse, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(data, `"response.output_item.done"`) {
			continue
		}
		var ev struct {
			Item any `json:"item"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &ev))
		out = append(out, ev.Item)
	}
	return out
}

// conversation is a Go client that keeps a thread's full history, as HTTP
// clients do.
type conversation struct {
	h       *harness
	thread  string
	history []any
}

func (c *conversation) turn(text string) (*http.Response, string) {
	c.h.t.Helper()
	c.history = append(c.history, userMessage(text))
	req := responseRequest("")
	req["input"] = c.history
	resp, body := c.h.post(sessionS, c.thread, req, nil)
	if resp.StatusCode == http.StatusOK {
		c.history = append(c.history, outputItems(c.h.t, body)...)
	}
	return resp, body
}

func (h *harness) pause(simID string) {
	h.t.Helper()
	_, err := h.store.SetAccountStatus(context.Background(), h.ids[simID], store.StatusPaused, "test", time.Time{})
	require.NoError(h.t, err)
}

func (h *harness) setUsed(simID string, pct float64) {
	h.t.Helper()
	// What the relay learnt from earlier answers is written first: it must
	// not overwrite this.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(h.t, h.relay.SettleWrites(ctx))
	require.NoError(h.t, h.store.UpdateUsage(context.Background(), h.ids[simID], store.Window{UsedPercent: pct, WindowMinutes: 300, ResetAt: time.Now().Add(time.Hour), Known: true}, store.Window{}))
}

func (h *harness) threadAccount(thread string) string {
	h.t.Helper()
	rows, _, err := h.store.Bindings(context.Background(), store.BindingFilter{ThreadID: thread, Kind: store.BindThread})
	require.NoError(h.t, err)
	require.Len(h.t, rows, 1)
	return h.simID(rows[0].AccountID)
}

// forgetOrganisation drops the relay's memory of which organisation issued
// the thread's ciphertext (as after a restart): mismatch switching is the net.
func (h *harness) forgetOrganisation(thread string) {
	h.relay.Continuity().Drop(continuity.Key{Thread: string(relay.DeriveIdentity(sessionS, "session-id", thread).Key)})
}

// Another organisation's account rejects the reasoning ciphertext; the relay
// strips it and the same account serves the request.
func TestReasoningRecoveryOnAForeignAccount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("b1", "org-b"))
	h.setUsed("b1", 90) // the thread starts on a1
	conv := &conversation{h: h, thread: rootT}
	resp, body := conv.turn("hello")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "a1", h.threadAccount(rootT))
	h.pause("a1")

	resp, body = conv.turn("again")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, relay.RecoveryReasoning, resp.Header.Get(relay.RecoveryHeader))
	recs := h.responseRecords(rootT)
	require.Len(t, recs, 3)
	assert.Equal(t, "b1", recs[1].Account)
	assert.Equal(t, "invalid_encrypted_content", recs[1].ErrorCode, "b1 rejected org-a's reasoning")
	assert.Equal(t, "b1", recs[2].Account, "the stripped retry stayed on b1")
	assert.Equal(t, "completed", recs[2].Outcome)
	assert.Equal(t, "b1", h.threadAccount(rootT), "the thread moved to the account that served it")

	atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{Recovery: relay.RecoveryReasoning})
	require.NoError(t, err)
	assert.Len(t, atts, 1)
	assert.Equal(t, store.StatusActive, statusOf(t, h, "b1"), "no health penalty for a mismatch")
}

func statusOf(t *testing.T, h *harness, simID string) store.Status {
	a, err := h.store.Account(context.Background(), h.ids[simID])
	require.NoError(t, err)
	return a.Status
}

// sealedThreadMoved starts a conversation on a1, whose agent messages are
// sealed (ciphertext no stripping removes), then pauses a1: the thread's
// next turn must go to one of others, in usage order as given (each 10
// points more used than the one before).
func sealedThreadMoved(t *testing.T, others ...sim.Account) (*harness, *conversation) {
	t.Helper()
	a1 := simAccount("a1", "org-a")
	a1.SealMessages = true
	h := newHarness(t, append([]sim.Account{a1}, others...)...)
	for i, o := range others {
		h.setUsed(o.ID, float64(80+10*i))
	}
	conv := &conversation{h: h, thread: rootT}
	resp, body := conv.turn("hello")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "a1", h.threadAccount(rootT))
	h.pause("a1")
	return h, conv
}

// Ciphertext that cannot be stripped (sealed agent messages) is offered
// unchanged to other accounts; when none accepts, the binding stays on the
// first account and the client gets the first mismatch failure.
func TestMismatchNoAccountAccepts(t *testing.T) {
	t.Parallel()
	h, conv := sealedThreadMoved(t, simAccount("b1", "org-b"), simAccount("b2", "org-b"))
	resp, body := conv.turn("again")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	assert.Contains(t, body, "could not be decrypted")
	recs := h.responseRecords(rootT)[1:]
	var accounts []string
	for _, r := range recs {
		accounts = append(accounts, r.Account)
	}
	assert.Equal(t, []string{"b1", "b1", "b2", "b2"}, accounts, "each account ran its own recovery, then the request moved on")
	assert.Equal(t, "a1", h.threadAccount(rootT), "no account accepted: the binding is where it was")
	assert.Equal(t, store.StatusActive, statusOf(t, h, "b1"))
	assert.Equal(t, store.StatusActive, statusOf(t, h, "b2"))
	atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{Recovery: relay.RecoveryMismatch})
	require.NoError(t, err)
	assert.Len(t, atts, 1, "one switch to b2")
}

// When every other account is used up before the switch budget is, the
// client still gets the rejection, not "no account".
func TestMismatchWithNoOtherAccountLeftAnswersTheRejection(t *testing.T) {
	t.Parallel()
	h, conv := sealedThreadMoved(t, simAccount("b1", "org-b"))
	resp, body := conv.turn("again")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	assert.Contains(t, body, "could not be decrypted")
	assert.Len(t, h.responseRecords(rootT)[1:], 2, "b1, and b1 stripped")
}

// When the organisation is unknown, mismatch switching finds the account
// that can read the conversation, and that account takes the thread.
func TestMismatchAcceptedElsewhere(t *testing.T) {
	t.Parallel()
	h, conv := sealedThreadMoved(t, simAccount("b1", "org-b"), simAccount("a2", "org-a"))
	h.forgetOrganisation(rootT)
	resp, body := conv.turn("again")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, relay.RecoveryMismatch, resp.Header.Get(relay.RecoveryHeader))
	recs := h.responseRecords(rootT)
	last := recs[len(recs)-1]
	assert.Equal(t, "a2", last.Account, "org-a's other account read the conversation")
	assert.Equal(t, "a2", h.threadAccount(rootT), "the accepting account took the thread")
}

// A thread that must move goes to an account of the organisation that
// issued its ciphertext first: a cross-organisation resume with the real
// Codex CLI lands on org-a's other account, not the emptier org-b one.
func TestCodexResumeLandsOnTheIssuingOrganisation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("b1", "org-b"))
	h.setUsed("a2", 95)
	h.setUsed("b1", 90)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused"})
	first, err := codex.Exec(context.Background(), "remember teal", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, first.Stderr)
	require.Equal(t, "a1", h.responseRecords(first.ThreadID)[0].Account)

	h.pause("a1")
	h.setUsed("a2", 60)
	h.setUsed("b1", 0) // the balancer alone would pick b1
	resumed, err := codex.Resume(context.Background(), first.ThreadID, "which word?", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)
	recs := h.responseRecords(first.ThreadID)
	last := recs[len(recs)-1]
	assert.Equal(t, "a2", last.Account, "the issuing organisation's account took the thread")
	for _, r := range recs {
		assert.NotEqual(t, "invalid_encrypted_content", r.ErrorCode, "no mismatch happened")
	}
}

// Over WebSocket: a chained request whose lane's account went away is
// rebuilt in full; an account of another organisation strips, is rejected
// again by the sealed agent message, and the unchanged request moves to an
// account that reads it.
func TestWebSocketMismatchSwitching(t *testing.T) {
	t.Parallel()
	a1 := simAccount("a1", "org-a")
	a1.SealMessages = true
	h := newHarness(t, a1, simAccount("a2", "org-a"), simAccount("b1", "org-b"))
	h.setUsed("a2", 90)
	h.setUsed("b1", 80)
	c := h.dialWS(sessionS, rootT)
	first := c.turn(responseRequest("hello"))
	typ, _ := lastEvent(first)
	require.Equal(t, "response.completed", typ)
	history := []any{userMessage("hello")}
	for _, ev := range first {
		if ev["type"] == "response.output_item.done" {
			history = append(history, ev["item"])
		}
	}
	require.Equal(t, "a1", h.threadAccount(rootT))
	h.pause("a1")
	h.forgetOrganisation(rootT)
	// Continuity still holds the history for the rebuild; only the
	// organisation is unknown.
	h.relay.Continuity().Drop(continuityKey(rootT))
	events := c.turn(map[string]any{"model": "gpt-5.5-codex", "input": append(history, userMessage("again"))})
	typ, _ = lastEvent(events)
	require.Equal(t, "response.completed", typ, "%v", events[len(events)-1])
	recs := h.responseRecords(rootT)
	var accounts []string
	for _, r := range recs[1:] {
		accounts = append(accounts, r.Account)
	}
	assert.Equal(t, []string{"b1", "b1", "a2"}, accounts, "recovery on b1, then the mismatch moved the request")
	assert.Equal(t, "a2", h.threadAccount(rootT))
}

func continuityKey(thread string) continuity.Key {
	return continuity.Key{Thread: string(relay.DeriveIdentity(sessionS, "session-id", thread).Key)}
}
