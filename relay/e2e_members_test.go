package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// The probe of issue 36: a key limited to one model, effort low and no
// priority tier sent the members its policy reads twice, or as a variant
// of their name, and the upstream read the other one. Every such body is
// refused 400 naming the member, on HTTP (Responses, compact, Chat) and
// over a WebSocket, and nothing reaches the upstream; the canonical body
// still works.
func TestMembersTheRelayDecidesOnAreReadOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	_, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "narrow", Models: []string{"gpt-5.4"},
		Policy: store.KeyPolicy{MaxReasoningEffort: "low", PriorityTier: "refuse"}})
	require.NoError(t, err)
	const input = `"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]`
	probes := []struct {
		name, body, member string
	}{
		{"service_tier twice", `{"model":"gpt-5.4","service_tier":"default","service_tier":"priority",` + input + `}`, "service_tier"},
		{"reasoning twice", `{"model":"gpt-5.4","reasoning":{"effort":"low"},"reasoning":{"effort":"xhigh"},` + input + `}`, "reasoning"},
		{"effort twice", `{"model":"gpt-5.4","reasoning":{"effort":"low","effort":"xhigh"},` + input + `}`, "reasoning.effort"},
		{"Model beside model", `{"model":"gpt-5.4","Model":"gpt-5.5-codex",` + input + `}`, "model"},
		{"model twice", `{"model":"gpt-5.4","model":"gpt-5.5-codex",` + input + `}`, "model"},
		{"an escaped name", `{"model":"gpt-5.4","\u0073ervice_tier":"priority",` + input + `}`, "service_tier"},
		{"a Unicode fold", `{"model":"gpt-5.4","ſervice_tier":"priority",` + input + `}`, "service_tier"},
		{"client_metadata twice", `{"model":"gpt-5.4","client_metadata":{},"client_metadata":{"x-codex-turn-state":"x"},` + input + `}`, "client_metadata"},
	}
	hdr := http.Header{"Authorization": {"Bearer " + secret}, "Content-Type": {"application/json"}, "session-id": {"s"}, "thread-id": {"t"}}
	for _, p := range probes {
		for _, path := range []string{"/backend-api/codex/responses", "/v1/responses", "/backend-api/codex/responses/compact"} {
			code, _, body := h.raw(http.MethodPost, path, hdr, []byte(p.body))
			assert.Equal(t, http.StatusBadRequest, code, "%s on %s: %s", p.name, path, body)
			var e struct{ Error wire.Error }
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			assert.Equal(t, "ambiguous_member", e.Error.Code, "%s on %s", p.name, path)
			assert.Equal(t, p.member, e.Error.Param, "%s on %s: the answer names the member", p.name, path)
		}
	}
	chatProbes := []string{
		`{"model":"gpt-5.4","Model":"gpt-5.5-codex","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-5.4","reasoning_effort":"low","reasoning_effort":"xhigh","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-5.4","service_tier":"default","Service_Tier":"priority","messages":[{"role":"user","content":"hi"}]}`,
	}
	for _, b := range chatProbes {
		code, _, body := h.raw(http.MethodPost, "/v1/chat/completions", hdr, []byte(b))
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", b, body)
		var e struct{ Error wire.Error }
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		assert.NotEmpty(t, e.Error.Param, "%s: the answer names the member: %s", b, body)
	}

	ws := h.dialWSWith("s", "t", http.Header{"Authorization": {"Bearer " + secret}})
	for _, p := range append(probes, struct{ name, body, member string }{"type twice",
		`{"model":"gpt-5.4","type":"response.create",` + input + `,"Type":"response.cancel"}`, "type"},
		// The first type says "pass me through as I came"; an upstream
		// reading the last would take an unpoliced request.
		struct{ name, body, member string }{"a passed-through type, then response.create",
			`{"type":"response.processed","model":"gpt-5.5-codex","service_tier":"priority",` + input + `,"type":"response.create"}`, "type"}) {
		frame := p.body
		if !strings.Contains(frame, `"type":"response.create"`) {
			frame = `{"type":"response.create",` + strings.TrimPrefix(p.body, "{")
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(t, ws.conn.Write(wctx, websocket.MessageText, []byte(frame)))
		events := ws.events(wctx)
		cancel()
		last := events[len(events)-1]
		require.Equal(t, "error", last["type"], "%s over a WebSocket: %v", p.name, events)
		raw, _ := json.Marshal(last)
		var e struct {
			Status int
			Error  wire.Error
		}
		require.NoError(t, json.Unmarshal(raw, &e))
		assert.Equal(t, http.StatusBadRequest, e.Status, "%s over a WebSocket: %s", p.name, raw)
		assert.Equal(t, p.member, e.Error.Param, "%s over a WebSocket names the member: %s", p.name, raw)
	}
	assert.Empty(t, h.responseRecords(""), "nothing refused reached the upstream")

	// The canonical body is served, on both transports.
	code, _, body := h.raw(http.MethodPost, "/backend-api/codex/responses", hdr,
		[]byte(`{"model":"gpt-5.4","stream":true,"reasoning":{"effort":"low"},`+input+`}`))
	require.Equal(t, http.StatusOK, code, body)
	events := ws.turn(map[string]any{"model": "gpt-5.4", "input": []any{userMessage("hi again")}})
	typ, _ := lastEvent(events)
	assert.Equal(t, "response.completed", typ, "%v", events)
}

// A text frame that is not UTF-8 closes the client's WebSocket with 1007
// (RFC 6455 8.1) and reaches no upstream; before, it was forwarded, and
// the upstream read other text than the relay did.
func TestInvalidUTF8TextFrameClosesWith1007(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ws := h.dialWS("s", "t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	frame := []byte(`{"type":"response.create","model":"gpt-5.4","input":"caf` + "\xe9" + `"}`)
	require.NoError(t, ws.conn.Write(ctx, websocket.MessageText, frame))
	_, _, err := ws.conn.Read(ctx)
	require.Error(t, err)
	assert.Equal(t, websocket.StatusInvalidFramePayloadData, websocket.CloseStatus(err), "%v", err)
	assert.Empty(t, h.responseRecords(""), "nothing reached the upstream")
}

// The same over HTTP: a body that is not UTF-8 is refused 400 on every
// client route that reads one, and reaches no upstream.
func TestInvalidUTF8BodyIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	hdr := http.Header{"Content-Type": {"application/json"}, "session-id": {"s"}, "thread-id": {"t"}}
	for path, body := range map[string]string{
		"/backend-api/codex/responses":         `{"model":"gpt-5.4","input":"caf` + "\xe9" + `"}`,
		"/v1/responses":                        `{"model":"gpt-5.4","service_tier":"priority` + "\xff" + `","input":"hi"}`,
		"/backend-api/codex/responses/compact": `{"model":"gpt-5.4","input":"caf` + "\xe9" + `"}`,
		"/v1/chat/completions":                 `{"model":"gpt-5.4","messages":[{"role":"user","content":"caf` + "\xe9" + `"}]}`,
	} {
		code, _, raw := h.raw(http.MethodPost, path, hdr, []byte(body))
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", path, raw)
		assert.Contains(t, raw, "not valid UTF-8", path)
	}
	assert.Empty(t, h.responseRecords(""), "nothing reached the upstream")
}
