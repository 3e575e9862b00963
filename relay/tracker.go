package relay

import (
	"cmp"
	"encoding/json"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// responseEnvelope reads the parts of response.created/completed/failed the
// relay needs.
type responseEnvelope struct {
	Response struct {
		ID          string      `json:"id"`
		Model       string      `json:"model"`
		ServiceTier string      `json:"service_tier"`
		Error       *wire.Error `json:"error"`
		Usage       *wire.Usage `json:"usage"`
	} `json:"response"`
}

// tracker follows one upstream stream: ids, output items, usage, terminal.
type tracker struct {
	responseID string
	output     []json.RawMessage
	input      int64
	outputTok  int64
	cached     int64
	reasoning  int64
	total      int64 // usage.total_tokens (input + output when the upstream gave none)
	images     int64 // the images an images answer returned
	usage      bool  // a usage object was reported
	// model and tier are what the upstream said it served.
	model, tier string
	terminal    string
	failure     *wire.Error
	failStatus  int
	work        bool
	events      int
	turnState   string
	// limits are the usage windows a codex.rate_limits event reported.
	limits *wire.RateLimits
}

// documentTracker reads what a JSON answer (the legacy compact route's)
// used and left: it did work, its id, usage and output items when it
// reports them.
func documentTracker(doc []byte) *tracker {
	tr := &tracker{work: true}
	var env responseEnvelope
	// The document is the response object itself: read it as the
	// "response" member of an event.
	if json.Unmarshal(append(append([]byte(`{"response":`), doc...), '}'), &env) == nil {
		tr.observeResponse(env)
	}
	var out struct {
		Output []json.RawMessage `json:"output"`
	}
	if json.Unmarshal(doc, &out) == nil {
		tr.output = out.Output
	}
	return tr
}

// semantic reports whether an event carries work the client acts on.
func semantic(typ string) bool {
	switch typ {
	case wire.EventResponseCreated, wire.EventResponseInProgress, wire.EventResponseMetadata, wire.EventRateLimits, "":
		return false
	}
	return !wire.IsTerminal(typ)
}

// observe updates the tracker from one event; only the few event types that
// carry ids, items or errors are decoded.
func (t *tracker) observe(typ string, data []byte) {
	t.events++
	switch typ {
	case wire.EventResponseCreated, wire.EventResponseCompleted, wire.EventResponseIncomplete, wire.EventResponseFailed:
		var env responseEnvelope
		if json.Unmarshal(data, &env) == nil {
			t.observeResponse(env)
			if typ == wire.EventResponseFailed {
				t.failure = env.Response.Error
				if t.failure == nil {
					t.failure = &wire.Error{Type: wire.TypeServerError, Message: "response.failed"}
				}
			}
		}
	case wire.EventOutputItemDone:
		var env struct {
			Item json.RawMessage `json:"item"`
		}
		if json.Unmarshal(data, &env) == nil && len(env.Item) > 0 {
			t.output = append(t.output, env.Item)
		}
	case wire.EventError:
		if ev, ok := wire.ParseErrorEvent(data); ok {
			t.failure, t.failStatus = &ev.Error, ev.Status
		} else {
			t.failure = &wire.Error{Type: wire.TypeServerError, Message: "upstream error event"}
		}
	case wire.EventRateLimits:
		var ev wire.RateLimitsEvent
		if json.Unmarshal(data, &ev) == nil {
			rl := wire.RateLimits{}
			if p := ev.RateLimits.Primary; p != nil {
				w := p.RateLimitWindow
				rl.Primary = &w
			}
			if sw := ev.RateLimits.Secondary; sw != nil {
				w := sw.RateLimitWindow
				rl.Secondary = &w
			}
			t.limits = &rl
		}
	case wire.EventResponseMetadata:
		var env struct {
			Headers map[string]string `json:"headers"`
		}
		if json.Unmarshal(data, &env) == nil {
			if ts := env.Headers[wire.HeaderTurnState]; ts != "" {
				t.turnState = ts
			}
		}
	}
	if wire.IsTerminal(typ) {
		t.terminal = typ
	}
	if semantic(typ) {
		t.work = true
	}
}

// observeResponse takes a response object's id, model, tier and usage.
func (t *tracker) observeResponse(env responseEnvelope) {
	if env.Response.ID != "" {
		t.responseID = env.Response.ID
	}
	t.model = cmp.Or(env.Response.Model, t.model)
	t.tier = cmp.Or(env.Response.ServiceTier, t.tier)
	if u := env.Response.Usage; u != nil {
		t.usage = true
		t.input, t.outputTok, t.total = u.InputTokens, u.OutputTokens, u.Total()
		t.cached, t.reasoning = u.Cached(), u.Reasoning()
	}
}

// errCode is an upstream error's stable code, for records.
func errCode(e *wire.Error) string {
	if e == nil {
		return ""
	}
	return cmp.Or(e.Code, e.Type)
}
