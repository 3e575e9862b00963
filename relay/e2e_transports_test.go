package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// One attempt loop serves both transports: the same failure script, run
// once over HTTP/SSE and once over a WebSocket, leaves the same attempt
// records (account, class, action, recovery, status) and the same request
// log row, and ends with the same kind of answer.
func TestSameFailuresSameRecordsOnBothTransports(t *testing.T) {
	t.Parallel()
	accounts := []sim.Account{simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("a3", "org-a")}
	cases := []struct {
		name   string
		faults []sim.Fault
		prompt string
		answer string // the terminal event type the client reads, or the HTTP status for an error answer
	}{
		{"served at once", nil, "hi", "response.completed"},
		{"usage limit before work: the next account", []sim.Fault{{Kind: sim.FaultUsageLimit, Account: "a1", Times: 1}}, "hi", "response.completed"},
		{"5xx everywhere: the first failure", []sim.Fault{{Kind: sim.FaultServerError, Status: 503}}, "hi", "503"},
		{"rate limit in the stream before work: the next account", []sim.Fault{{Kind: sim.FaultRateLimit, Account: "a1", InStream: true, Times: 1}}, "hi", "response.completed"},
		{"cut before any output: the next account", []sim.Fault{{Kind: sim.FaultCutStream, Account: "a1", Events: 1, Times: 1}}, "hi", "response.completed"},
		{"cut after output: terminal, nothing replayed", []sim.Fault{{Kind: sim.FaultCutStream, Account: "a1", Events: 6, Times: 1}}, "hi [[sim:words 20]]", "response.failed"},
		{"stall before any output: the next account", []sim.Fault{{Kind: sim.FaultStall, Account: "a1", Events: 1, Times: 1}}, "hi", "response.completed"},
		{"every account at its usage limit: try again at", []sim.Fault{{Kind: sim.FaultUsageLimit, ResetsIn: sim.Duration(time.Hour)}}, "hi", "429"},
		{"a failure the client caused: terminal on the first account", []sim.Fault{{Kind: sim.FaultInsufficientQuota, Account: "a1", InStream: true, Events: 8, Times: 1}}, "hi [[sim:words 20]]", "response.failed"},
	}
	type run struct {
		records []string
		request string
		answer  string
	}
	serve := func(t *testing.T, transport string, faults []sim.Fault, prompt string) run {
		h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.StreamIdleTimeout = time.Second }, accounts...)
		h.setUsed("a2", 40) // a1 first, then a2, then a3
		h.setUsed("a3", 60)
		for _, f := range faults {
			_, err := h.sim.AddFault(f)
			require.NoError(t, err)
		}
		thread := "019a4444-0000-7000-8000-000000000001"
		var out run
		if transport == "http" {
			resp, body := h.post(sessionS, thread, responseRequest(prompt), nil)
			out.answer = fmt.Sprint(resp.StatusCode)
			if resp.StatusCode == 200 {
				out.answer = lastSSEType(body)
			}
		} else {
			events := h.dialWS(sessionS, thread).turn(responseRequest(prompt))
			ev := events[len(events)-1]
			out.answer, _ = ev["type"].(string)
			if out.answer == "error" {
				out.answer = fmt.Sprint(ev["status"])
			}
		}
		rec := h.waitRequest(thread)
		out.request = fmt.Sprintf("status=%d code=%s account=%s recovery=%s", rec.Status, rec.ErrorCode, h.simID(rec.AccountID), rec.Recovery)
		atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{RequestID: rec.ID})
		require.NoError(t, err)
		for i := len(atts) - 1; i >= 0; i-- { // oldest first
			a := atts[i]
			out.records = append(out.records, fmt.Sprintf("%d %s %s %s %s status=%d", a.Seq, h.simID(a.AccountID), a.Class, a.Action, a.Recovery, a.Status))
		}
		return out
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			overHTTP := serve(t, "http", tc.faults, tc.prompt)
			overWS := serve(t, "ws", tc.faults, tc.prompt)
			assert.Equal(t, tc.answer, overHTTP.answer, "HTTP answer")
			assert.Equal(t, tc.answer, overWS.answer, "WebSocket answer")
			assert.Equal(t, overHTTP.records, overWS.records, "the same attempts")
			assert.Equal(t, overHTTP.request, overWS.request, "the same request record")
			t.Logf("records:\n%s\nrequest: %s", strings.Join(overHTTP.records, "\n"), overHTTP.request)
		})
	}
}

// lastSSEType is the type of the last data event of an SSE body.
func lastSSEType(body string) string {
	typ := ""
	for _, line := range strings.Split(body, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var ev struct {
				Type string `json:"type"`
			}
			if json.Unmarshal([]byte(data), &ev) == nil {
				typ = ev.Type
			}
		}
	}
	return typ
}
