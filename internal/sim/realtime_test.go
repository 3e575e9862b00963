package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dialRealtime dials {p}/realtime with query q.
func (c *client) dialRealtime(ctx context.Context, q string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	for k, v := range c.headers {
		h[k] = v
	}
	h.Set("Authorization", "Bearer "+c.token)
	url := "ws" + strings.TrimPrefix(c.base, "http") + "/realtime" + q
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h, HTTPClient: c.hc})
	if conn != nil {
		c.t.Cleanup(func() { _ = conn.CloseNow() })
	}
	return conn, resp, err
}

func rtSend(ctx context.Context, t *testing.T, conn *websocket.Conn, ev map[string]any) {
	t.Helper()
	require.NoError(t, conn.Write(ctx, websocket.MessageText, jsonBody(t, ev)))
}

func rtRead(ctx context.Context, t *testing.T, conn *websocket.Conn) map[string]any {
	t.Helper()
	_, data, err := conn.Read(ctx)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	return m
}

func TestRealtimeWebSocket(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, id := range []string{"k1", "a1"} {
		ctx := testCtx(t, timeoutLong)
		c := clientFor(t, s, id)
		conn, _, err := c.dialRealtime(ctx, "?model=gpt-realtime")
		require.NoError(t, err)
		created := rtRead(ctx, t, conn)
		assert.Equal(t, "session.created", created["type"])
		assert.NotEmpty(t, created["event_id"])
		assert.Equal(t, "gpt-realtime", created["session"].(map[string]any)["model"])

		rtSend(ctx, t, conn, map[string]any{"type": "session.update", "session": map[string]any{"instructions": "be kind"}})
		upd := rtRead(ctx, t, conn)
		assert.Equal(t, "session.updated", upd["type"])
		assert.Equal(t, "be kind", upd["session"].(map[string]any)["instructions"])

		rtSend(ctx, t, conn, map[string]any{"type": "conversation.item.create", "item": map[string]any{
			"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "hi there"}}}})
		item := rtRead(ctx, t, conn)
		assert.Equal(t, "conversation.item.created", item["type"])
		assert.NotEmpty(t, item["item"].(map[string]any)["id"])

		rtSend(ctx, t, conn, map[string]any{"type": "input_audio_buffer.append", "audio": "AAAA"})
		rtSend(ctx, t, conn, map[string]any{"type": "input_audio_buffer.commit"})
		assert.Equal(t, "input_audio_buffer.committed", rtRead(ctx, t, conn)["type"], "append has no answer")

		rtSend(ctx, t, conn, map[string]any{"type": "bogus.event", "event_id": "evt_1"})
		bad := rtRead(ctx, t, conn)
		assert.Equal(t, "error", bad["type"])
		assert.Equal(t, "evt_1", bad["error"].(map[string]any)["event_id"])

		rtSend(ctx, t, conn, map[string]any{"type": "response.create"})
		var got []string
		var text strings.Builder
		for {
			ev := rtRead(ctx, t, conn)
			got = append(got, ev["type"].(string))
			if ev["type"] == "response.output_text.delta" {
				text.WriteString(ev["delta"].(string))
			}
			if ev["type"] == "response.done" {
				break
			}
		}
		assert.Equal(t, "response.created", got[0])
		assert.Equal(t, 3, strings.Count(strings.Join(got, " "), "response.output_text.delta"))
		assert.Equal(t, "Simulated realtime reply to: hi there", text.String())
		require.NoError(t, conn.Close(websocket.StatusNormalClosure, ""))

		recs := s.Records(RecordFilter{Account: id, Route: RouteRealtime, Kind: RecordMessage})
		var msgTypes []string
		for _, r := range recs {
			msgTypes = append(msgTypes, r.MessageType)
		}
		assert.Equal(t, []string{"session.update", "conversation.item.create", "input_audio_buffer.append",
			"input_audio_buffer.commit", "bogus.event", "response.create"}, msgTypes)
	}
}

func TestRealtimeAudioTranscriptDeltas(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	ctx := testCtx(t, timeoutLong)
	conn, _, err := clientFor(t, s, "k1").dialRealtime(ctx, "")
	require.NoError(t, err)
	rtRead(ctx, t, conn)
	rtSend(ctx, t, conn, map[string]any{"type": "session.update", "session": map[string]any{"output_modalities": []string{"audio"}}})
	rtRead(ctx, t, conn)
	rtSend(ctx, t, conn, map[string]any{"type": "response.create"})
	n := 0
	for {
		ev := rtRead(ctx, t, conn)
		if ev["type"] == "response.output_audio_transcript.delta" {
			n++
		}
		if ev["type"] == "response.done" {
			break
		}
	}
	assert.Equal(t, 3, n)
}

func TestRealtimeCallsAndSideband(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, id := range []string{"k1", "a1"} {
		c := clientFor(t, s, id)
		resp, _, raw := c.call(http.MethodPost, "/realtime/calls", []byte("v=offer\r\n"), http.Header{"Content-Type": {"application/sdp"}})
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", raw)
		assert.Equal(t, "application/sdp", resp.Header.Get("Content-Type"))
		assert.True(t, strings.HasPrefix(string(raw), "v=0\r\n"))
		loc := resp.Header.Get("Location")
		require.True(t, strings.HasPrefix(loc, "/v1/realtime/calls/rtc_"), loc)
		callID := loc[strings.LastIndex(loc, "/")+1:]
		assert.Equal(t, []string{callID}, s.RealtimeCalls(id))

		// The backend's JSON shape and the API's multipart shape.
		resp, _, _ = c.call(http.MethodPost, "/realtime/calls", jsonBody(t, map[string]any{"sdp": "v=offer\r\n", "session": map[string]any{}}), nil)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		b, h := form(t, map[string]string{"sdp": "v=offer\r\n", "session": "{}"})
		resp, _, _ = c.call(http.MethodPost, "/realtime/calls", b, h)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		resp, _, _ = c.call(http.MethodPost, "/realtime/calls", []byte("nope"), http.Header{"Content-Type": {"application/sdp"}})
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

		ctx := testCtx(t, timeoutLong)
		conn, _, err := c.dialRealtime(ctx, "?call_id="+callID)
		require.NoError(t, err)
		assert.Equal(t, "session.created", rtRead(ctx, t, conn)["type"])
		other := "a2"
		if id == "a1" {
			other = "b1"
		}
		_, r, err := clientFor(t, s, other).dialRealtime(ctx, "?call_id="+callID)
		require.Error(t, err, "another account's call")
		require.NotNil(t, r)
		assert.Equal(t, http.StatusNotFound, r.StatusCode)
		hs := s.Records(RecordFilter{Account: other, Route: RouteRealtime, Kind: RecordHandshake})
		require.Len(t, hs, 1)
		assert.Equal(t, callID, hs[0].ObjectID)
	}
}

func TestRealtimeFaults(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	ctx := testCtx(t, timeoutLong)
	_, err := s.AddFault(Fault{Kind: FaultRateLimit, Route: RouteRealtime, Times: 1})
	require.NoError(t, err)
	_, r, err := k.dialRealtime(ctx, "")
	require.Error(t, err)
	assert.Equal(t, http.StatusTooManyRequests, r.StatusCode)

	_, err = s.AddFault(Fault{Kind: FaultRefuseWebSocket, Route: RouteRealtime, Times: 1})
	require.NoError(t, err)
	_, r, err = k.dialRealtime(ctx, "")
	require.Error(t, err)
	assert.Equal(t, http.StatusUpgradeRequired, r.StatusCode)

	_, err = s.AddFault(Fault{Kind: FaultCutStream, Route: RouteRealtime, Events: 2, Times: 1})
	require.NoError(t, err)
	conn, _, err := k.dialRealtime(ctx, "")
	require.NoError(t, err)
	rtRead(ctx, t, conn)
	rtSend(ctx, t, conn, map[string]any{"type": "response.create"})
	assert.Equal(t, "response.created", rtRead(ctx, t, conn)["type"])
	_, _, err = conn.Read(ctx)
	assert.Error(t, err, "cut after two events")
	var ce websocket.CloseError
	assert.NotErrorAs(t, err, &ce, "no close frame")
}
