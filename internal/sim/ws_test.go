package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// prewarmBody is Codex's first WebSocket message: generate:false.
func prewarmBody(t testing.TB) []byte {
	return body(t, []any{devMsg("base instructions")}, map[string]any{"generate": false})
}

func TestWebSocketSession(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	ctx := testCtx(t, 10*time.Second)
	conn, resp, err := c.dial(ctx)
	require.NoError(t, err)
	defer conn.CloseNow()
	rl := wire.ParseRateLimitHeaders(resp.Header)
	require.NotNil(t, rl.Primary, "the upgrade answer carries the rate-limit headers")
	assert.Equal(t, 300, rl.Primary.WindowMinutes)

	// Prewarm: created and completed, both with the response id.
	evs, err := wsTurn(ctx, t, conn, prewarmBody(t))
	require.NoError(t, err)
	assert.Equal(t, []string{wire.EventRateLimits, wire.EventResponseCreated, wire.EventResponseCompleted}, types(evs))
	prewarmID := completedResponse(t, evs)["id"].(string)
	assert.Equal(t, prewarmID, evs[1].M["response"].(map[string]any)["id"])
	assert.Empty(t, completedResponse(t, evs)["output"])
	rlEv := evs[0].M
	assert.Equal(t, "plus", rlEv["plan_type"])
	limits := rlEv["rate_limits"].(map[string]any)
	assert.Equal(t, true, limits["allowed"])
	assert.Equal(t, 300.0, limits["primary"].(map[string]any)["window_minutes"])
	assert.Equal(t, 10080.0, limits["secondary"].(map[string]any)["window_minutes"])

	// The turn chains on the prewarm with only the new items; the first
	// request of a turn gets the turn state as response.metadata.
	turn := body(t, []any{userMsg(`go [[sim:tool exec_command {"cmd":"echo ws"}]]`)}, map[string]any{"previous_response_id": prewarmID})
	evs, err = wsTurn(ctx, t, conn, turn)
	require.NoError(t, err)
	md := find(evs, wire.EventResponseMetadata)
	require.Len(t, md, 1)
	turnState := md[0].M["headers"].(map[string]any)[wire.HeaderTurnState].(string)
	require.NotEmpty(t, turnState)
	items := outputItems(evs)
	require.Len(t, items, 2)
	call := items[1]
	assert.Equal(t, "function_call", call["type"])
	turnID := completedResponse(t, evs)["id"].(string)

	// The tool follow-up: only the output, the turn state echoed in
	// client_metadata, no second metadata event.
	follow := body(t, []any{map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "ws-out"}},
		map[string]any{"previous_response_id": turnID, "client_metadata": map[string]any{wire.HeaderTurnState: turnState}})
	evs, err = wsTurn(ctx, t, conn, follow)
	require.NoError(t, err)
	assert.Empty(t, find(evs, wire.EventResponseMetadata), "turn state is sent once per turn")
	assert.Equal(t, "Tool results:\nws-out", answerText(evs))
	usage := completedResponse(t, evs)["usage"].(map[string]any)
	assert.Greater(t, usage["input_tokens"].(float64), 50.0, "a chained request counts the whole conversation")

	recs := upstream.Records(RecordFilter{Transport: TransportWS})
	require.Len(t, recs, 4)
	assert.Equal(t, RecordHandshake, recs[0].Kind)
	assert.Equal(t, http.StatusSwitchingProtocols, recs[0].Status)
	assert.Equal(t, wire.OpenAIBetaWebSockets, recs[0].OpenAIBeta)
	for _, r := range recs[1:] {
		assert.Equal(t, RecordMessage, r.Kind)
		assert.Equal(t, recs[0].ConnID, r.ConnID)
		assert.Equal(t, "a1", r.Account)
		assert.Equal(t, OutcomeCompleted, r.Outcome)
	}
	require.NotNil(t, recs[1].Generate)
	assert.False(t, *recs[1].Generate)
	assert.Equal(t, prewarmID, recs[2].PreviousResponseID)
	assert.Equal(t, turnState, recs[2].TurnStateSent)
	assert.Equal(t, turnState, recs[3].ClientTurnState)
	assert.Equal(t, []ToolOutput{{CallID: call["call_id"].(string), Output: "ws-out"}}, recs[3].ToolOutputs)
}

func TestPreviousResponseIDIsLocalToOneConnection(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	ctx := testCtx(t, 10*time.Second)
	c := clientFor(t, upstream, "a1")
	conn := c.mustDial(ctx)
	evs, err := wsTurn(ctx, t, conn, prompt(t, "hello"))
	require.NoError(t, err)
	id := completedResponse(t, evs)["id"].(string)

	chained := body(t, []any{userMsg("again")}, map[string]any{"previous_response_id": id})
	tests := []struct {
		name    string
		account string
		sameCon bool
		wantOK  bool
	}{
		{"same connection", "a1", true, true},
		{"new connection, same account", "a1", false, false},
		{"other account of the organisation", "a2", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cn := conn
			if !tt.sameCon {
				cn = clientFor(t, upstream, tt.account).mustDial(ctx)
			}
			evs, err := wsTurn(ctx, t, cn, chained)
			require.NoError(t, err)
			last := evs[len(evs)-1]
			if tt.wantOK {
				assert.Equal(t, wire.EventResponseCompleted, last.Type)
				return
			}
			ev, ok := wire.ParseErrorEvent(last.Data)
			require.True(t, ok, "%s", last.Data)
			assert.Equal(t, http.StatusBadRequest, ev.Status)
			assert.Equal(t, wire.CodePreviousResponseNotFound, ev.Error.Code)
			// The connection stays usable: Codex resends the full request.
			evs, err = wsTurn(ctx, t, cn, prompt(t, "full request"))
			require.NoError(t, err)
			assert.Equal(t, wire.EventResponseCompleted, evs[len(evs)-1].Type)
		})
	}
}

func TestWebSocketRejectsBadMessagesAndStaysOpen(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	ctx := testCtx(t, 10*time.Second)
	conn := clientFor(t, upstream, "k1").mustDial(ctx)

	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"response.cancel"}`)))
	evs, err := wsRead(ctx, conn)
	require.NoError(t, err)
	ev, ok := wire.ParseErrorEvent(evs[len(evs)-1].Data)
	require.True(t, ok)
	assert.Equal(t, http.StatusBadRequest, ev.Status)
	assert.Contains(t, ev.Error.Message, "response.cancel")

	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","input":`)))
	_, err = wsRead(ctx, conn)
	require.NoError(t, err)

	// Messages far past coder/websocket's 32 KiB default are read whole.
	big := prompt(t, "big "+strings.Repeat("x", 512<<10))
	evs, err = wsTurn(ctx, t, conn, big)
	require.NoError(t, err)
	assert.Equal(t, wire.EventResponseCompleted, evs[len(evs)-1].Type)
}

func TestGetWithoutUpgrade(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	resp := clientFor(t, upstream, "a1").do(context.Background(), http.MethodGet, upstream.CodexBaseURL()+"/responses", nil, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)
}

func TestWebSocketHandshakeAuthentication(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	ctx := testCtx(t, 5*time.Second)
	c := clientFor(t, upstream, "a1")
	c.token = "wrong"
	_, resp, err := c.dial(ctx)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	c = clientFor(t, upstream, "a1")
	c.headers.Set(wire.HeaderChatGPTAccountID, "cg-b1")
	_, resp, err = c.dial(ctx)
	require.Error(t, err)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)

	recs := upstream.Records(RecordFilter{Kind: RecordHandshake})
	require.Len(t, recs, 2)
	assert.Equal(t, OutcomeError, recs[0].Outcome)
}

func TestCompaction(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	ctx := testCtx(t, 10*time.Second)
	history := []any{devMsg("x"), userMsg("remember the blue door"), map[string]any{"type": "compaction_trigger"}}

	// Over HTTP.
	_, evs, err := clientFor(t, upstream, "a1").turn(body(t, history, nil))
	require.NoError(t, err)
	items := outputItems(evs)
	require.Len(t, items, 1, "exactly one output item")
	assert.Equal(t, "compaction", items[0]["type"])
	ct := items[0]["encrypted_content"].(string)
	plain, err := upstream.Decrypt("org-x", CipherCompaction, ct)
	require.NoError(t, err)
	assert.Contains(t, plain, "remember the blue door")
	assert.Len(t, completedResponse(t, evs)["output"], 1)

	// Over WebSocket, likewise.
	evs, err = wsTurn(ctx, t, clientFor(t, upstream, "a2").mustDial(ctx), body(t, history, nil))
	require.NoError(t, err)
	require.Len(t, outputItems(evs), 1)
	assert.Equal(t, "compaction", outputItems(evs)[0]["type"])

	// The compacted history continues on the same organisation only.
	next := body(t, []any{devMsg("x"), items[0], userMsg("and now?")}, nil)
	_, _, err = clientFor(t, upstream, "a2").turn(next)
	require.NoError(t, err)
	_, _, err = clientFor(t, upstream, "b1").turn(next)
	status, e := errorOf(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, wire.CodeInvalidEncryptedContent, e.Code)

	// The legacy compact route answers {"output":[...]} JSON.
	resp := clientFor(t, upstream, "k1").do(ctx, http.MethodPost, upstream.OpenAIBaseURL()+"/responses/compact",
		body(t, []any{devMsg("x"), userMsg("keep me")}, nil), nil)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Output []map[string]any `json:"output"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Len(t, out.Output, 2)
	assert.Equal(t, "message", out.Output[0]["type"])
	assert.Equal(t, "compaction", out.Output[1]["type"])
	_, err = upstream.Decrypt("org-x", CipherCompaction, out.Output[1]["encrypted_content"].(string))
	assert.NoError(t, err)
	recs := upstream.Records(RecordFilter{Route: RouteCompact})
	require.Len(t, recs, 1)
	assert.Equal(t, OutcomeCompleted, recs[0].Outcome)
}

// The events that stand for HTTP headers over WebSocket (codex.rate_limits,
// response.metadata) come with the answer's start: response.created follows
// them without the gap that paces the rest, as it leads an HTTP answer. Paced
// like tokens, they held it two gaps back.
func TestHeaderEventsAreNotPaced(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	ctx := testCtx(t, 20*time.Second)
	conn := clientFor(t, upstream, "a1").mustDial(ctx)
	var m map[string]any
	require.NoError(t, json.Unmarshal(prompt(t, "hello [[sim:gap 3s]]"), &m))
	m["type"] = wire.MessageResponseCreate
	msg, err := json.Marshal(m)
	require.NoError(t, err)
	sent := time.Now()
	require.NoError(t, conn.Write(ctx, websocket.MessageText, msg))
	var got []string
	for len(got) == 0 || got[len(got)-1] != wire.EventResponseCreated {
		_, data, err := conn.Read(ctx)
		require.NoError(t, err)
		got = append(got, decodeEvent(data).Type)
	}
	assert.Equal(t, []string{wire.EventRateLimits, wire.EventResponseMetadata, wire.EventResponseCreated}, got)
	assert.Less(t, time.Since(sent), 3*time.Second, "response.created came within one gap of the request")
}
