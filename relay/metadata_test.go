package relay

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWithoutMetadataKey(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"removes the key, keeps every other byte",
			`{"type":"response.create", "model":"m","client_metadata":{"x-codex-turn-state":"ts","session_id":"s"},"input":[1]}`,
			`{"type":"response.create", "model":"m","client_metadata":{"session_id":"s"},"input":[1]}`},
		{"nothing to remove", `{"client_metadata":{"a":"b"},"x":1}`, `{"client_metadata":{"a":"b"},"x":1}`},
		{"no client_metadata", `{"model":"m"}`, `{"model":"m"}`},
		{"client_metadata not an object", `{"client_metadata":"x"}`, `{"client_metadata":"x"}`},
		{"nested key elsewhere is not touched", `{"input":[{"client_metadata":{"x-codex-turn-state":"ts"}}]}`, `{"input":[{"client_metadata":{"x-codex-turn-state":"ts"}}]}`},
		{"malformed", `{"client_metadata":{`, `{"client_metadata":{`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(withoutMetadataKey([]byte(tc.in), "x-codex-turn-state")))
		})
	}
}

func FuzzWithoutMetadataKey(f *testing.F) {
	f.Add([]byte(`{"client_metadata":{"x-codex-turn-state":"ts"},"input":[]}`))
	f.Add([]byte(`{"a":"\"client_metadata\"","client_metadata":{}}`))
	f.Add([]byte(`{"client_metadata":{"x-codex-turn-state":"ts","m":"<&>"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out := withoutMetadataKey(body, "x-codex-turn-state")
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("valid JSON became invalid: %q -> %q", body, out)
		}
		if string(out) == string(body) {
			return
		}
		s, e, ok := memberValue(out, "client_metadata")
		if !ok {
			t.Fatalf("client_metadata lost: %q -> %q", body, out)
		}
		var md map[string]json.RawMessage
		if err := json.Unmarshal(out[s:e], &md); err != nil {
			t.Fatalf("client_metadata unreadable: %q", out)
		}
		if _, still := md["x-codex-turn-state"]; still {
			t.Fatalf("key not removed: %q", out)
		}
	})
}

func TestWithoutMember(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"first", `{"type":"response.create","model":"m"}`, `{"model":"m"}`},
		{"middle", `{"model":"m", "type":"response.create", "input":[]}`, `{"model":"m", "input":[]}`},
		{"last", `{"model":"m","type":"response.create"}`, `{"model":"m"}`},
		{"only", `{"type":"x"}`, `{}`},
		{"absent", `{"model":"m"}`, `{"model":"m"}`},
		{"a value that looks like the key", `{"a":"\"type\":1","type":2}`, `{"a":"\"type\":1"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			out := withoutMember(in, "type")
			assert.Equal(t, tc.want, string(out))
			assert.True(t, json.Valid(out))
			assert.Equal(t, tc.in, string(in), "withoutMember leaves its input as it was")

			// cutMember gives the same bytes in the input's own array.
			cut := cutMember(in, "type")
			assert.Equal(t, tc.want, string(cut))
			assert.Same(t, &in[0], &cut[0], "cutMember reuses its input's bytes")
		})
	}
}
