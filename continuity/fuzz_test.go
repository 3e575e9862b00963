package continuity

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func fuzzSeeds(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"input":"hi"}`,
		`{"input":"\u00e9\ud83d\ude00 \"q\" \\"}`,
		`{"model":"m","previous_response_id":"r","input":[{"type":"message","content":[{"type":"input_text","text":"x"}]}],"stream":true}`,
		`{"input":[1],"input":[2],"previous_response_id":"a","previous_response_id":null}`,
		`{"previous_response\u005fid":"r","\u0069nput":[{"a":"\"]}"}]}`,
		` { "generate" : false , "input" : [ ] , "conversation" : {"id":"c"} } `,
		`{"input":[{"type":"function_call_output","output":"x"},{"type":"input_file","file_id":"f"}]}`,
		`[1,2]`,
		`{"input":`,
		`{"a":"\\\\\"","input":["\\"]}`,
		string(codexBody(realisticHistory(8), "resp_1")),
	} {
		f.Add([]byte(s))
	}
}

// FuzzRequestFields: reading and rewriting a body never panics; whenever a
// body reads, its rewrite is valid JSON that reads back with the same input,
// no previous_response_id and the other fields unchanged.
func FuzzRequestFields(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		fields, err := RequestFields(body)
		_ = SelfContained(fields)
		_, _ = StripReasoningCiphertext(fields.Input)
		_ = HasUnstrippableCiphertext(fields.Input)
		if err != nil {
			if _, err := WithFullInput(body, nil); err == nil && !json.Valid(body) {
				t.Fatalf("WithFullInput accepted invalid JSON %q", body)
			}
			return
		}
		for i, it := range fields.Input {
			if !json.Valid(it) {
				t.Fatalf("input item %d is not valid JSON: %q", i, it)
			}
		}
		out, err := WithFullInput(body, fields.Input)
		if err != nil {
			t.Fatalf("WithFullInput(%q): %v", body, err)
		}
		if !bytes.Equal(body, orig) {
			t.Fatalf("body modified")
		}
		if !json.Valid(out) {
			t.Fatalf("rewrite of %q is not valid JSON: %q", body, out)
		}
		again, err := RequestFields(out)
		if err != nil {
			t.Fatalf("rewrite %q does not read: %v", out, err)
		}
		if again.PreviousResponseID != "" {
			t.Fatalf("rewrite %q kept previous_response_id", out)
		}
		if len(again.Input) != len(fields.Input) {
			t.Fatalf("rewrite %q: %d items, want %d", out, len(again.Input), len(fields.Input))
		}
		for i := range again.Input {
			if !bytes.Equal(again.Input[i], fields.Input[i]) {
				t.Fatalf("rewrite %q: item %d is %q, want %q", out, i, again.Input[i], fields.Input[i])
			}
		}
		if again.Model != fields.Model || again.Stream != fields.Stream || again.Conversation != fields.Conversation ||
			again.PromptCacheKey != fields.PromptCacheKey || (again.Generate == nil) != (fields.Generate == nil) ||
			(again.Generate != nil && *again.Generate != *fields.Generate) || again.InputString {
			t.Fatalf("rewrite %q changed fields: %+v, was %+v", out, again, fields)
		}
	})
}

// FuzzScanObject checks the scanner against encoding/json: for a valid
// object, every member it reports has a key that decodes and a valid value,
// and it finds as many members as encoding/json's tokenizer.
func FuzzScanObject(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var got int
		closing, ok := scanObject(b, func(tok []byte, escaped bool, m member) {
			if !json.Valid(b) {
				return
			}
			var k string
			if err := json.Unmarshal(tok, &k); err != nil {
				t.Fatalf("key %q: %v", tok, err)
			}
			// encoding/json replaces invalid UTF-8 with U+FFFD; the scanner
			// keeps the bytes. Both spell the same ASCII names, which are
			// all the package matches.
			if utf8.Valid(tok) && string(keyName(tok, escaped)) != k {
				t.Fatalf("key %q read as %q, want %q", tok, keyName(tok, escaped), k)
			}
			if v := b[m.valStart:m.end]; !json.Valid(v) {
				t.Fatalf("value %q of %q is not valid", v, b)
			}
			got++
		})
		if !json.Valid(b) {
			return
		}
		var top any
		_ = json.Unmarshal(b, &top)
		obj, isObj := top.(map[string]any)
		if ok != isObj {
			t.Fatalf("scanObject(%q) ok=%v, object=%v", b, ok, isObj)
		}
		if !isObj {
			return
		}
		if b[closing] != '}' {
			t.Fatalf("closing offset %d of %q is %q", closing, b, b[closing])
		}
		if want := countMembers(b); got != want {
			t.Fatalf("scanObject(%q) found %d members, want %d (%d distinct)", b, got, want, len(obj))
		}
	})
}

// countMembers counts the top-level members of a valid JSON object with
// encoding/json's tokenizer.
func countMembers(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return -1
	}
	n := 0
	for dec.More() {
		if _, err := dec.Token(); err != nil { // key
			return -1
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return -1
		}
		n++
	}
	return n
}

// FuzzItem: inspecting and stripping an item never panics, and stripping a
// valid item yields a valid item.
func FuzzItem(f *testing.F) {
	for _, s := range []string{
		`{"type":"reasoning","summary":[],"encrypted_content":"x"}`,
		`{ "encrypted_content" : "x" , "type" : "reasoning" }`,
		`{"type":"reasoning","encrypted\u005fcontent":"x","encrypted_content":""}`,
		`{"type":"message","content":[{"type":"input_image","file_id":"f","encrypted_content":"c"}]}`,
		`{"type":"reasoning","encrypted_content":"x"`,
		`{"type":"compaction","encrypted_content":"x"}`,
		`{"type":"message","role":"developer","content":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = inspect(b)
		_ = EndsWithCompactionTrigger([]json.RawMessage{b})
		if h, ok := CompactedHistory([]json.RawMessage{b}, []json.RawMessage{b}); ok {
			for _, it := range h {
				if !bytes.Equal(it, b) {
					t.Fatalf("compacting %q made the item %q", b, it)
				}
			}
		}
		_ = SelfContained(Fields{Input: []json.RawMessage{b}})
		out, stripped := StripReasoningCiphertext([]json.RawMessage{b})
		if !stripped {
			if !bytes.Equal(out[0], b) {
				t.Fatalf("unstripped item changed: %q -> %q", b, out[0])
			}
			return
		}
		if json.Valid(b) && !json.Valid(out[0]) {
			t.Fatalf("stripping %q gave invalid %q", b, out[0])
		}
		if inspect(out[0]).itemCipher {
			t.Fatalf("stripping %q left ciphertext: %q", b, out[0])
		}
	})
}

// FuzzDecidedMembersReadOnce: whenever RequestFields accepts a body, every
// reading of a member the relay decides on agrees: the first occurrence
// spelled exactly (how the relay's policy finds a member), a reference
// reading of the forwarded bytes that takes the last one (encoding/json
// into a map, as most upstreams read), and one that also matches names
// without regard to case (encoding/json into a struct). And the model the
// relay routes by is the reference's.
func FuzzDecidedMembersReadOnce(f *testing.F) {
	fuzzSeeds(f)
	for _, s := range []string{
		`{"model":"a","service_tier":"default","service_tier":"priority"}`,
		`{"model":"a","Model":"b"}`,
		`{"model":"a","\u006dodel":"b"}`,
		`{"ſervice_tier":"priority","model":"a"}`,
		`{"reasoning":{"effort":"low"},"reasoning":{"effort":"xhigh"}}`,
		`{"reasoning":{"effort":"low","EFFORT":"xhigh"}}`,
		`{"client_metadata":{"x-codex-turn-state":"a","X-Codex-Turn-State":"b"}}`,
		`{"model":"a","service_tier":"priority","reasoning":{"effort":"low","summary":"auto"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := RequestFields(body)
		if err != nil || !utf8.Valid(body) { // encoding/json reads invalid UTF-8 as U+FFFD, the relay as it is
			return
		}
		var last map[string]json.RawMessage
		if json.Unmarshal(body, &last) != nil {
			return
		}
		for _, name := range decidedMembers {
			first := firstMember(body, name)
			if ref, ok := last[name]; ok != (first != nil) || ok && !bytes.Equal(bytes.TrimSpace(ref), first) {
				t.Fatalf("%s of %q: the first occurrence %q, the last %q", name, body, first, ref)
			}
		}
		var folded struct {
			Model       *string         `json:"model"`
			ServiceTier json.RawMessage `json:"service_tier"`
			Reasoning   *struct {
				Effort json.RawMessage `json:"effort"`
			} `json:"reasoning"`
		}
		if json.Unmarshal(body, &folded) != nil {
			return
		}
		if folded.Model != nil && *folded.Model != fields.Model {
			t.Fatalf("model of %q: the relay read %q, a case-insensitive reading %q", body, fields.Model, *folded.Model)
		}
		if !bytes.Equal(folded.ServiceTier, bytes.TrimSpace(last["service_tier"])) {
			t.Fatalf("service_tier of %q: %q against %q", body, folded.ServiceTier, last["service_tier"])
		}
		if folded.Reasoning != nil && folded.Reasoning.Effort != nil {
			r := firstMember(body, "reasoning")
			if e := firstMember(r, "effort"); !bytes.Equal(e, folded.Reasoning.Effort) {
				t.Fatalf("reasoning.effort of %q: the first %q, a case-insensitive reading %q", body, e, folded.Reasoning.Effort)
			}
		}
	})
}

// firstMember is the value of the first member of obj whose key is name
// exactly as written (no escapes), or nil.
func firstMember(obj []byte, name string) []byte {
	var v []byte
	scanObject(obj, func(tok []byte, escaped bool, m member) {
		if v == nil && !escaped && string(tok[1:len(tok)-1]) == name {
			v = obj[m.valStart:m.end]
		}
	})
	return v
}
