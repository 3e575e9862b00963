package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay/chat"
)

// The response object is the terminal event's, with the stream's output
// items when the terminal event lists none (the ChatGPT backend's).
func TestResponseCollector(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		file   string // a recorded stream of relay/chat/testdata
		id     string
		status string
		types  []string // the output items' types
	}{
		{"output in the completed event (sim)", "text.sse", "", "completed", []string{"reasoning", "message"}},
		{"output only in the items", "whole_items.sse", "resp_whole", "completed", []string{"reasoning", "message", "function_call"}},
		{"incomplete", "incomplete.sse", "resp_inc", "incomplete", []string{"message"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c responseCollector
			for _, ev := range recordedEvents(t, tc.file) {
				typ, _ := wire.EventType(ev)
				c.observe(typ, ev)
			}
			var got struct {
				ID     string `json:"id"`
				Object string `json:"object"`
				Status string `json:"status"`
				Output []struct {
					Type string `json:"type"`
				} `json:"output"`
				Usage json.RawMessage `json:"usage"`
			}
			require.NoError(t, json.Unmarshal(c.response(), &got))
			if tc.id != "" {
				assert.Equal(t, tc.id, got.ID)
			}
			assert.Equal(t, "response", got.Object)
			assert.Equal(t, tc.status, got.Status)
			var types []string
			for _, it := range got.Output {
				types = append(types, it.Type)
			}
			assert.Equal(t, tc.types, types)
			assert.NotEmpty(t, got.Usage)
		})
	}
}

func recordedEvents(t *testing.T, name string) [][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("chat", "testdata", name))
	require.NoError(t, err)
	defer f.Close()
	r := wire.NewSSEReader(f, 0, 0)
	var out [][]byte
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, bytes.Clone(ev.Data))
	}
}

// An OpenAI client reads every failure as {"error":{message,type,code,param}}
// with a plain message and a status, whatever the upstream sent.
func TestOpenAIFailure(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		f       *failure
		status  int
		message string
		code    any
		typ     string
	}{
		{"upstream error body", &failure{status: 429, body: []byte(`{"error":{"type":"usage_limit_reached","message":"limit","resets_at":1700000000}}`)},
			429, "limit", nil, "usage_limit_reached"},
		{"ChatGPT detail body", &failure{status: 400, body: []byte(`{"detail":"Unsupported parameter: temperature"}`)},
			400, "Unsupported parameter: temperature", nil, "invalid_request_error"},
		{"body of no known shape", &failure{status: 502, body: []byte(`<html>bad gateway</html>`)},
			502, "the upstream answered 502 Bad Gateway", nil, "server_error"},
		{"failed event before output", &failure{event: []byte(`{}`), err: wire.Error{Code: "rate_limit_exceeded", Message: "slow down"}},
			429, "slow down", "rate_limit_exceeded", "server_error"},
		{"relay failure", failUnreachable(), 502, "the upstream account could not be reached", "upstream_unreachable", "server_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status, e := openAIFailure(tc.f)
			assert.Equal(t, tc.status, status)
			var body map[string]map[string]any
			require.NoError(t, json.Unmarshal(openAIErrorJSON(e), &body))
			obj := body["error"]
			for _, k := range []string{"message", "type", "code", "param"} {
				assert.Contains(t, obj, k, "the OpenAI error shape has %q", k)
			}
			assert.Equal(t, tc.message, obj["message"])
			assert.Equal(t, tc.code, obj["code"])
			assert.Equal(t, tc.typ, obj["type"])
		})
	}
	assert.Equal(t, http.StatusServiceUnavailable, statusForError(wire.Error{Code: wire.CodeServerIsOverloaded}, 0))
	assert.Equal(t, http.StatusBadRequest, statusForError(wire.Error{Code: wire.CodeContextLengthExceeded}, 0))
	assert.Equal(t, http.StatusTeapot, statusForError(wire.Error{Code: wire.CodeContextLengthExceeded}, http.StatusTeapot))
}

// An upstream that answers a streaming request with the response object
// itself is read as the events that object stands for, by both kinds of
// chat client.
func TestDocumentEvents(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"id":"resp_doc","object":"response","status":"completed","output":[` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"from a document"}]},` +
		`{"type":"function_call","call_id":"call_d","name":"f","arguments":"{}"}]}`)
	evs := documentEvents(doc)
	require.Len(t, evs, 3)
	st := chat.NewStream(chat.Meta{ID: "chatcmpl-d", Model: "m"}, false)
	var text, finish string
	calls := 0
	for _, ev := range evs {
		typ, _ := wire.EventType(ev)
		for _, raw := range st.Event(typ, ev) {
			var c struct {
				Choices []struct {
					Delta struct {
						Content   string            `json:"content"`
						ToolCalls []json.RawMessage `json:"tool_calls"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal(raw, &c))
			for _, ch := range c.Choices {
				text += ch.Delta.Content
				calls += len(ch.Delta.ToolCalls)
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
		}
	}
	assert.Equal(t, "from a document", text)
	assert.Equal(t, 2, calls, "the call's name, then its arguments")
	assert.Equal(t, "tool_calls", finish)
	assert.True(t, st.Done())

	var col responseCollector
	for _, ev := range evs {
		typ, _ := wire.EventType(ev)
		col.observe(typ, ev)
	}
	assert.JSONEq(t, string(doc), string(col.response()))
}
