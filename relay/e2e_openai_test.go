package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// apiAccount is an OpenAI API-key account of the sim in organisation org.
func apiAccount(id, org string) sim.Account {
	return sim.Account{ID: id, Kind: sim.KindOpenAI, AccessToken: "sk-" + id, Organization: org}
}

// accountKinds are the two kinds of account every OpenAI client is served
// over: a ChatGPT subscription (its backend only streams) and an API key.
var accountKinds = []struct {
	name    string
	account sim.Account
}{
	{"chatgpt", simAccount("c1", "org-a")},
	{"openai", apiAccount("k1", "org-a")},
}

// openAIError is the error body every OpenAI client reads.
type openAIError struct {
	Error map[string]any `json:"error"`
}

// requireOpenAIError checks an error answer: the OpenAI shape (message,
// type, code, param), a plain message, and returns the error object.
func requireOpenAIError(t *testing.T, status int, wantStatus int, hdr http.Header, body string) map[string]any {
	t.Helper()
	require.Equal(t, wantStatus, status, body)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	var e openAIError
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	for _, k := range []string{"message", "type", "code", "param"} {
		assert.Contains(t, e.Error, k, "the OpenAI error shape has %q: %s", k, body)
	}
	msg, _ := e.Error["message"].(string)
	assert.NotEmpty(t, msg)
	for _, goWords := range []string{"Go struct", "unmarshal", "json:", "[]", "*"} {
		assert.NotContains(t, msg, goWords, "a plain message")
	}
	return e.Error
}

func postJSON(h *harness, path string, hdr http.Header, body string) (int, http.Header, string) {
	h.t.Helper()
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr.Set("Content-Type", "application/json")
	return h.raw(http.MethodPost, path, hdr, []byte(body))
}

// A Responses request without stream: true gets the JSON response object
// on both kinds of account, assembled from a stream the upstream was asked
// for; the shorthand inputs work.
func TestResponsesDocument(t *testing.T) {
	t.Parallel()
	for _, kind := range accountKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind.account)
			cases := []struct{ name, body, answer string }{
				{"string input", `{"model":"gpt-5.5-codex","input":"Say hello."}`, "Simulated reply to: Say hello."},
				{"string content, stream false", `{"model":"gpt-5.5-codex","stream":false,"input":[{"role":"user","content":"short form"}]}`, "Simulated reply to: short form"},
			}
			for _, tc := range cases {
				code, hdr, body := postJSON(h, "/v1/responses", nil, tc.body)
				require.Equal(t, http.StatusOK, code, body)
				assert.Equal(t, "application/json", hdr.Get("Content-Type"), tc.name)
				var resp struct {
					ID     string `json:"id"`
					Object string `json:"object"`
					Status string `json:"status"`
					Output []struct {
						Type    string `json:"type"`
						Content []struct {
							Type, Text string
						} `json:"content"`
					} `json:"output"`
					Usage struct {
						InputTokens  int `json:"input_tokens"`
						OutputTokens int `json:"output_tokens"`
					} `json:"usage"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
				assert.True(t, strings.HasPrefix(resp.ID, "resp_"), tc.name)
				assert.Equal(t, "response", resp.Object)
				assert.Equal(t, "completed", resp.Status)
				var text string
				for _, it := range resp.Output {
					for _, c := range it.Content {
						text += c.Text
					}
				}
				assert.Equal(t, tc.answer, text, tc.name)
				assert.Positive(t, resp.Usage.OutputTokens)
			}
			recs := h.responseRecords("")
			require.Len(t, recs, 2)
			for _, rec := range recs {
				assert.True(t, rec.Stream, "the upstream is asked for a stream")
				assert.Equal(t, kind.account.ID, rec.Account)
			}

			// A streaming request still streams.
			code, hdr, body := postJSON(h, "/v1/responses", nil, `{"model":"gpt-5.5-codex","stream":true,"input":"stream it"}`)
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "text/event-stream", hdr.Get("Content-Type"))
			assert.Contains(t, body, "response.completed")

			// Malformed bodies get plain messages in the OpenAI shape.
			code, hdr, body = postJSON(h, "/v1/responses", nil, `{"model":"gpt-5.5-codex","input":5}`)
			e := requireOpenAIError(t, code, http.StatusBadRequest, hdr, body)
			assert.Equal(t, "invalid_json", e["code"])
			assert.Contains(t, e["message"], "input is neither a string nor an array")
		})
	}
}

// A failure before any output is the OpenAI error with its status; a
// stream that breaks after output is an error too, never half an object.
func TestResponsesDocumentFailures(t *testing.T) {
	t.Parallel()
	for _, kind := range accountKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind.account)
			_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Times: 1})
			require.NoError(t, err)
			code, hdr, body := postJSON(h, "/v1/responses", nil, `{"model":"gpt-5.5-codex","input":"limited"}`)
			e := requireOpenAIError(t, code, http.StatusTooManyRequests, hdr, body)
			assert.Equal(t, "usage_limit_reached", e["type"])

			h = newHarness(t, kind.account)
			_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultServerError, InStream: true, Events: 6, Times: 1})
			require.NoError(t, err)
			code, hdr, body = postJSON(h, "/v1/responses", nil, `{"model":"gpt-5.5-codex","input":"breaks after output [[sim:events 8]]"}`)
			require.GreaterOrEqual(t, code, 500, body)
			requireOpenAIError(t, code, code, hdr, body)
			recs := h.responseRecords("")
			require.Len(t, recs, 1, "output was sent: nothing is retried")
			assert.Equal(t, sim.FaultServerError, recs[0].Fault)
		})
	}
}

// GET /v1/models answers the OpenAI list whatever the account behind it,
// seen through the key's allow-list and aliases; the Codex route keeps
// Codex's shape.
func TestModelList(t *testing.T) {
	t.Parallel()
	for _, kind := range accountKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind.account)
			list := func(hdr http.Header) []string {
				t.Helper()
				code, rh, body := h.raw(http.MethodGet, "/v1/models", hdr, nil)
				require.Equal(t, http.StatusOK, code, body)
				assert.Equal(t, "application/json", rh.Get("Content-Type"))
				var l struct {
					Object string `json:"object"`
					Data   []struct {
						ID      string `json:"id"`
						Object  string `json:"object"`
						Created *int64 `json:"created"`
						OwnedBy string `json:"owned_by"`
					} `json:"data"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &l), body)
				assert.Equal(t, "list", l.Object)
				var ids []string
				for _, m := range l.Data {
					assert.Equal(t, "model", m.Object)
					assert.NotNil(t, m.Created)
					assert.NotEmpty(t, m.OwnedBy)
					ids = append(ids, m.ID)
				}
				return ids
			}
			all := list(nil)
			assert.Contains(t, all, "gpt-5.5-codex")
			assert.Greater(t, len(all), 1)

			ctx := context.Background()
			_, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "narrow", Models: []string{"gpt-5.5-codex", "gpt-unlisted"},
				Policy: store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.5-codex"}}})
			require.NoError(t, err)
			assert.Equal(t, []string{"gpt-5.5-codex", "gpt-unlisted", "fast"}, list(http.Header{"Authorization": {"Bearer " + secret}}))
			_, wide, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "wide"})
			require.NoError(t, err)
			assert.Equal(t, all, list(http.Header{"Authorization": {"Bearer " + wide}}))
		})
	}
	h := newHarness(t, simAccount("c1", "org-a"))
	code, _, body := h.raw(http.MethodGet, "/backend-api/codex/models?client_version=0.169.0", nil, nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"models"`)
	assert.NotContains(t, body, `"object":"list"`)
}

// chatCompletion is the part of a chat completion the tests read.
type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		CompletionTokens    int64 `json:"completion_tokens"`
		TotalTokens         int64 `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens *int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		CompletionTokensDetails struct {
			ReasoningTokens int64 `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
}

func (h *harness) chat(hdr http.Header, body string) chatCompletion {
	h.t.Helper()
	code, rh, raw := postJSON(h, "/v1/chat/completions", hdr, body)
	require.Equal(h.t, http.StatusOK, code, raw)
	assert.Equal(h.t, "application/json", rh.Get("Content-Type"))
	var c chatCompletion
	require.NoError(h.t, json.Unmarshal([]byte(raw), &c), raw)
	require.Len(h.t, c.Choices, 1, raw)
	return c
}

// chatChunk is one decoded chunk of a chat stream.
type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	Error map[string]any `json:"error"`
}

// chatStream posts a streaming chat request and returns its chunks, and
// whether data: [DONE] ended the stream.
func (h *harness) chatStream(hdr http.Header, body string) ([]chatChunk, bool) {
	h.t.Helper()
	code, rh, raw := postJSON(h, "/v1/chat/completions", hdr, body)
	require.Equal(h.t, http.StatusOK, code, raw)
	assert.Equal(h.t, "text/event-stream", rh.Get("Content-Type"))
	var chunks []chatChunk
	done := false
	for _, line := range strings.Split(raw, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			assert.False(h.t, strings.HasPrefix(line, "event:"), "chat chunks come as bare data lines")
			continue
		}
		require.False(h.t, done, "nothing after [DONE]: %s", raw)
		if data == "[DONE]" {
			done = true
			continue
		}
		var c chatChunk
		require.NoError(h.t, json.Unmarshal([]byte(data), &c), data)
		assert.Equal(h.t, "chat.completion.chunk", c.Object)
		chunks = append(chunks, c)
	}
	return chunks, done
}

func TestChatCompletions(t *testing.T) {
	t.Parallel()
	for _, kind := range accountKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind.account)

			// JSON.
			c := h.chat(nil, `{"model":"gpt-5.5-codex","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}`)
			assert.True(t, strings.HasPrefix(c.ID, "chatcmpl-"), c.ID)
			assert.Equal(t, "chat.completion", c.Object)
			assert.InDelta(t, time.Now().Unix(), c.Created, 60)
			assert.Equal(t, "gpt-5.5-codex", c.Model)
			assert.Equal(t, "assistant", c.Choices[0].Message.Role)
			require.NotNil(t, c.Choices[0].Message.Content)
			assert.Equal(t, "Simulated reply to: Say hello.", *c.Choices[0].Message.Content)
			assert.Equal(t, "stop", c.Choices[0].FinishReason)
			assert.Positive(t, c.Usage.PromptTokens)
			assert.Positive(t, c.Usage.CompletionTokens)
			assert.Equal(t, c.Usage.PromptTokens+c.Usage.CompletionTokens, c.Usage.TotalTokens)
			assert.NotNil(t, c.Usage.PromptTokensDetails.CachedTokens)
			assert.Positive(t, c.Usage.CompletionTokensDetails.ReasoningTokens)

			// Stream, with usage.
			chunks, done := h.chatStream(nil, `{"model":"gpt-5.5-codex","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Stream please. [[sim:events 5]]"}]}`)
			require.True(t, done, "the stream ends with data: [DONE]")
			require.GreaterOrEqual(t, len(chunks), 4)
			require.Len(t, chunks[0].Choices, 1)
			assert.Equal(t, "assistant", chunks[0].Choices[0].Delta.Role, "the first chunk carries the role")
			var text string
			deltas := 0
			for _, ch := range chunks {
				assert.Equal(t, chunks[0].ID, ch.ID, "one id for the whole stream")
				for _, choice := range ch.Choices {
					if choice.Delta.Content != nil && *choice.Delta.Content != "" {
						text += *choice.Delta.Content
						deltas++
					}
				}
			}
			assert.Equal(t, "Simulated reply to: Stream please.", text)
			assert.GreaterOrEqual(t, deltas, 5, "text arrives in deltas")
			last, usage := chunks[len(chunks)-2], chunks[len(chunks)-1]
			require.Len(t, last.Choices, 1)
			require.NotNil(t, last.Choices[0].FinishReason)
			assert.Equal(t, "stop", *last.Choices[0].FinishReason)
			assert.Empty(t, usage.Choices)
			require.NotNil(t, usage.Usage, "include_usage adds a usage chunk")
			assert.Positive(t, usage.Usage.TotalTokens)

			// Without include_usage, no usage chunk.
			chunks, done = h.chatStream(nil, `{"model":"gpt-5.5-codex","stream":true,"messages":[{"role":"user","content":"no usage"}]}`)
			require.True(t, done)
			for _, ch := range chunks {
				assert.Nil(t, ch.Usage)
			}
			end := chunks[len(chunks)-1]
			require.Len(t, end.Choices, 1)
			require.NotNil(t, end.Choices[0].FinishReason)

			for _, rec := range h.responseRecords("") {
				assert.True(t, rec.Stream, "the upstream is asked for a stream")
				assert.Equal(t, []string{"message"}, rec.InputTypes)
			}
		})
	}
}

// A tool round trip over Chat Completions: the model's function call comes
// back as tool_calls (JSON and streamed), and the tool's result, sent as a
// tool message, reaches the upstream as a function_call_output.
func TestChatToolRoundTrip(t *testing.T) {
	t.Parallel()
	for _, kind := range accountKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, kind.account)
			tools := `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
			ask := `{"role":"user","content":"Weather in Paris? [[sim:tool get_weather {\"city\":\"Paris\"}]]"}`
			c := h.chat(nil, `{"model":"gpt-5.5-codex",`+tools+`,"messages":[`+ask+`]}`)
			msg := c.Choices[0].Message
			assert.Equal(t, "tool_calls", c.Choices[0].FinishReason)
			require.Len(t, msg.ToolCalls, 1)
			call := msg.ToolCalls[0]
			assert.True(t, strings.HasPrefix(call.ID, "call_"), call.ID)
			assert.Equal(t, "function", call.Type)
			assert.Equal(t, "get_weather", call.Function.Name)
			assert.JSONEq(t, `{"city":"Paris"}`, call.Function.Arguments)

			// Streamed: the call's index, id and name, then its arguments.
			chunks, done := h.chatStream(nil, `{"model":"gpt-5.5-codex","stream":true,`+tools+`,"messages":[`+ask+`]}`)
			require.True(t, done)
			var id, name, args, finish string
			for _, ch := range chunks {
				for _, choice := range ch.Choices {
					for _, tc := range choice.Delta.ToolCalls {
						assert.Equal(t, 0, tc.Index)
						if tc.ID != "" {
							id = tc.ID
						}
						name += tc.Function.Name
						args += tc.Function.Arguments
					}
					if choice.FinishReason != nil {
						finish = *choice.FinishReason
					}
				}
			}
			assert.True(t, strings.HasPrefix(id, "call_"), id)
			assert.Equal(t, "get_weather", name)
			assert.JSONEq(t, `{"city":"Paris"}`, args)
			assert.Equal(t, "tool_calls", finish)

			// The result goes back.
			assistant, err := json.Marshal(map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": call.ID, "type": "function", "function": map[string]any{"name": call.Function.Name, "arguments": call.Function.Arguments}}}})
			require.NoError(t, err)
			c = h.chat(nil, `{"model":"gpt-5.5-codex",`+tools+`,"messages":[`+ask+`,`+string(assistant)+
				`,{"role":"tool","tool_call_id":"`+call.ID+`","content":"sunny, 24 degrees"}]}`)
			require.NotNil(t, c.Choices[0].Message.Content)
			assert.Equal(t, "Tool results:\nsunny, 24 degrees", *c.Choices[0].Message.Content)
			assert.Equal(t, "stop", c.Choices[0].FinishReason)
			recs := h.responseRecords("")
			require.Len(t, recs, 3)
			followUp := recs[2]
			assert.Equal(t, []string{"message", "function_call", "function_call_output"}, followUp.InputTypes)
			require.Len(t, followUp.ToolOutputs, 1)
			assert.Equal(t, call.ID, followUp.ToolOutputs[0].CallID)
		})
	}
}

// Chat clients get every failure in the OpenAI shape: refused requests,
// upstream failures before output with their status, and, once chunks
// were sent, a last chunk carrying the error before [DONE].
func TestChatFailures(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("c1", "org-a"))
	cases := []struct {
		name, body, param, message string
	}{
		{"no messages", `{"model":"gpt-5.5-codex","messages":[]}`, "messages", "messages must hold at least one message"},
		{"messages of the wrong type", `{"model":"gpt-5.5-codex","messages":"hi"}`, "messages", "invalid type for 'messages': expected an array, got string"},
		{"broken JSON", `{"model":`, "", "the request body is not valid JSON"},
	}
	for _, tc := range cases {
		code, hdr, body := postJSON(h, "/v1/chat/completions", nil, tc.body)
		e := requireOpenAIError(t, code, http.StatusBadRequest, hdr, body)
		assert.Equal(t, tc.message, e["message"], tc.name)
		if tc.param != "" {
			assert.Equal(t, tc.param, e["param"], tc.name)
		}
	}
	assert.Empty(t, h.responseRecords(""), "no refused request went upstream")

	code, _, _ := h.raw(http.MethodPost, "/backend-api/codex/chat/completions", http.Header{"Content-Type": {"application/json"}}, []byte(`{}`))
	assert.Equal(t, http.StatusNotFound, code, "chat completions live on the /v1 route")

	// Before output: the upstream's status, as an HTTP error.
	for _, stream := range []string{"false", "true"} {
		h := newHarness(t, simAccount("c1", "org-a"))
		_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultUsageLimit, Times: 1})
		require.NoError(t, err)
		code, hdr, body := postJSON(h, "/v1/chat/completions", nil, `{"model":"gpt-5.5-codex","stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`)
		e := requireOpenAIError(t, code, http.StatusTooManyRequests, hdr, body)
		assert.Equal(t, "usage_limit_reached", e["type"])
	}

	// After output: a last chunk with the error, then [DONE].
	_, err := h.sim.AddFault(sim.Fault{Kind: sim.FaultServerError, InStream: true, Events: 6, Times: 1})
	require.NoError(t, err)
	chunks, done := h.chatStream(nil, `{"model":"gpt-5.5-codex","stream":true,"messages":[{"role":"user","content":"breaks [[sim:events 8]]"}]}`)
	require.True(t, done, "the stream still ends with [DONE]")
	require.NotEmpty(t, chunks)
	assert.Equal(t, "assistant", chunks[0].Choices[0].Delta.Role)
	last := chunks[len(chunks)-1]
	require.NotNil(t, last.Error, "the last chunk carries the error")
	for _, k := range []string{"message", "type", "code", "param"} {
		assert.Contains(t, last.Error, k)
	}
	assert.Empty(t, last.Choices)

	// A stream cut after output: the same.
	_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultCutStream, Events: 6, Times: 1})
	require.NoError(t, err)
	chunks, done = h.chatStream(nil, `{"model":"gpt-5.5-codex","stream":true,"messages":[{"role":"user","content":"cut [[sim:events 8]]"}]}`)
	require.True(t, done)
	require.NotNil(t, chunks[len(chunks)-1].Error)
}

// Every rule of the relay applies to chat clients: key scopes and models,
// budgets, usage records, and failover before any output.
func TestChatUnderTheRelaysRules(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("c1", "org-a"), simAccount("c2", "org-a"))
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "chat", Models: []string{"gpt-5.5-codex"},
		Policy: store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.5-codex"}},
		Limits: []budget.Limit{{Metric: budget.Requests, Window: budget.Minute, Max: 2}}})
	require.NoError(t, err)
	auth := func() http.Header { return http.Header{"Authorization": {"Bearer " + secret}} }

	code, hdr, body := postJSON(h, "/v1/chat/completions", nil, `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"no key"}]}`)
	requireOpenAIError(t, code, http.StatusUnauthorized, hdr, body)
	code, hdr, body = postJSON(h, "/v1/chat/completions", auth(), `{"model":"gpt-other","messages":[{"role":"user","content":"not allowed"}]}`)
	e := requireOpenAIError(t, code, http.StatusForbidden, hdr, body)
	assert.Equal(t, "model_not_allowed", e["code"])

	// An account failing before output is failed over, unseen.
	_, err = h.sim.AddFault(sim.Fault{Kind: sim.FaultServerError, Status: 503, Times: 1})
	require.NoError(t, err)
	c := h.chat(auth(), `{"model":"fast","messages":[{"role":"user","content":"first"}],"user":"alice"}`)
	assert.Equal(t, "Simulated reply to: first", *c.Choices[0].Message.Content)
	recs := h.responseRecords("")
	require.Len(t, recs, 2, "the first account failed, the second answered")
	assert.NotEqual(t, recs[0].Account, recs[1].Account)
	assert.Equal(t, "gpt-5.5-codex", recs[1].Model, "the key's alias resolved")

	h.chat(auth(), `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"second"}],"user":"alice"}`)
	code, hdr, body = postJSON(h, "/v1/chat/completions", auth(), `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"third"}]}`)
	e = requireOpenAIError(t, code, http.StatusTooManyRequests, hdr, body)
	assert.Equal(t, "usage_limit_reached", e["type"])
	assert.Equal(t, "requests/minute", hdr.Get("X-Codex-Relay-Limit"))

	// Usage records: the request log holds the chat requests with their
	// tokens, under the key, placed by the user as one thread.
	var rows []store.RequestRecord
	require.Eventually(t, func() bool {
		rows, _, err = h.store.Requests(ctx, store.RequestFilter{ThreadID: "alice"})
		require.NoError(t, err)
		return len(rows) == 2
	}, time.Minute, 20*time.Millisecond)
	for _, row := range rows {
		assert.Equal(t, k.ID, row.ClientKeyID)
		assert.Equal(t, "/v1/chat/completions", row.Path)
		assert.Equal(t, http.StatusOK, row.Status)
		assert.Positive(t, row.TotalTokens)
		assert.Equal(t, rows[0].ThreadKey, row.ThreadKey)
		assert.NotEmpty(t, row.ThreadKey)
	}
	assert.Equal(t, rows[0].AccountID, rows[1].AccountID, "one thread, one account")
}

// A chat client is placed by its identity headers, else its
// prompt_cache_key, else its user; with none each request stands alone.
func TestChatIdentity(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("c1", "org-a"))
	ctx := context.Background()
	h.chat(http.Header{"Thread-Id": {rootT}}, `{"model":"gpt-5.5-codex","prompt_cache_key":"pck-1","messages":[{"role":"user","content":"by header"}]}`)
	h.chat(nil, `{"model":"gpt-5.5-codex","prompt_cache_key":"pck-1","user":"bob","messages":[{"role":"user","content":"by cache key"}]}`)
	h.chat(nil, `{"model":"gpt-5.5-codex","user":"bob","messages":[{"role":"user","content":"by user"}]}`)
	h.chat(nil, `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"alone"}]}`)
	var rows []store.RequestRecord
	require.Eventually(t, func() bool {
		var err error
		rows, _, err = h.store.Requests(ctx, store.RequestFilter{})
		require.NoError(t, err)
		return len(rows) == 4
	}, time.Minute, 20*time.Millisecond)
	byThread := map[string]store.RequestRecord{}
	for _, r := range rows {
		byThread[r.ThreadID] = r
	}
	require.Contains(t, byThread, rootT)
	require.Contains(t, byThread, "pck-1")
	require.Contains(t, byThread, "bob")
	require.Contains(t, byThread, "")
	assert.Empty(t, byThread[""].ThreadKey, "a request with no identity stands alone")
	keys := map[string]bool{}
	for _, th := range []string{rootT, "pck-1", "bob"} {
		assert.NotEmpty(t, byThread[th].ThreadKey)
		keys[byThread[th].ThreadKey] = true
	}
	assert.Len(t, keys, 3, "each identity is its own thread")
	recs := h.responseRecords("")
	require.Len(t, recs, 4)
	assert.Equal(t, "pck-1", recs[1].PromptCacheKey, "prompt_cache_key is forwarded")
}
