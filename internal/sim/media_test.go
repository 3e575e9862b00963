package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEmbeddings(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k, a := clientFor(t, s, "k1"), clientFor(t, s, "a1")
	req := jsonBody(t, map[string]any{"input": []string{"hello", "world"}, "model": "text-embedding-3-small", "dimensions": 8})
	resp, m, raw := k.call(http.MethodPost, "/embeddings", req, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	assert.Equal(t, "list", m["object"])
	assert.Equal(t, "text-embedding-3-small", m["model"])
	data := m["data"].([]any)
	require.Len(t, data, 2)
	first := data[0].(map[string]any)
	assert.Equal(t, "embedding", first["object"])
	assert.EqualValues(t, 0, first["index"])
	vec := first["embedding"].([]any)
	require.Len(t, vec, 8)
	var norm float64
	for _, v := range vec {
		norm += v.(float64) * v.(float64)
	}
	assert.InDelta(t, 1, norm, 1e-5, "a unit vector")
	assert.NotEqual(t, vec, data[1].(map[string]any)["embedding"])
	usage := m["usage"].(map[string]any)
	assert.EqualValues(t, 2, usage["prompt_tokens"])
	assert.Equal(t, usage["prompt_tokens"], usage["total_tokens"])

	// The same text gives the same vector, whatever the account; base64
	// is the same floats.
	_, m2, _ := a.call(http.MethodPost, "/embeddings", req, nil)
	assert.Equal(t, vec, m2["data"].([]any)[0].(map[string]any)["embedding"])
	_, m3, _ := k.call(http.MethodPost, "/embeddings", jsonBody(t, map[string]any{"input": "hello",
		"model": "text-embedding-3-small", "dimensions": 8, "encoding_format": "base64"}), nil)
	b, err := base64.StdEncoding.DecodeString(m3["data"].([]any)[0].(map[string]any)["embedding"].(string))
	require.NoError(t, err)
	require.Len(t, b, 32)
	for i, v := range vec {
		f := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		assert.InDelta(t, v.(float64), float64(f), 1e-6)
	}

	_, m4, _ := k.call(http.MethodPost, "/embeddings", jsonBody(t, map[string]any{"input": []int{1, 2, 3}, "model": "text-embedding-3-large"}), nil)
	assert.Len(t, m4["data"].([]any)[0].(map[string]any)["embedding"], 3072)
	assert.EqualValues(t, 3, m4["usage"].(map[string]any)["prompt_tokens"])

	resp, _, raw = k.call(http.MethodPost, "/embeddings", jsonBody(t, map[string]any{"model": "m"}), nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(raw), "'input'")
}

func TestAudioTranscriptions(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{MaxFileBytes: 4096})
	for _, id := range []string{"k1", "a1"} {
		c := clientFor(t, s, id)
		audio := strings.Repeat("a", 3000)
		b, h := form(t, map[string]string{"model": "gpt-4o-transcribe"}, [3]string{"file", "voice.wav", audio})
		resp, m, raw := c.call(http.MethodPost, "/audio/transcriptions", b, h)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		assert.Equal(t, map[string]any{"text": TranscriptionText("voice.wav", 3000)}, m)

		b, h = form(t, map[string]string{"model": "whisper-1", "response_format": "text"}, [3]string{"file", "v.mp3", "abc"})
		resp, _, raw = c.call(http.MethodPost, "/audio/transcriptions", b, h)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"))
		assert.Equal(t, TranscriptionText("v.mp3", 3)+"\n", string(raw))

		b, h = form(t, map[string]string{"model": "whisper-1"}, [3]string{"file", "big.wav", strings.Repeat("a", 4097)})
		resp, _, _ = c.call(http.MethodPost, "/audio/transcriptions", b, h)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		b, h = form(t, map[string]string{"model": "whisper-1"})
		resp, _, raw = c.call(http.MethodPost, "/audio/transcriptions", b, h)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(raw), "'file'")
	}
}

func TestAudioSpeech(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	r := k.do(testCtx(t, timeoutLong), http.MethodPost, k.base+"/audio/speech", jsonBody(t, map[string]any{
		"model": "gpt-4o-mini-tts", "input": "three words here", "voice": "alloy"}), nil)
	defer r.Body.Close()
	require.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, "audio/mpeg", r.Header.Get("Content-Type"))
	got, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	assert.Equal(t, SpeechAudio("three words here", "mp3"), got)
	assert.True(t, bytes.HasPrefix(got, []byte("ID3")))

	resp, _, raw := k.call(http.MethodPost, "/audio/speech", jsonBody(t, map[string]any{
		"model": "tts-1", "input": "hi", "voice": "alloy", "response_format": "wav"}), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "audio/wav", resp.Header.Get("Content-Type"))
	assert.Equal(t, "RIFF", string(raw[:4]))
	assert.Equal(t, "WAVE", string(raw[8:12]))

	resp, _, raw = k.call(http.MethodPost, "/audio/speech", jsonBody(t, map[string]any{"model": "tts-1", "input": "hi"}), nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(raw), "'voice'")

	// A cut speech answer ends early.
	_, err = s.AddFault(Fault{Kind: FaultCutStream, Route: RouteSpeech, Times: 1})
	require.NoError(t, err)
	r2 := k.do(testCtx(t, timeoutLong), http.MethodPost, k.base+"/audio/speech", jsonBody(t, map[string]any{
		"model": "tts-1", "input": "three words here", "voice": "alloy"}), nil)
	part, err := io.ReadAll(r2.Body)
	r2.Body.Close()
	assert.Error(t, err)
	assert.Less(t, len(part), len(got))
}

func TestMemoriesTraceSummarize(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, id := range []string{"a1", "k1"} {
		c := clientFor(t, s, id)
		resp, m, raw := c.call(http.MethodPost, "/memories/trace_summarize", jsonBody(t, map[string]any{
			"model": "gpt-5.4", "traces": []any{
				map[string]any{"id": "trace-1", "metadata": map[string]any{"source_path": "/tmp/t.json"}, "items": []any{map[string]any{"type": "message"}}},
				map[string]any{"id": "trace-2", "metadata": map[string]any{"source_path": "/tmp/u.json"}, "items": []any{}},
			}}), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		out := m["output"].([]any)
		require.Len(t, out, 2)
		first := out[0].(map[string]any)
		assert.Contains(t, first["trace_summary"], "trace-1 (1 items)")
		assert.Contains(t, first["memory_summary"], "trace-1")
		assert.Len(t, s.Records(RecordFilter{Account: id, Route: RouteMemories}), 1)
	}
}

func TestAnalyticsIsRecorded(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	a := clientFor(t, s, "a1")
	r := a.do(testCtx(t, timeoutLong), http.MethodPost, s.URL+"/backend-api/codex/analytics-events/events",
		jsonBody(t, map[string]any{"events": []any{map[string]any{"event_type": "codex_turn_event"}}}), nil)
	r.Body.Close()
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, 1, s.AnalyticsPosts())
	recs := s.Records(RecordFilter{Route: RouteAnalytics})
	require.Len(t, recs, 1)
	assert.Equal(t, "a1", recs[0].Account)
}
