package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// Issue 36's probe: an upstream answering "Incorrect API key provided:
// Bearer sk-..." gave the client the account's key. An auth, billing or
// forbidden class error, or a server error, reaches the client in the
// relay's own words (status, type and code kept), over HTTP and over a
// WebSocket; an error the client must read (a rate limit) passes, with
// anything credential-shaped masked; the attempt record keeps the
// upstream's message, masked.
func TestUpstreamErrorsNeverEchoACredential(t *testing.T) {
	t.Parallel()
	const leaked = "sk-proj-LEAKEDaccountKEY123456"
	for _, c := range []struct {
		name  string
		fault sim.Fault
	}{
		{"unauthorized", sim.Fault{Kind: sim.FaultUnauthorized, Message: "Incorrect API key provided: Bearer " + leaked + "."}},
		{"payment required", sim.Fault{Kind: sim.FaultPaymentRequired, Message: "Billing for " + leaked + " is inactive"}},
		{"forbidden", sim.Fault{Kind: sim.FaultForbidden, Message: "Key " + leaked + " may not use this model"}},
		{"server error", sim.Fault{Kind: sim.FaultServerError, Message: "panic in handler for " + leaked}},
		{"rate limit", sim.Fault{Kind: sim.FaultRateLimit, Message: "Rate limit reached for " + leaked}},
	} {
		for _, transport := range []string{"http", "websocket"} {
			t.Run(c.name+"/"+transport, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, simAccount("a1", "org-a"))
				_, err := h.sim.AddFault(c.fault)
				require.NoError(t, err)
				var raw string
				if transport == "http" {
					_, raw = h.post("s", "t", spendRequest("hi"), nil)
				} else {
					events := h.dialWS("s", "t").turn(map[string]any{"model": "gpt-5.4", "input": []any{userMessage("hi")}})
					b, _ := json.Marshal(events[len(events)-1])
					raw = string(b)
				}
				assert.NotContains(t, raw, "LEAKED", "the account's key reached the client: %s", raw)
				if c.name == "unauthorized" {
					assert.Contains(t, raw, "the upstream account's credentials were refused", "the relay's own sentence: %s", raw)
				}
				h.waitRequest("t") // the log is written behind the answer, attempts with their request
				atts, _, err := h.store.Attempts(context.Background(), store.AttemptFilter{Limit: 100})
				require.NoError(t, err)
				var details []string
				for _, a := range atts {
					details = append(details, a.Detail)
				}
				all := strings.Join(details, "\n")
				assert.NotContains(t, all, "LEAKED", "the attempt records mask it")
				if c.name == "unauthorized" {
					assert.Contains(t, all, "Incorrect API key provided: Bear***", "the upstream's message is kept for operators, masked")
				} else {
					assert.Contains(t, all, "sk-p***", "the upstream's message is kept for operators, masked: %s", all)
				}
			})
		}
	}
}
