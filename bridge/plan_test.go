package bridge

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func items(raw ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(raw))
	for i, r := range raw {
		out[i] = json.RawMessage(r)
	}
	return out
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		a, b string
		same bool
	}{
		{"same id, different encoding", `{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"x"}`, `{"id":"rs_1","encrypted_content":"x","type":"reasoning","content":null,"summary":[]}`, true},
		{"different ids", `{"type":"message","id":"m1"}`, `{"type":"message","id":"m2"}`, false},
		{"tool output by call id", `{"type":"function_call_output","call_id":"c1","output":"a"}`, `{"call_id":"c1","type":"function_call_output","output":"a"}`, true},
		{"no id: canonical json", `{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}`, `{"content":[{"text":"hi","type":"input_text"}],"role":"user","type":"message"}`, true},
		{"no id: different text", `{"type":"message","role":"user","content":"hi"}`, `{"type":"message","role":"user","content":"ho"}`, false},
		{"goal output without call id", `{"type":"function_call_output","output":"goal A"}`, `{"type":"function_call_output","output":"goal B"}`, false},
		{"not json", `{{`, `{{`, true},
		{"whitespace and escapes", `{"type":"message","content":"caf\u00e9 \/ \n"}`, "{ \"content\" : \"café / \\n\" ,\n \"type\":\"message\" }", true},
		{"numbers by value", `{"type":"x","n":[1,2.50,1e2]}`, `{"n":[1.0,2.5,100],"type":"x"}`, true},
		{"array order counts", `{"type":"x","n":[1,2]}`, `{"type":"x","n":[2,1]}`, false},
		{"string is not number", `{"type":"x","n":"1"}`, `{"type":"x","n":1}`, false},
		{"null is not false", `{"type":"x","n":null}`, `{"type":"x","n":false}`, false},
		{"nesting counts", `{"type":"x","a":[[1],[2]]}`, `{"type":"x","a":[[1,2]]}`, false},
		{"key and value do not run together", `{"type":"x","ab":"c"}`, `{"type":"x","a":"bc"}`, false},
		{"escaped id", `{"type":"message","id":"m\u0031"}`, `{"type":"message","id":"m1"}`, true},
		{"numeric id is content", `{"type":"message","id":1}`, `{"type":"message","id":2}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.same, Fingerprint(json.RawMessage(tc.a)) == Fingerprint(json.RawMessage(tc.b)))
		})
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"m","tools":[{"name":"exec_command"}],"input":[],"stream":true,"client_metadata":{"turn":"1"}}`)
	shape := Shape(body)
	hist := items(`{"type":"message","id":"u1","role":"user","content":"a"}`, `{"type":"reasoning","id":"rs1"}`, `{"type":"message","id":"m1","role":"assistant"}`)
	st := State{ResponseID: "resp_1", History: Fingerprints(hist), Shape: shape}
	next := append(append([]json.RawMessage{}, hist...), items(`{"type":"message","id":"u2","role":"user","content":"b"}`)...)

	cases := []struct {
		name  string
		st    State
		shape [32]byte
		input []json.RawMessage
		delta bool
		from  int
	}{
		{"history is a prefix: delta", st, shape, next, true, 3},
		{"fresh lane: full", State{}, shape, next, false, 0},
		{"a lane that does not chain: full", State{ResponseID: "resp_1", History: st.History, Shape: shape, NoChain: true}, shape, next, false, 0},
		{"shape changed: full", st, Shape([]byte(`{"model":"other","input":[]}`)), next, false, 0},
		{"nothing new: full", st, shape, hist, false, 0},
		{"branch from earlier: full", st, shape, append(items(`{"type":"message","id":"u1","role":"user","content":"a"}`), items(`{"type":"message","id":"x"}`, `{"type":"message","id":"y"}`, `{"type":"message","id":"z"}`)...), false, 0},
		{"compacted history: full", st, shape, items(`{"type":"compaction","id":"c1"}`, `{"type":"message","id":"u9"}`, `{"type":"message","id":"u10"}`, `{"type":"message","id":"u11"}`), false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			delta, from := Plan(tc.st, tc.shape, tc.input)
			assert.Equal(t, tc.delta, delta)
			assert.Equal(t, tc.from, from)
		})
	}
	// Per-turn details do not change the shape; the conversation's do.
	assert.Equal(t, shape, Shape([]byte(`{"client_metadata":{"turn":"2"},"stream":false,"input":[1],"tools":[{"name":"exec_command"}],"model":"m","previous_response_id":"r"}`)))
	assert.NotEqual(t, shape, Shape([]byte(`{"model":"m","tools":[],"input":[]}`)))
}

func TestChain(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"m","input":[{"type":"message","id":"a"},{"type":"message","id":"b"}],"x_unknown":{"k":1},"previous_response_id":"old"}`)
	msg, err := Chain(body, items(`{"type":"message","id":"b"}`), "resp_9")
	require.NoError(t, err)
	assert.Equal(t, `{"type":"response.create","previous_response_id":"resp_9","model":"m","input":[{"type":"message","id":"b"}],"x_unknown":{"k":1}}`, string(msg))
	full, err := Chain(body, items(`{"type":"message","id":"a"}`, `{"type":"message","id":"b"}`), "")
	require.NoError(t, err)
	assert.Equal(t, `{"type":"response.create","model":"m","input":[{"type":"message","id":"a"},{"type":"message","id":"b"}],"x_unknown":{"k":1}}`, string(full))
	_, err = Chain([]byte(`[1]`), nil, "")
	assert.Error(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(msg, &v))

	as, err := Message(body)
	require.NoError(t, err)
	assert.Equal(t, `{"type":"response.create","model":"m","input":[{"type":"message","id":"a"},{"type":"message","id":"b"}],"x_unknown":{"k":1},"previous_response_id":"old"}`, string(as),
		"a message as the client sent it keeps its input and its chain")
	empty, err := Message([]byte(` { } `))
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"response.create"}`, string(empty))
	_, err = Message([]byte(`"x"`))
	assert.Error(t, err)
}

// Whatever spelling a client re-serialises an item in, its fingerprint
// stays: decoded and re-encoded (sorted keys, other escapes, indentation)
// it is the same item.
func FuzzFingerprintSurvivesReencoding(f *testing.F) {
	for _, seed := range []string{
		`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi\nthere <b> & é"}]}`,
		`{"type":"function_call_output","output":"goal A","n":[1,2.5,-3e-2,true,false,null,{}]}`,
		`{"z":{"b":[],"a":{"c":"\u2028"}},"a":0}`,
		`{"pair":"\ud83d\ude00","lone":"\ud83d x","low":"\ude00","bad":"` + "\xff\xfe" + `","ctl":"\u0001\b\f"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var v map[string]any
		if json.Unmarshal([]byte(in), &v) != nil {
			return
		}
		again, err := json.MarshalIndent(v, " ", "\t")
		require.NoError(t, err)
		var check map[string]any
		require.NoError(t, json.Unmarshal(again, &check))
		if _, hasID := v["id"]; hasID {
			return // known by id: only the id matters
		}
		a, b := Fingerprint(json.RawMessage(in)), Fingerprint(json.RawMessage(again))
		assert.Equal(t, a, b, "%s\n%s", in, again)
	})
}

func BenchmarkFingerprint(b *testing.B) {
	item := json.RawMessage(`{"type":"message","role":"user","content":[{"type":"input_text","text":"` + strings.Repeat("some words of a prompt, with a line\\n ", 20) + `"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(item)
	}
}
