package relay_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// An exhausted pool fails over once to the fallback group, with the fallback
// model and a notice; while the pool has room, the fallback is never used.
func TestFallbackTakesAnExhaustedPoolsRequest(t *testing.T) {
	t.Parallel()
	fb := sim.Account{ID: "f1", Kind: sim.KindOpenAI, AccessToken: "sk-f1", Organization: "org-f"}
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.FallbackModel = "gpt-5.4-mini" }, simAccount("a1", "org-a"), fb)
	ctx := context.Background()
	tags := []string{relay.FallbackTag}
	_, err := h.store.UpdateAccount(ctx, h.ids["f1"], store.AccountPatch{Tags: &tags})
	require.NoError(t, err)

	resp, body := h.post(sessionS, rootT, responseRequest("pool has room"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "a1", h.responseRecords(rootT)[0].Account, "the fallback is not part of the pool")
	assert.Empty(t, resp.Header.Get(relay.FallbackHeader))

	_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Account: "a1"})
	require.NoError(t, err)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: "unused"})
	res, err := codex.Exec(ctx, "the pool is exhausted", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	recs := h.responseRecords(res.ThreadID)
	require.Len(t, recs, 2, "once: the pool's account, then the fallback")
	assert.Equal(t, "a1", recs[0].Account)
	assert.Equal(t, "usage_limit", string(recs[0].Fault))
	assert.Equal(t, "f1", recs[1].Account)
	assert.Equal(t, "gpt-5.4-mini", recs[1].Model, "the fallback model")

	// A tool-call turn on the fallback: the follow-up carries the fallback's
	// turn state and stays with it.
	tool, err := codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo fallback-tool-ok"}]]`, codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, tool.ExitCode, tool.Stderr)
	assert.Contains(t, tool.FinalMessage, "fallback-tool-ok")
	toolRecs := h.responseRecords(tool.ThreadID)
	assert.Equal(t, "f1", toolRecs[len(toolRecs)-1].Account)

	// A Go client sees the notice: a header and a response.metadata entry.
	resp, body = h.post(sessionS, childT, responseRequest("again"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, resp.Header.Get(relay.FallbackHeader), "f1")
	assert.Equal(t, relay.RecoveryFallback, resp.Header.Get(relay.RecoveryHeader))
	assert.Contains(t, body, "x-codex-relay-fallback")
	atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{Recovery: relay.RecoveryFallback})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(atts), 2, "each fallback is a diagnostic")

	// The fallback failing too does not fall back again: the client gets an answer.
	_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultServerError, Account: "f1", Status: 503})
	require.NoError(t, err)
	before := len(h.responseRecords(""))
	resp, _ = h.post(sessionS, "019a6666-0000-7000-8000-000000000001", responseRequest("third"), nil)
	assert.NotEqual(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, before+1, len(h.responseRecords("")), "one fallback attempt, no loop")
}
