package continuity

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStripReasoningCiphertext(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		in       []string
		want     []string
		stripped bool
	}{
		{
			name:     "reasoning keeps its summary",
			in:       []string{`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"gAAAA"}`},
			want:     []string{`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}]}`},
			stripped: true,
		},
		{
			name:     "ciphertext first, whitespace and unknown fields kept",
			in:       []string{`{ "encrypted_content" : "gAAAA" , "type" : "reasoning", "x_future":{"encrypted_content":"nested"}, "content":null }`},
			want:     []string{`{ "type" : "reasoning", "x_future":{"encrypted_content":"nested"}, "content":null }`},
			stripped: true,
		},
		{
			name:     "escaped key",
			in:       []string{`{"type":"reasoning","encrypted\u005fcontent":"gAAAA","id":"rs_2"}`},
			want:     []string{`{"type":"reasoning","id":"rs_2"}`},
			stripped: true,
		},
		{
			name: "reasoning without ciphertext",
			in:   []string{`{"type":"reasoning","summary":[]}`, `{"type":"reasoning","encrypted_content":""}`, `{"type":"reasoning","encrypted_content":null}`},
			want: []string{`{"type":"reasoning","summary":[]}`, `{"type":"reasoning","encrypted_content":""}`, `{"type":"reasoning","encrypted_content":null}`},
		},
		{
			name: "other ciphertext is left alone",
			in: []string{
				`{"type":"compaction","encrypted_content":"summary"}`,
				`{"type":"message","role":"assistant","content":[{"type":"output_text","encrypted_content":"body"}]}`,
				`{"type":"function_call","call_id":"c","encrypted_content":"args"}`,
			},
			want: []string{
				`{"type":"compaction","encrypted_content":"summary"}`,
				`{"type":"message","role":"assistant","content":[{"type":"output_text","encrypted_content":"body"}]}`,
				`{"type":"function_call","call_id":"c","encrypted_content":"args"}`,
			},
		},
		{
			name:     "mixed list",
			in:       []string{`{"type":"message","content":"hi"}`, `{"type":"reasoning","encrypted_content":"a"}`, `{"type":"compaction","encrypted_content":"b"}`, `{"type":"reasoning","encrypted_content":"c","summary":[]}`},
			want:     []string{`{"type":"message","content":"hi"}`, `{"type":"reasoning"}`, `{"type":"compaction","encrypted_content":"b"}`, `{"type":"reasoning","summary":[]}`},
			stripped: true,
		},
		{
			name: "not objects",
			in:   []string{`"reasoning"`, `[1]`, `{"type":"reasoning","encrypted_content":"x"`},
			want: []string{`"reasoning"`, `[1]`, `{"type":"reasoning","encrypted_content":"x"`},
		},
		{name: "empty", in: nil, want: []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := make([]json.RawMessage, len(tc.in))
			for i, s := range tc.in {
				in[i] = raw(s)
			}
			out, stripped := StripReasoningCiphertext(in)
			assert.Equal(t, tc.want, strs(out))
			assert.Equal(t, tc.stripped, stripped)
			for i, s := range tc.in {
				assert.Equal(t, s, string(in[i]), "the input is not modified")
			}
		})
	}
}

func TestCiphertextChecks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		items        []string
		unstrippable bool
		any          bool
	}{
		{name: "none", items: []string{`{"type":"message","content":"hi"}`, `{"type":"reasoning","summary":[]}`}},
		{name: "reasoning only", items: []string{`{"type":"reasoning","encrypted_content":"x"}`}, any: true},
		{name: "compaction", items: []string{`{"type":"compaction","encrypted_content":"x"}`}, unstrippable: true, any: true},
		{name: "agent message body", items: []string{`{"type":"message","content":[{"type":"output_text","text":"","encrypted_content":"x"}]}`}, unstrippable: true, any: true},
		{name: "encrypted tool arguments", items: []string{`{"type":"function_call","call_id":"c","encrypted_content":"x"}`}, unstrippable: true, any: true},
		{name: "reasoning content part", items: []string{`{"type":"reasoning","content":[{"type":"reasoning_text","encrypted_content":"x"}]}`}, unstrippable: true, any: true},
		{name: "escaped part key", items: []string{`{"type":"message","content":[{"encrypted\u005fcontent":"x"}]}`}, unstrippable: true, any: true},
		{name: "empty values", items: []string{`{"type":"compaction","encrypted_content":""}`, `{"type":"message","content":[{"encrypted_content":null}]}`}},
		{name: "nested deeper is not a part", items: []string{`{"type":"message","metadata":{"encrypted_content":"x"}}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := make([]json.RawMessage, len(tc.items))
			for i, s := range tc.items {
				in[i] = raw(s)
			}
			assert.Equal(t, tc.unstrippable, HasUnstrippableCiphertext(in))
			assert.Equal(t, tc.any, HasCiphertext(in))
			stripped, _ := StripReasoningCiphertext(in)
			assert.False(t, HasCiphertext(stripped) && !HasUnstrippableCiphertext(stripped), "after stripping, what remains is unstrippable")
		})
	}
}
