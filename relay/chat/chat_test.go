package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestTranslate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		chat string
		want string // the Responses request
		req  Request
	}{
		{
			name: "system and user strings",
			chat: `{"model":"gpt-5.5-codex","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}`,
			want: `{"model":"gpt-5.5-codex","instructions":"Be brief.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hello."}]}],"store":false,"stream":true}`,
			req:  Request{Model: "gpt-5.5-codex"},
		},
		{
			name: "leading system and developer join, a later one stays in place",
			chat: `{"model":"m","messages":[{"role":"system","content":"A"},{"role":"developer","content":[{"type":"text","text":"B"}]},{"role":"user","content":"q"},{"role":"system","content":"C"}]}`,
			want: `{"model":"m","instructions":"A\n\nB","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"message","role":"developer","content":[{"type":"input_text","text":"C"}]}],"store":false,"stream":true}`,
			req:  Request{Model: "m"},
		},
		{
			name: "tool round trip",
			chat: `{"model":"m","messages":[
				{"role":"user","content":"weather?"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				{"role":"tool","tool_call_id":"call_1","content":"sunny"}],
				"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}],
				"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false}`,
			want: `{"model":"m","input":[
				{"type":"message","role":"user","content":[{"type":"input_text","text":"weather?"}]},
				{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				{"type":"function_call_output","call_id":"call_1","output":"sunny"}],
				"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}],
				"tool_choice":{"type":"function","name":"get_weather"},"parallel_tool_calls":false,"store":false,"stream":true}`,
			req: Request{Model: "m"},
		},
		{
			name: "assistant text and tool calls, tool output in parts",
			chat: `{"model":"m","messages":[{"role":"user","content":"go"},
				{"role":"assistant","content":"Looking.","tool_calls":[{"id":"c1","type":"function","function":{"name":"a","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"b","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
				{"role":"tool","tool_call_id":"c2","content":"three"}],"tool_choice":"required"}`,
			want: `{"model":"m","input":[
				{"type":"message","role":"user","content":[{"type":"input_text","text":"go"}]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},
				{"type":"function_call","call_id":"c1","name":"a","arguments":"{}"},
				{"type":"function_call","call_id":"c2","name":"b","arguments":"{}"},
				{"type":"function_call_output","call_id":"c1","output":"onetwo"},
				{"type":"function_call_output","call_id":"c2","output":"three"}],"tool_choice":"required","store":false,"stream":true}`,
			req: Request{Model: "m"},
		},
		{
			name: "images",
			chat: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"high"}}]}]}`,
			want: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"What is this?"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"auto"},{"type":"input_image","image_url":"https://example.com/cat.png","detail":"high"}]}],"store":false,"stream":true}`,
			req:  Request{Model: "m"},
		},
		{
			name: "reasoning effort, max_completion_tokens, stream options, cache key and user",
			chat: `{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"low","max_completion_tokens":256,"max_tokens":99,"stream":true,"stream_options":{"include_usage":true},"prompt_cache_key":"pck","user":"u-1","temperature":0.2,"stop":["x"],"seed":7}`,
			want: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"reasoning":{"effort":"low"},"max_output_tokens":256,"temperature":0.2,"prompt_cache_key":"pck","store":false,"stream":true}`,
			req:  Request{Model: "m", Stream: true, IncludeUsage: true, PromptCacheKey: "pck", User: "u-1"},
		},
		{
			name: "max_tokens when max_completion_tokens is absent",
			chat: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":99,"stream":false}`,
			want: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":99,"store":false,"stream":true}`,
			req:  Request{Model: "m"},
		},
		{
			name: "json schema response format and verbosity",
			chat: `{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object"},"strict":true}},"verbosity":"low"}`,
			want: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"text":{"format":{"type":"json_schema","name":"answer","schema":{"type":"object"},"strict":true},"verbosity":"low"},"store":false,"stream":true}`,
			req:  Request{Model: "m"},
		},
		{
			name: "html characters keep their bytes",
			chat: `{"model":"m","messages":[{"role":"user","content":"<a href=\"x\">&</a>"}]}`,
			want: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"<a href=\"x\">&</a>"}]}],"store":false,"stream":true}`,
			req:  Request{Model: "m"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, req, err := Translate([]byte(tc.chat))
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
			assert.Equal(t, tc.req, req)
			if strings.Contains(tc.chat, "<a") {
				assert.Contains(t, string(got), `<a href=\"x\">&</a>`)
			}
		})
	}
}

func TestTranslateRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, chat, param, message string
	}{
		{"no model", `{"messages":[{"role":"user","content":"hi"}]}`, "model", "you must provide a model parameter"},
		{"no messages", `{"model":"m"}`, "messages", "messages must hold at least one message"},
		{"messages of the wrong type", `{"model":"m","messages":"hi"}`, "messages", "invalid type for 'messages': expected an array, got string"},
		{"max tokens of the wrong type", `{"model":"m","messages":[],"max_tokens":"many"}`, "max_tokens", "invalid type for 'max_tokens': expected a number, got string"},
		{"broken JSON", `{"model":`, "", "the request body is not valid JSON"},
		{"not an object", `[1]`, "", "the request body must be a JSON object, not array"},
		{"several choices", `{"model":"m","n":2,"messages":[{"role":"user","content":"hi"}]}`, "n", "only one choice can be generated per request (n must be 1)"},
		{"unknown role", `{"model":"m","messages":[{"role":"robot","content":"hi"}]}`, "messages[0].role", `unknown message role "robot": use system, developer, user, assistant or tool`},
		{"function role", `{"model":"m","messages":[{"role":"function","name":"f","content":"x"}]}`, "messages[0].role", "the function role is not supported: send tool messages with a tool_call_id"},
		{"tool message without call id", `{"model":"m","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id", "a tool message needs the tool_call_id of the call it answers"},
		{"audio", `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}`, "messages[0].content[0]", "audio input is not supported"},
		{"image in a system message", `{"model":"m","messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0]", `this message takes text parts only, not "image_url"`},
		{"content of the wrong type", `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content", "messages[0].content must be a string or an array of content parts"},
		{"custom tool", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"custom","custom":{"name":"x"}}]}`, "tools[0]", "only function tools with a name are supported"},
		{"bad tool choice", `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`, "tool_choice", "tool_choice must be auto, none, required or a named function"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Translate([]byte(tc.chat))
			var ce *Error
			require.True(t, errors.As(err, &ce), "want a refusal, got %v", err)
			assert.Equal(t, tc.param, ce.Param)
			assert.Equal(t, tc.message, ce.Message)
			for _, goWords := range []string{"Go struct", "unmarshal", "chat.", "json:"} {
				assert.NotContains(t, ce.Message, goWords)
			}
		})
	}
}

// recorded reads the events of a recorded SSE stream in testdata (the sim's
// answers, and shapes other upstreams send).
func recorded(t *testing.T, name string) []wire.SSEEvent {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	require.NoError(t, err)
	defer f.Close()
	r := wire.NewSSEReader(f, 0, 0)
	var out []wire.SSEEvent
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		ev.Data = bytes.Clone(ev.Data)
		out = append(out, ev)
	}
}

// terminalResponse is the response object of a recorded stream's terminal
// event.
func terminalResponse(t *testing.T, name string) []byte {
	t.Helper()
	evs := recorded(t, name)
	var env struct {
		Response json.RawMessage `json:"response"`
	}
	require.NoError(t, json.Unmarshal(evs[len(evs)-1].Data, &env))
	return env.Response
}

type decodedChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			Refusal   *string `json:"refusal"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage       `json:"usage"`
	Error *ErrorObject `json:"error"`
}

// streamOutcome is what a client assembles from a chat stream.
type streamOutcome struct {
	role     string
	text     string
	calls    []FunctionCall
	callIDs  []string
	finish   string
	usage    *Usage
	errMsg   string
	model    string
	chunks   int
	ended    bool
	afterEnd int // chunks emitted after the stream said it was done
}

func runStream(t *testing.T, file string, includeUsage bool) streamOutcome {
	t.Helper()
	st := NewStream(Meta{ID: "chatcmpl-1", Created: 1700000000, Model: "asked"}, includeUsage)
	var out streamOutcome
	for _, ev := range recorded(t, file) {
		typ, _ := wire.EventType(ev.Data)
		chunks := st.Event(typ, ev.Data)
		if out.ended {
			out.afterEnd += len(chunks)
		}
		for _, raw := range chunks {
			var c decodedChunk
			require.NoError(t, json.Unmarshal(raw, &c), "%s", raw)
			out.chunks++
			assert.Equal(t, "chatcmpl-1", c.ID)
			assert.Equal(t, "chat.completion.chunk", c.Object)
			assert.Equal(t, int64(1700000000), c.Created)
			out.model = c.Model
			if out.chunks == 1 {
				require.Len(t, c.Choices, 1, "the first chunk carries the role")
				out.role = c.Choices[0].Delta.Role
			}
			if c.Usage != nil {
				out.usage = c.Usage
				assert.Empty(t, c.Choices, "the usage chunk has no choices")
			}
			if c.Error != nil {
				out.errMsg = c.Error.Message
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != nil {
					out.text += *ch.Delta.Content
				}
				for _, tc := range ch.Delta.ToolCalls {
					for len(out.calls) <= tc.Index {
						out.calls = append(out.calls, FunctionCall{})
						out.callIDs = append(out.callIDs, "")
					}
					if tc.ID != "" {
						out.callIDs[tc.Index] = tc.ID
						assert.Equal(t, "function", tc.Type)
					}
					out.calls[tc.Index].Name += tc.Function.Name
					out.calls[tc.Index].Arguments += tc.Function.Arguments
				}
				if ch.FinishReason != nil {
					out.finish = *ch.FinishReason
				}
			}
		}
		out.ended = st.Done()
	}
	return out
}

func TestStream(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		file         string
		includeUsage bool
		text         string
		calls        []FunctionCall
		finish       string
		usage        *Usage
		errMsg       string
		model        string
	}{
		{name: "text (sim)", file: "text.sse", text: "Simulated reply to: Say hello.", finish: "stop", model: "gpt-5.5-codex"},
		{name: "text with usage (sim)", file: "text.sse", includeUsage: true, text: "Simulated reply to: Say hello.", finish: "stop", model: "gpt-5.5-codex",
			usage: &Usage{PromptTokens: 3, CompletionTokens: 21, TotalTokens: 24, CompletionTokensDetails: outputDetail{ReasoningTokens: 16}}},
		{name: "tool call (sim)", file: "tool_call.sse", calls: []FunctionCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}, finish: "tool_calls", model: "gpt-5.5-codex"},
		{name: "whole items, no deltas", file: "whole_items.sse", includeUsage: true, text: "Checking the weather.",
			calls: []FunctionCall{{Name: "get_weather", Arguments: `{"city":"Oslo"}`}}, finish: "tool_calls", model: "gpt-5.5-codex",
			usage: &Usage{PromptTokens: 120, CompletionTokens: 30, TotalTokens: 150, PromptTokensDetails: promptDetail{CachedTokens: 64}, CompletionTokensDetails: outputDetail{ReasoningTokens: 12}}},
		{name: "incomplete at max_output_tokens", file: "incomplete.sse", text: "Once upon a time", finish: "length", model: "gpt-5.1-codex"},
		{name: "failed after output", file: "failed_after_output.sse", text: "Partial", errMsg: "The server had an error while processing your request.", model: "gpt-5.5-codex"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := runStream(t, tc.file, tc.includeUsage)
			assert.Equal(t, "assistant", got.role, "the first chunk carries the role")
			assert.Equal(t, tc.text, got.text)
			assert.Equal(t, tc.finish, got.finish)
			assert.Equal(t, tc.errMsg, got.errMsg)
			assert.Equal(t, tc.model, got.model, "chunks name the model the upstream served")
			assert.True(t, got.ended, "the terminal event ends the stream")
			assert.Zero(t, got.afterEnd)
			if tc.calls == nil {
				assert.Empty(t, got.calls)
			} else {
				assert.Equal(t, tc.calls, got.calls)
				for _, id := range got.callIDs {
					assert.True(t, strings.HasPrefix(id, "call_"), "tool call id %q", id)
				}
			}
			if tc.usage == nil {
				assert.Nil(t, got.usage)
			} else {
				require.NotNil(t, got.usage)
				assert.Equal(t, *tc.usage, *got.usage)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	t.Parallel()
	meta := Meta{ID: "chatcmpl-x", Created: 1700000001, Model: "asked"}
	cases := []struct {
		name      string
		response  []byte
		content   *string
		toolCalls []ToolCall
		finish    string
		usage     *Usage
		model     string
	}{
		{name: "text (sim)", response: terminalResponse(t, "text.sse"), content: ptr("Simulated reply to: Say hello."), finish: "stop", model: "gpt-5.5-codex",
			usage: &Usage{PromptTokens: 3, CompletionTokens: 21, TotalTokens: 24, CompletionTokensDetails: outputDetail{ReasoningTokens: 16}}},
		{name: "tool call (sim)", response: terminalResponse(t, "tool_call.sse"), finish: "tool_calls", model: "gpt-5.5-codex",
			usage:     &Usage{PromptTokens: 11, CompletionTokens: 21, TotalTokens: 32, CompletionTokensDetails: outputDetail{ReasoningTokens: 16}},
			toolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
		{name: "incomplete", response: terminalResponse(t, "incomplete.sse"), content: ptr("Once upon a time"), finish: "length", model: "gpt-5.1-codex",
			usage: &Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14}},
		{name: "content filter", response: []byte(`{"status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}`), content: ptr(""), finish: "content_filter", model: "asked"},
		{name: "text and a call", response: []byte(`{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"On it."}]},{"type":"function_call","call_id":"call_9","name":"f","arguments":"{}"}]}`),
			content: ptr("On it."), toolCalls: []ToolCall{{ID: "call_9", Type: "function", Function: FunctionCall{Name: "f", Arguments: "{}"}}}, finish: "tool_calls", model: "asked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := Completion(meta, tc.response)
			require.NoError(t, err)
			var got struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Created int64  `json:"created"`
				Model   string `json:"model"`
				Choices []struct {
					Index   int `json:"index"`
					Message struct {
						Role      string     `json:"role"`
						Content   *string    `json:"content"`
						ToolCalls []ToolCall `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage *Usage `json:"usage"`
			}
			require.NoError(t, json.Unmarshal(b, &got))
			assert.Equal(t, "chatcmpl-x", got.ID)
			assert.Equal(t, "chat.completion", got.Object)
			assert.Equal(t, int64(1700000001), got.Created)
			assert.Equal(t, tc.model, got.Model)
			require.Len(t, got.Choices, 1)
			c := got.Choices[0]
			assert.Equal(t, "assistant", c.Message.Role)
			assert.Equal(t, tc.content, c.Message.Content)
			assert.Equal(t, tc.finish, c.FinishReason)
			if tc.toolCalls != nil && tc.toolCalls[0].ID == "" {
				// Sim call ids are random: compare the rest.
				require.Len(t, c.Message.ToolCalls, len(tc.toolCalls))
				assert.True(t, strings.HasPrefix(c.Message.ToolCalls[0].ID, "call_"))
				c.Message.ToolCalls[0].ID = ""
			}
			assert.Equal(t, tc.toolCalls, c.Message.ToolCalls)
			assert.Equal(t, tc.usage, got.Usage)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Every chat request either translates into a streaming Responses request
// or is refused with a plain *Error.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"x"}]}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}],"response_format":{"type":"json_object"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, _, err := Translate(body)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("not a refusal: %v", err)
			}
			return
		}
		var req struct {
			Stream bool `json:"stream"`
			Store  bool `json:"store"`
		}
		if json.Unmarshal(out, &req) != nil || !req.Stream || req.Store {
			t.Fatalf("not a streaming Responses request: %s", out)
		}
	})
}

// chatMembers names every member chatRequest reads, so none can be sent
// twice or as a variant of its name.
func TestChatMembersAreTheRequestFields(t *testing.T) {
	var names []string
	rt := reflect.TypeOf(chatRequest{})
	for i := range rt.NumField() {
		names = append(names, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
	}
	assert.ElementsMatch(t, names, chatMembers)
}
