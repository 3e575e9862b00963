package continuity

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func boolp(b bool) *bool { return &b }

func TestRequestFields(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		body    string
		want    Fields
		wantErr string
	}{
		{
			name: "codex websocket follow-up",
			body: `{"type":"response.create","model":"gpt-5.5-codex","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c1","output":"ok"}],"stream":true,"prompt_cache_key":"sess-1","unknown":{"input":"nested"}}`,
			want: Fields{Model: "gpt-5.5-codex", PreviousResponseID: "resp_1", Stream: true, PromptCacheKey: "sess-1",
				Input: items(raw(`{"type":"function_call_output","call_id":"c1","output":"ok"}`))},
		},
		{
			name: "stored and background",
			body: `{"model":"m","store":true,"background":true}`,
			want: Fields{Model: "m", Store: true, Background: true},
		},
		{
			name: "store false, background absent",
			body: `{"store":false}`,
			want: Fields{},
		},
		{
			name:    "background twice, read differently by relay and upstream",
			body:    `{"background":false,"background":true}`,
			wantErr: "background",
		},
		{
			name: "prewarm",
			body: `{"model":"m","generate":false,"input":[]}`,
			want: Fields{Model: "m", Generate: boolp(false), Input: items()},
		},
		{
			name: "generate true, whitespace kept inside items",
			body: " {\n \"generate\" : true , \"input\" : [ {\"type\": \"message\"} , 7 ]\n} ",
			want: Fields{Generate: boolp(true), Input: items(raw(`{"type": "message"}`), raw(`7`))},
		},
		{
			name: "nulls are absent",
			body: `{"model":null,"previous_response_id":null,"conversation":null,"generate":null,"stream":null,"input":null,"prompt_cache_key":null}`,
			want: Fields{},
		},
		{
			name: "no input",
			body: `{"model":"m"}`,
			want: Fields{Model: "m"},
		},
		{
			name: "string input becomes a user message",
			body: `{"input":"hi \"there\"\n"}`,
			want: Fields{InputString: true, Input: items(raw(`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi \"there\"\n"}]}`))},
		},
		{
			name: "conversation id",
			body: `{"conversation":"conv_1","input":[]}`,
			want: Fields{Conversation: true, Input: items()},
		},
		{
			name: "conversation object",
			body: `{"conversation":{"id":"conv_1"}}`,
			want: Fields{Conversation: true},
		},
		{name: "a repeated decided member", body: `{"model":"a","input":[1],"model":"b","input":[2]}`, wantErr: `member "model" appears more than once`},
		{name: "a decided member with escapes", body: `{"previous_response\u005fid":"resp_\u0031","\u0069nput":[]}`,
			wantErr: `member "previous_response\\u005fid" stands for "previous_response_id"`},
		{name: "a variant of a decided member", body: `{"Previous_Response_ID":"resp_1","INPUT":[1]}`,
			wantErr: `member "Previous_Response_ID" stands for "previous_response_id"`},
		{name: "a Unicode fold of a decided member", body: `{"ſtream":true}`, wantErr: `member "ſtream" stands for "stream"`},
		{name: "a repeated effort", body: `{"reasoning":{"effort":"low","effort":"high"}}`, wantErr: `member "reasoning.effort" appears more than once`},
		{name: "a variant of effort", body: `{"reasoning":{"Effort":"high"}}`, wantErr: `member "Effort" stands for "reasoning.effort"`},
		{name: "a repeated turn state", body: `{"client_metadata":{"x-codex-turn-state":"a","x-codex-turn-state":"b"}}`,
			wantErr: `member "client_metadata.x-codex-turn-state" appears more than once`},
		{
			name: "other members may repeat, vary and use escapes",
			body: `{"tools":[],"tools":[1],"Instructions":"x","\u0069nstructions":"y","reasoning":{"summary":"a","summary":"b"},"client_metadata":{"k":1,"k":2},"model":"m"}`,
			want: Fields{Model: "m"},
		},
		{name: "malformed JSON", body: `{"input":[}`, wantErr: "invalid JSON"},
		{name: "trailing garbage", body: `{"input":[]} x`, wantErr: "invalid JSON"},
		{name: "empty body", body: ``, wantErr: "invalid JSON"},
		{name: "not an object", body: `[{"input":[]}]`, wantErr: "not a JSON object"},
		{name: "model not a string", body: `{"model":5}`, wantErr: "model is not a string"},
		{name: "previous id not a string", body: `{"previous_response_id":{"id":"r"}}`, wantErr: "previous_response_id is not a string"},
		{name: "generate not a boolean", body: `{"generate":"false"}`, wantErr: "generate is not a boolean"},
		{name: "stream not a boolean", body: `{"stream":1}`, wantErr: "stream is not a boolean"},
		{name: "input a number", body: `{"input":5}`, wantErr: "input is neither"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := RequestFields([]byte(tc.body))
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, strs(tc.want.Input), strs(got.Input))
			got.Input, tc.want.Input = nil, nil
			assert.Equal(t, tc.want, got)
		})
	}
}

// The items RequestFields returns do not alias the body.
func TestRequestFieldsCopiesInput(t *testing.T) {
	t.Parallel()
	body := []byte(`{"input":[{"type":"message"}]}`)
	f, err := RequestFields(body)
	require.NoError(t, err)
	copy(body, bytes32(' ', len(body)))
	assert.Equal(t, `{"type":"message"}`, string(f.Input[0]))
	assert.Equal(t, len(f.Input[0]), cap(f.Input[0]), "an item cannot grow into its neighbour")
}

func TestWithFullInput(t *testing.T) {
	t.Parallel()
	a := raw(`{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]}`)
	b := raw(`{"type":"reasoning","x_future":{"k":[1,2]},"encrypted_content":"c"}`)
	cases := []struct {
		name    string
		body    string
		input   []json.RawMessage
		want    string
		wantErr string
	}{
		{
			name:  "replace input, drop previous_response_id, keep the rest in order",
			body:  `{"type":"response.create","model":"m","x_unknown":{"a":[1,2.50e3,null]},"previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c","output":"o"}],"stream":true,"include":["reasoning.encrypted_content"]}`,
			input: items(a, b),
			want:  `{"type":"response.create","model":"m","x_unknown":{"a":[1,2.50e3,null]},"input":[` + string(a) + `,` + string(b) + `],"stream":true,"include":["reasoning.encrypted_content"]}`,
		},
		{
			name:  "whitespace kept",
			body:  "{ \"model\" : \"m\" ,\n \"previous_response_id\" : \"r\" ,\n \"input\" : [ ] }\n",
			input: items(a),
			want:  "{ \"model\" : \"m\" ,\n \"input\" : [" + string(a) + "] }\n",
		},
		{
			name:  "previous_response_id first",
			body:  `{"previous_response_id":"r","input":[],"model":"m"}`,
			input: items(a),
			want:  `{"input":[` + string(a) + `],"model":"m"}`,
		},
		{
			name:  "previous_response_id last",
			body:  `{"input":[],"previous_response_id":"r"}`,
			input: items(a),
			want:  `{"input":[` + string(a) + `]}`,
		},
		{
			name:  "nested previous_response_id untouched",
			body:  `{"metadata":{"previous_response_id":"x"},"previous_response_id":"r","input":[]}`,
			input: items(a),
			want:  `{"metadata":{"previous_response_id":"x"},"input":[` + string(a) + `]}`,
		},
		{
			name:  "string input replaced by the array",
			body:  `{"model":"m","input":"hi"}`,
			input: items(a),
			want:  `{"model":"m","input":[` + string(a) + `]}`,
		},
		{
			name:  "missing input appended",
			body:  `{"model":"m","previous_response_id":"r"}`,
			input: items(a),
			want:  `{"model":"m","input":[` + string(a) + `]}`,
		},
		{
			name:  "empty object",
			body:  `{}`,
			input: items(a),
			want:  `{"input":[` + string(a) + `]}`,
		},
		{
			name:  "only previous_response_id",
			body:  ` { "previous_response_id":"r" } `,
			input: items(),
			want:  ` { "input":[] } `,
		},
		{
			name:  "repeated input keeps the first position",
			body:  `{"input":[1],"model":"m","input":[2]}`,
			input: items(a),
			want:  `{"input":[` + string(a) + `],"model":"m"}`,
		},
		{
			name:  "escaped keys",
			body:  `{"previous_response\u005fid":"r","\u0069nput":[]}`,
			input: items(a),
			want:  `{"\u0069nput":[` + string(a) + `]}`,
		},
		{
			name:  "keys match exactly",
			body:  `{"Input":[],"input":[],"Previous_response_id":"r"}`,
			input: items(a),
			want:  `{"Input":[],"input":[` + string(a) + `],"Previous_response_id":"r"}`,
		},
		{
			name:  "nil input is an empty array",
			body:  `{"input":[1]}`,
			input: nil,
			want:  `{"input":[]}`,
		},
		{name: "malformed body", body: `{"input":`, input: items(a), wantErr: "invalid JSON"},
		{name: "body not an object", body: `"input"`, input: items(a), wantErr: "not a JSON object"},
		{name: "item not JSON", body: `{}`, input: items(raw(`{"type":`)), wantErr: "input item 0"},
		{name: "empty item", body: `{}`, input: items(a, raw(``)), wantErr: "input item 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := []byte(tc.body)
			got, err := WithFullInput(body, tc.input)
			assert.Equal(t, tc.body, string(body), "the body is not modified")
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
}

// The relay's rebuild: read a WebSocket follow-up, resolve it from the
// cache, write the full request. A string input is rebuilt as its message.
func TestRebuildRoundTrip(t *testing.T) {
	t.Parallel()
	c := New(Options{})
	first := []byte(`{"model":"m","input":"list the files","stream":true,"x":1}`)
	f, err := RequestFields(first)
	require.NoError(t, err)
	require.True(t, f.InputString)
	out := msg("assistant", "a.go")
	c.Commit(rootKey, Turn{ResponseID: "resp_1", Input: f.Input, Output: items(out)})

	next := []byte(`{"model":"m","previous_response_id":"resp_1","input":[{"type":"message","role":"user","content":"and b?"}],"stream":true,"x":1}`)
	f2, err := RequestFields(next)
	require.NoError(t, err)
	full, err := c.Resolve(rootKey, f2.PreviousResponseID, f2.Input)
	require.NoError(t, err)
	rebuilt, err := WithFullInput(next, full)
	require.NoError(t, err)
	assert.Equal(t, `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"list the files"}]},`+string(out)+`,{"type":"message","role":"user","content":"and b?"}],"stream":true,"x":1}`, string(rebuilt))
	f3, err := RequestFields(rebuilt)
	require.NoError(t, err)
	assert.True(t, SelfContained(f3))
}

func TestSelfContained(t *testing.T) {
	t.Parallel()
	u := msg("user", "hi")
	cases := []struct {
		name string
		f    Fields
		want bool
	}{
		{name: "plain messages", f: Fields{Input: items(msg("developer", "d"), u)}, want: true},
		{name: "empty", f: Fields{}, want: true},
		{name: "previous_response_id", f: Fields{PreviousResponseID: "resp_1", Input: items(u)}},
		{name: "conversation", f: Fields{Conversation: true, Input: items(u)}},
		{name: "call and its output", f: Fields{Input: items(u, funcCall("c1", "{}"), funcOutput("c1", "ok"))}, want: true},
		{name: "unanswered call is fine", f: Fields{Input: items(u, funcCall("c1", "{}"))}, want: true},
		{name: "output without its call", f: Fields{Input: items(u, funcOutput("c1", "ok"))}},
		{name: "output before its call", f: Fields{Input: items(funcOutput("c1", "ok"), funcCall("c1", "{}"))}},
		{name: "output of another call", f: Fields{Input: items(funcCall("c1", "{}"), funcOutput("c2", "ok"))}},
		{name: "custom tool output without its call", f: Fields{Input: items(customOutput("c1"))}},
		{name: "custom tool call answered", f: Fields{Input: items(customCall("c1"), customOutput("c1"))}, want: true},
		{name: "local shell output without its call", f: Fields{Input: items(raw(`{"type":"local_shell_call_output","call_id":"c1","output":"x"}`))}},
		{name: "goal_objective output without call_id", f: Fields{Input: items(goalObjective(), u)}, want: true},
		{name: "output with an empty call_id", f: Fields{Input: items(raw(`{"type":"function_call_output","call_id":"","output":"x"}`))}, want: true},
		{name: "input_image part with file_id", f: Fields{Input: items(raw(`{"type":"message","role":"user","content":[{"type":"input_text","text":"see"},{"type":"input_image","file_id":"file-1"}]}`))}},
		{name: "input_image part with a URL", f: Fields{Input: items(raw(`{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}`))}, want: true},
		{name: "input_file part with file_id", f: Fields{Input: items(raw(`{"type":"message","role":"user","content":[{"type":"input_file","file_id":"file-2"}]}`))}},
		{name: "input_file part with inline data", f: Fields{Input: items(raw(`{"type":"message","role":"user","content":[{"type":"input_file","filename":"a.pdf","file_data":"JVBE"}]}`))}, want: true},
		{name: "null file_id", f: Fields{Input: items(raw(`{"type":"message","content":[{"type":"input_file","file_id":null,"file_url":"https://x"}]}`))}, want: true},
		{name: "file_id on another part type", f: Fields{Input: items(raw(`{"type":"message","content":[{"type":"output_text","text":"x","file_id":"file-3"}]}`))}, want: true},
		{name: "file in a tool output", f: Fields{Input: items(funcCall("c1", "{}"), raw(`{"type":"function_call_output","call_id":"c1","output":[{"type":"input_image","file_id":"file-4"}]}`))}},
		{name: "top-level input_file item", f: Fields{Input: items(raw(`{"type":"input_file","file_id":"file-5"}`))}},
		{name: "escaped file_id key", f: Fields{Input: items(raw(`{"type":"message","content":[{"type":"input_image","file\u005fid":"file-6"}]}`))}},
		{name: "string content", f: Fields{Input: items(raw(`{"type":"message","role":"user","content":"file_id input_file"}`))}, want: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, SelfContained(tc.f))
		})
	}
}
