package relay

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
)

func TestCompactionOf(t *testing.T) {
	t.Parallel()
	const (
		compactionMeta = `{\"turn_id\":\"t1\",\"request_kind\":\"compaction\"}`
		turnMeta       = `{\"turn_id\":\"t1\",\"request_kind\":\"turn\"}`
		msg            = `{"type":"message","role":"user","content":"hi"}`
	)
	metaHeader := func(kind string) http.Header {
		return http.Header{"X-Codex-Turn-Metadata": {`{"request_kind":"` + kind + `"}`}}
	}
	cases := []struct {
		name      string
		transport string
		sub       string
		body      string
		header    http.Header
		want      string
	}{
		{"an ordinary turn", "http", "", `{"input":[` + msg + `]}`, nil, ""},
		{"the legacy route", "http", "/compact", `{"input":[` + msg + `]}`, nil, compactionRoute},
		{"input ending in compaction_trigger", "ws", "", `{"input":[` + msg + `,{"type":"compaction_trigger"}]}`, nil, compactionTrigger},
		{"a trigger that is not last", "http", "", `{"input":[{"type":"compaction_trigger"},` + msg + `]}`, nil, ""},
		{"request_kind in the body's metadata", "ws", "", `{"input":[` + msg + `],"client_metadata":{"x-codex-turn-metadata":"` + compactionMeta + `"}}`, nil, compactionKind},
		{"an ordinary request_kind in the body", "http", "", `{"input":[],"client_metadata":{"x-codex-turn-metadata":"` + turnMeta + `"}}`, metaHeader("compaction"), ""},
		{"request_kind in the HTTP header", "http", "", `{"input":[` + msg + `]}`, metaHeader("compaction"), compactionKind},
		{"a WebSocket handshake header is not this request's", "ws", "", `{"input":[` + msg + `]}`, metaHeader("compaction"), ""},
		{"metadata that is not JSON", "http", "", `{"input":[],"client_metadata":{"x-codex-turn-metadata":"{"}}`, metaHeader("{"), ""},
		{"metadata of another shape", "http", "", `{"input":[],"client_metadata":{"x-codex-turn-metadata":7}}`, metaHeader("compaction"), compactionKind},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fields, err := continuity.RequestFields([]byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, compactionOf(tc.transport, tc.sub, fields, []byte(tc.body), tc.header))
		})
	}
}

func TestCompactionPlace(t *testing.T) {
	t.Parallel()
	pool := func(a store.Account) bool { return !isFallback(a) }
	a := store.Account{ID: "a", Organization: "org-a"}
	b := store.Account{ID: "b", Organization: "org-b"}
	f := store.Account{ID: "f", Organization: "org-a", Tags: []string{FallbackTag}}
	g := compactionPlace{org: "org-a"}.group(pool)
	assert.True(t, g(a))
	assert.False(t, g(b), "another organisation cannot read the history")
	assert.False(t, g(f), "a compaction is never moved to the fallback group")
	g = compactionPlace{org: "org-a", owners: []string{"f"}}.group(pool)
	assert.True(t, g(f), "the thread's own account, where an exhausted pool put it")
	assert.True(t, g(a))
	g = compactionPlace{org: "org-b", owners: []string{"f"}}.group(pool)
	assert.False(t, g(f), "but only when it can read the history")
	g = compactionPlace{}.group(pool)
	assert.True(t, g(a))
	assert.True(t, g(b), "no organisation known: any account of the group")
	assert.False(t, g(f))
}

// The compaction test of outside input: request bodies and turn metadata.
func FuzzCompactionOf(f *testing.F) {
	for _, s := range []string{
		`{"input":[{"type":"compaction_trigger"}]}`,
		`{"input":[],"client_metadata":{"x-codex-turn-metadata":"{\"request_kind\":\"compaction\"}"}}`,
		`{"client_metadata":{"x-codex-turn-metadata":null}}`,
		`{"client_metadata":[]}`,
	} {
		f.Add([]byte(s), `{"request_kind":"compaction"}`)
	}
	f.Fuzz(func(t *testing.T, body []byte, meta string) {
		fields, err := continuity.RequestFields(body)
		if err != nil {
			return
		}
		for _, transport := range []string{"http", "ws"} {
			switch got := compactionOf(transport, "", fields, body, http.Header{"X-Codex-Turn-Metadata": {meta}}); got {
			case "", compactionTrigger, compactionKind:
			default:
				t.Fatalf("compactionOf(%q) = %q", body, got)
			}
		}
	})
}
