package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

func (h *harness) raw(method, path string, hdr http.Header, body []byte) (int, http.Header, string) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, bytes.NewReader(body))
	require.NoError(h.t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// Goal routes follow the payload's threadId to the account serving that
// thread, not the headers' thread.
func TestGoalRoutesFollowPayloadThread(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	// Place the root on a1 and the child on a2 through pins.
	_, err := h.store.Pin(ctx, store.BindRawThread, rootT, h.ids["a1"], "pin")
	require.NoError(t, err)
	_, err = h.store.Pin(ctx, store.BindRawThread, childT, h.ids["a2"], "pin")
	require.NoError(t, err)

	hdr := http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}, "Content-Type": {"application/json"}}
	code, _, body := h.raw("POST", "/backend-api/codex/thread/goal/set", hdr, []byte(`{"threadId":"`+childT+`","objective":"ship it"}`))
	require.Equal(t, http.StatusOK, code, body)
	_, onA2 := h.sim.Goal("a2", childT)
	_, onA1 := h.sim.Goal("a1", childT)
	assert.True(t, onA2, "the goal went to the child's account")
	assert.False(t, onA1)

	code, _, body = h.raw("POST", "/backend-api/codex/thread/goal/get", hdr, []byte(`{"threadId":"`+childT+`"}`))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "ship it")

	code, _, body = h.raw("POST", "/backend-api/codex/thread/goal/set", hdr, []byte(`{"threadId":`))
	assert.Equal(t, http.StatusBadRequest, code, body)
	code, _, _ = h.raw("POST", "/backend-api/codex/thread/goal/frob", hdr, []byte(`{}`))
	assert.Equal(t, http.StatusNotFound, code)
}

func TestModelsAndCompact(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	code, _, body := h.raw("GET", "/backend-api/codex/models?client_version=0.169.0", nil, nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "gpt-5.5-codex")

	req := responseRequest("compact this")
	b, _ := json.Marshal(req)
	code, _, body = h.raw("POST", "/backend-api/codex/responses/compact", http.Header{"Content-Type": {"application/json"}, "Thread-Id": {rootT}}, b)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"compaction"`, "the legacy compact route answers with a compaction item")
}

// Compressed bodies are decompressed; broken ones get a clear 400 and
// nothing goes upstream.
func TestZstdBodies(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	b, _ := json.Marshal(responseRequest("compressed hello"))
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	z := enc.EncodeAll(b, nil)
	enc.Close()
	hdr := http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"zstd"}, "Thread-Id": {rootT}}
	code, _, body := h.raw("POST", "/backend-api/codex/responses", hdr, z)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "response.completed")
	recs := h.responseRecords(rootT)
	require.Len(t, recs, 1)
	assert.Empty(t, recs[0].ContentEncoding, "the relay sends the upstream a plain body")

	code, _, body = h.raw("POST", "/backend-api/codex/responses", hdr, []byte("definitely not zstd"))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, `"error"`)
	assert.Len(t, h.responseRecords(rootT), 1, "nothing more went upstream")
}

// Bad input gets a clear error in the Responses error shape and loses nothing.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	cases := []struct {
		name   string
		hdr    http.Header
		body   []byte
		status int
		code   string
	}{
		{"malformed json", nil, []byte(`{"model":`), 400, "invalid_json"},
		{"not an object", nil, []byte(`[1,2,3]`), 400, "invalid_json"},
		{"binary", nil, []byte{0, 1, 2, 0xff}, 400, "invalid_json"},
		{"overlong thread id", http.Header{"Thread-Id": {strings.Repeat("x", 500)}}, []byte(`{"input":[]}`), 400, "invalid_header"},
		{"unknown encoding", http.Header{"Content-Encoding": {"br"}}, []byte(`{}`), 415, "unsupported_encoding"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := h.raw("POST", "/backend-api/codex/responses", tc.hdr, tc.body)
			assert.Equal(t, tc.status, code, body)
			assert.Equal(t, "application/json", hdr.Get("Content-Type"))
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			assert.Equal(t, tc.code, e.Error.Code)
			assert.NotEmpty(t, e.Error.Message)
		})
	}
	assert.Empty(t, h.responseRecords(""), "no bad request reached the upstream")

	// Over WebSocket: a binary frame, garbage and an unknown message type get
	// error events, and the connection keeps serving.
	c := h.dialWS(sessionS, rootT)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	expectError := func(typ websocket.MessageType, msg []byte, code string) {
		require.NoError(t, c.conn.Write(ctx, typ, msg))
		_, data, err := c.conn.Read(ctx)
		require.NoError(t, err)
		var ev struct {
			Type   string                `json:"type"`
			Status int                   `json:"status"`
			Error  struct{ Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(data, &ev))
		assert.Equal(t, "error", ev.Type)
		assert.Equal(t, 400, ev.Status)
		assert.Equal(t, code, ev.Error.Code)
	}
	expectError(websocket.MessageBinary, []byte{1, 2, 3}, "unsupported_frame")
	expectError(websocket.MessageText, []byte(`{"type":`), "invalid_json")
	// A message type the relay does not know is no request: it gets no
	// error, and passes to the upstream when a lane is open (none yet).
	require.NoError(t, c.conn.Write(ctx, websocket.MessageText, []byte(`{"type":"session.update"}`)))
	events := c.turn(responseRequest("still here?"))
	for _, ev := range events {
		assert.NotEqual(t, "error", ev["type"], "the unknown message got no error: %v", ev)
	}
	typ, id := lastEvent(events)
	assert.Equal(t, "response.completed", typ)

	// With the lane open, an acknowledgement passes through as it came,
	// unanswered, and the connection keeps serving.
	ack := []byte(`{"type":"response.processed","response_id":"` + id + `", "x_new_field": 1}`)
	require.NoError(t, c.conn.Write(ctx, websocket.MessageText, ack))
	require.Eventually(t, func() bool {
		for _, r := range h.sim.Records(sim.RecordFilter{Kind: sim.RecordMessage}) {
			if r.Outcome == sim.OutcomeOK && r.Model == "" && r.Status == http.StatusOK {
				return true
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "the upstream got the acknowledgement")
	typ, _ = lastEvent(c.turn(responseRequest("and after the acknowledgement?")))
	assert.Equal(t, "response.completed", typ)
}

// With no client key defined, loopback clients are served without one; once
// a key exists it is required, a revoked key is refused at once, and a key's
// account scope and model list hold.
func TestClientKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-b"))
	ctx := context.Background()
	b, _ := json.Marshal(responseRequest("hi"))
	post := func(key string, thread string, body []byte) (int, string) {
		hdr := http.Header{"Content-Type": {"application/json"}, "Thread-Id": {thread}}
		if key != "" {
			hdr.Set("Authorization", "Bearer "+key)
		}
		code, _, resp := h.raw("POST", "/v1/responses", hdr, body)
		return code, resp
	}
	code, body := post("", rootT, b)
	require.Equal(t, http.StatusOK, code, "loopback without keys: %s", body)

	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "scoped", ScopeAccounts: []string{h.ids["a2"]}, Models: []string{"gpt-5.5-codex"}})
	require.NoError(t, err)
	code, body = post("", rootT, b)
	assert.Equal(t, http.StatusUnauthorized, code, "a key is required once one exists: %s", body)
	code, body = post("crk_not_a_real_key_at_all_000000000", rootT, b)
	assert.Equal(t, http.StatusUnauthorized, code, body)

	code, body = post(secret, childT, b)
	require.Equal(t, http.StatusOK, code, body)
	recs := h.responseRecords(childT)
	require.Len(t, recs, 1)
	assert.Equal(t, "a2", recs[0].Account, "the key's scope holds")
	assert.False(t, recs[0].ClientKey, "the client key is not forwarded")

	other := responseRequest("hi")
	other["model"] = "gpt-9"
	ob, _ := json.Marshal(other)
	code, body = post(secret, childT, ob)
	assert.Equal(t, http.StatusForbidden, code, body)
	delete(other, "model")
	ob, _ = json.Marshal(other)
	code, body = post(secret, childT, ob)
	assert.Equal(t, http.StatusForbidden, code, "a key with a model list must name its model: %s", body)
	assert.Contains(t, body, "model_not_allowed")
	assert.Len(t, h.responseRecords(childT), 1, "neither went upstream")

	_, err = h.store.RevokeClientKey(ctx, k.ID)
	require.NoError(t, err)
	code, body = post(secret, childT, b)
	assert.Equal(t, http.StatusUnauthorized, code, "revoked keys are refused at once: %s", body)
	code, body = post("", rootT, b)
	assert.Equal(t, http.StatusUnauthorized, code, "revoking the last key never re-opens keyless mode: %s", body)
}
