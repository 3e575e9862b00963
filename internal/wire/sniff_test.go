package wire

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestEventType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		in     string
		want   string
		wantOK bool
	}{
		{"first field", `{"type":"response.created","response":{"id":"r"}}`, EventResponseCreated, true},
		{"after nested values", `{"response":{"type":"inner","output":[{"type":"x"},"}",1]},"seq":3,"ok":true,"n":null,"type":"response.completed"}`, EventResponseCompleted, true},
		{"whitespace", " \n{ \"type\" :\t\"error\" } ", EventError, true},
		{"unknown type", `{"type":"codex.something_new"}`, "codex.something_new", true},
		{"escaped value", `{"type":"a\"b"}`, `a"b`, true},
		{"escaped key", `{"\u0074ype":"error"}`, EventError, true},
		{"string with braces before", `{"delta":"{[\"type\":\"no\"]}","type":"response.output_text.delta"}`, EventOutputTextDelta, true},
		{"first type wins", `{"type":"error","type":"response.created"}`, EventError, true},
		{"no type", `{"response":{"type":"response.created"}}`, "", false},
		{"type not a string", `{"type":42}`, "", false},
		{"not an object", `["type","error"]`, "", false},
		{"empty", ``, "", false},
		{"truncated", `{"response":{"id":"r"`, "", false},
		{"truncated value", `{"type":"respo`, "", false},
		{"empty object", `{}`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := EventType([]byte(tt.in))
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestEventTypeKnownTypesAllocateNothing(t *testing.T) {
	data := []byte(`{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"hello"}`)
	allocs := testing.AllocsPerRun(100, func() {
		if typ, ok := EventType(data); !ok || typ != EventOutputTextDelta {
			t.Fatal("wrong type")
		}
	})
	assert.Zero(t, allocs)
}

func TestIsTerminal(t *testing.T) {
	t.Parallel()
	for typ, want := range map[string]bool{
		EventResponseCompleted: true, EventResponseFailed: true, EventResponseIncomplete: true, EventError: true,
		EventResponseCreated: false, EventOutputItemDone: false, EventRateLimits: false, "": false,
	} {
		assert.Equal(t, want, IsTerminal(typ), typ)
	}
}

// FuzzEventType compares the sniffer with a full decode on every valid JSON
// object whose top level has at most one "type" key.
func FuzzEventType(f *testing.F) {
	for _, s := range []string{
		`{"type":"response.created"}`, `{"a":[1,{"type":"x"}],"type":"error"}`, `{"type":"\u00e9"}`,
		`{"a":"\\","type":"b"}`, `{"a":1e5,"type":"b"}`, `{"type":null}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, ok := EventType(in) // must not panic on any input
		if !json.Valid(in) || !utf8.Valid(in) {
			return // a full decode replaces invalid UTF-8; EventType returns the bytes as they are
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(in, &obj) != nil || topLevelTypeKeys(in) > 1 {
			return
		}
		var want string
		raw, has := obj["type"]
		wantOK := has && json.Unmarshal(raw, &want) == nil && bytes.HasPrefix(bytes.TrimSpace(raw), []byte(`"`))
		if ok != wantOK || got != want {
			t.Fatalf("EventType(%s) = %q, %v; decode gives %q, %v", in, got, ok, want, wantOK)
		}
	})
}

func topLevelTypeKeys(in []byte) int {
	dec := json.NewDecoder(bytes.NewReader(in))
	depth, n, expectKey := 0, 0, false
	for {
		tok, err := dec.Token()
		if err != nil {
			return n
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			expectKey = depth == 1 && v == '{'
			continue
		case string:
			if depth == 1 && expectKey && v == "type" {
				n++
			}
		}
		if depth == 1 {
			expectKey = !expectKey
		}
	}
}

func BenchmarkEventType(b *testing.B) {
	cases := map[string][]byte{
		"delta":     []byte(`{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"hello world"}`),
		"type_last": []byte(`{"sequence_number":9,"response":{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"a long answer with \"quotes\" and {braces}"}]}],"usage":{"input_tokens":10}},"type":"response.completed"}`),
	}
	for name, data := range cases {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, ok := EventType(data); !ok {
					b.Fatal("no type")
				}
			}
		})
	}
}

// BenchmarkEventTypeDecode is the full decode EventType saves, for comparison.
func BenchmarkEventTypeDecode(b *testing.B) {
	data := []byte(`{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"hello world"}`)
	b.ReportAllocs()
	for b.Loop() {
		var v struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(data, &v); err != nil {
			b.Fatal(err)
		}
	}
}
