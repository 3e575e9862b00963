package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// realtimeTurn sends a session.update and a response.create over a
// realtime WebSocket and reads until response.done, returning the event
// types seen.
func realtimeTurn(t *testing.T, ctx context.Context, conn *websocket.Conn) []string {
	t.Helper()
	var types []string
	read := func() map[string]any {
		_, msg, err := conn.Read(ctx)
		require.NoError(t, err)
		var ev map[string]any
		require.NoError(t, json.Unmarshal(msg, &ev), "%s", msg)
		types = append(types, ev["type"].(string))
		return ev
	}
	require.Equal(t, "session.created", read()["type"])
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"session.update","session":{"instructions":"be brief"}}`)))
	require.Equal(t, "session.updated", read()["type"])
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}}`)))
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create"}`)))
	for read()["type"] != "response.done" {
	}
	return types
}

// A realtime session is relayed frame by frame to one account, through
// both prefixes' spellings of the route, and logged with its usage; a
// WebRTC call's sideband session reaches the account that took the call,
// and a call the relay never saw is refused before any account is asked.
func TestRealtimeThroughTheRelay(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2"), openAIAccount("k3")}, Logger: testLogger(t)}, nil2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(h.srv.URL, "http")

	conn, _, err := websocket.Dial(ctx, ws+"/v1/realtime?model=gpt-realtime-1.5", nil)
	require.NoError(t, err)
	types := realtimeTurn(t, ctx, conn)
	assert.Contains(t, types, "response.created")
	require.NoError(t, conn.Close(websocket.StatusNormalClosure, ""))
	hs := h.sim.Records(sim.RecordFilter{Route: sim.RouteRealtime})
	require.NotEmpty(t, hs)
	for _, r := range hs {
		assert.Equal(t, hs[0].Account, r.Account, "the session stays on one account")
		assert.False(t, r.ClientKey)
	}
	row := waitRoute(t, h.store, "realtime", "")
	assert.Equal(t, h.ids[hs[0].Account], row.AccountID)
	assert.Positive(t, row.TotalTokens, "response.done's usage is the session's")

	// A WebRTC call, then its sideband session by call_id.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	require.NoError(t, mw.WriteField("sdp", "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"))
	require.NoError(t, mw.WriteField("session", `{"type":"realtime","model":"gpt-realtime-1.5"}`))
	require.NoError(t, mw.Close())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/realtime/calls", &body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	loc := resp.Header.Get("Location")
	callID := loc[strings.LastIndexByte(loc, '/')+1:]
	require.NotEmpty(t, callID)
	for range 3 {
		side, _, err := websocket.Dial(ctx, ws+"/v1/realtime?call_id="+callID, nil)
		require.NoError(t, err, "the sideband reached the call's account")
		_, msg, err := side.Read(ctx)
		require.NoError(t, err)
		assert.Contains(t, string(msg), "session.created")
		require.NoError(t, side.Close(websocket.StatusNormalClosure, ""))
	}

	before := len(h.sim.Records(sim.RecordFilter{}))
	_, resp, err = websocket.Dial(ctx, ws+"/v1/realtime?call_id=rtc_nevermadehere", nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Len(t, h.sim.Records(sim.RecordFilter{}), before, "no account was asked")

	owner := ""
	for _, a := range []string{"k1", "k2", "k3"} {
		for _, id := range h.sim.RealtimeCalls(a) {
			if id == callID {
				owner = a
			}
		}
	}
	require.NotEmpty(t, owner)
	_, err = h.store.SetAccountStatus(context.Background(), h.ids[owner], store.StatusPaused, "", time.Time{})
	require.NoError(t, err)
	_, resp, err = websocket.Dial(ctx, ws+"/v1/realtime?call_id="+callID, nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "the call's account is paused")
}

// A realtime session is admitted like a Responses one: a key is required
// once keys exist, the ?model= asked must be one the key may use, and the
// key never goes upstream.
func TestRealtimeNeedsAKey(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)}, nil2)
	_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "voice", Models: []string{"gpt-realtime-1.5"}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(h.srv.URL, "http")
	_, resp, err := websocket.Dial(ctx, ws+"/v1/realtime?model=gpt-realtime-1.5", nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no key")
	hdr := http.Header{"Authorization": {"Bearer " + key}}
	_, resp, err = websocket.Dial(ctx, ws+"/v1/realtime?model=gpt-4o-realtime", &websocket.DialOptions{HTTPHeader: hdr})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a model the key may not use")
	conn, _, err := websocket.Dial(ctx, ws+"/v1/realtime?model=gpt-realtime-1.5", &websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(t, err)
	realtimeTurn(t, ctx, conn)
	for _, r := range h.sim.Records(sim.RecordFilter{Route: sim.RouteRealtime}) {
		assert.False(t, r.ClientKey, "the client key never goes upstream")
	}
	conn.CloseNow()
}

// The controls of a Responses session hold for a realtime one: a revoked
// key ends it at its next client message (policy violation, nothing more
// goes upstream), and a drain closes it with 1012 between responses.
func TestRealtimeSessionEndsOnRevokeAndDrain(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)}, nil2)
	k, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "voice"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/v1/realtime?model=gpt-realtime-1.5"
	hdr := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}}

	conn, _, err := websocket.Dial(ctx, ws, hdr)
	require.NoError(t, err)
	realtimeTurn(t, ctx, conn)
	before := len(h.sim.Records(sim.RecordFilter{Route: sim.RouteRealtime}))
	_, err = h.store.RevokeClientKey(context.Background(), k.ID)
	require.NoError(t, err)
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create"}`)))
	_, _, err = conn.Read(ctx)
	assert.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "%v", err)
	assert.Len(t, h.sim.Records(sim.RecordFilter{Route: sim.RouteRealtime}), before, "the message after the revocation never went upstream")

	_, key2, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "voice2"})
	require.NoError(t, err)
	conn, _, err = websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key2}}})
	require.NoError(t, err)
	realtimeTurn(t, ctx, conn)
	h.relay.Drain()
	_, _, err = conn.Read(ctx)
	assert.Equal(t, websocket.StatusServiceRestart, websocket.CloseStatus(err), "%v", err)
}
