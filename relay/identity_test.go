package relay

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

const (
	sess  = "019a0000-0000-7000-8000-000000000001"
	root  = "019a0000-0000-7000-8000-0000000000aa"
	child = "019a0000-0000-7000-8000-0000000000bb"
	other = "019a0000-0000-7000-8000-000000000002"
)

func TestParseIdentity(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name            string
		h               http.Header
		session, thread string
		source          Source
		sessionHeader   string
		wantErr         string
	}{
		{"both headers", headers("session-id", sess, "thread-id", root), sess, root, SourceSessionThread, "session-id", ""},
		{"thread only", headers("thread-id", root), "", root, SourceThread, "", ""},
		{"session only", headers("session-id", sess), sess, "", SourceSession, "session-id", ""},
		{"neither", headers(), "", "", "", "", ""},
		{"legacy underscore alias", headers("session_id", sess), sess, "", SourceSession, "session_id", ""},
		{"legacy x-codex-session-id", headers("x-codex-session-id", sess, "thread-id", root), sess, root, SourceSessionThread, "x-codex-session-id", ""},
		{"legacy conversation id", headers("x-codex-conversation-id", sess), sess, "", SourceSession, "x-codex-conversation-id", ""},
		{"session-id wins over aliases", headers("session_id", other, "session-id", sess), sess, "", SourceSession, "session-id", ""},
		{"blank session falls to alias", headers("session-id", "   ", "session_id", sess), sess, "", SourceSession, "session_id", ""},
		{"blank thread is absent", headers("session-id", sess, "thread-id", " \t"), sess, "", SourceSession, "session-id", ""},
		{"mixed-case uuids are lower-cased", headers("session-id", strings.ToUpper(sess), "thread-id", strings.ToUpper(root)), sess, root, SourceSessionThread, "session-id", ""},
		{"non-uuid keeps its case", headers("thread-id", "MyThread"), "", "MyThread", SourceThread, "", ""},
		{"overlong refused", headers("thread-id", strings.Repeat("a", 300)), "", "", "", "", "thread-id"},
		{"control character refused", headers("session-id", "a\x01b"), "", "", "", "", "session-id"},
		{"bytes that are not UTF-8 refused", headers("thread-id", "thread-\xff\xfe"), "", "", "", "", "thread-id"},
		{"UTF-8 beyond ASCII kept", headers("thread-id", "fil-à-plomb"), "", "fil-à-plomb", SourceThread, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := ParseIdentity(tc.h)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.session, id.Session)
			assert.Equal(t, tc.thread, id.Thread)
			assert.Equal(t, tc.source, id.Source)
			assert.Equal(t, tc.sessionHeader, id.SessionHeader)
			if tc.source == "" {
				assert.Empty(t, id.Key)
			} else {
				assert.True(t, strings.HasPrefix(string(id.Key), "v1:"+string(tc.source)+":"), id.Key)
			}
			if tc.session != "" {
				assert.Equal(t, DeriveIdentity(tc.session, "", "").Key, id.SessionKey, "the session key is the session-only key")
			} else {
				assert.Empty(t, id.SessionKey)
			}
		})
	}
}

// Root and child of one tree share the session (and prompt_cache_key) but
// get distinct thread keys and one shared session key; the same thread is
// stable across requests; sources never collide.
func TestThreadKeysSeparateThreadsAndSources(t *testing.T) {
	t.Parallel()
	rootID, err := ParseIdentity(headers("session-id", sess, "thread-id", root))
	require.NoError(t, err)
	childID, err := ParseIdentity(headers("session-id", sess, "thread-id", child))
	require.NoError(t, err)
	again, err := ParseIdentity(headers("Session-Id", sess, "Thread-Id", root))
	require.NoError(t, err)
	assert.NotEqual(t, rootID.Key, childID.Key)
	assert.Equal(t, rootID.SessionKey, childID.SessionKey)
	assert.Equal(t, rootID.Key, again.Key)

	otherTree, err := ParseIdentity(headers("session-id", other, "thread-id", root))
	require.NoError(t, err)
	assert.NotEqual(t, rootID.Key, otherTree.Key, "the same thread id in another tree is another key")

	threadOnly := DeriveIdentity("", "", root)
	sessionOnly := DeriveIdentity(root, "session-id", "")
	assert.NotEqual(t, threadOnly.Key, sessionOnly.Key, "a value used as thread and as session gives different keys")
	assert.NotEqual(t, DeriveIdentity("ab", "", "c").Key, DeriveIdentity("a", "", "bc").Key, "parts are length-prefixed")
}

// A client that sends a value shaped like a derived key gets a key derived
// from that value, never the value itself or the key it imitates.
func TestHeaderValuesCannotImitateDerivedKeys(t *testing.T) {
	t.Parallel()
	victim := DeriveIdentity(sess, "session-id", root)
	for _, forged := range []string{string(victim.Key), string(victim.SessionKey), "v1:st:" + root, "v1:s:" + sess} {
		for _, h := range []http.Header{headers("thread-id", forged), headers("session-id", forged), headers("session-id", forged, "thread-id", forged)} {
			id, err := ParseIdentity(h)
			require.NoError(t, err)
			assert.NotEqual(t, victim.Key, id.Key)
			assert.NotEqual(t, victim.SessionKey, id.Key)
			assert.NotEqual(t, ThreadKey(forged), id.Key)
			assert.NotEqual(t, victim.SessionKey, id.SessionKey)
		}
	}
}

func TestGoalIdentityUsesPayloadThread(t *testing.T) {
	t.Parallel()
	h := headers("session-id", sess, "thread-id", root)
	id, err := ParseGoalIdentity(h, child)
	require.NoError(t, err)
	assert.Equal(t, child, id.Thread, "the payload's threadId names the thread")
	assert.Equal(t, DeriveIdentity(sess, "session-id", child).Key, id.Key)
	fallback, err := ParseGoalIdentity(h, "")
	require.NoError(t, err)
	assert.Equal(t, root, fallback.Thread)
	_, err = ParseGoalIdentity(h, strings.Repeat("x", 1000))
	assert.Error(t, err)
}

func TestTurnMetadataIdentity(t *testing.T) {
	t.Parallel()
	turn, err := ParseIdentity(headers("session-id", sess, "thread-id", root))
	require.NoError(t, err)
	for _, tt := range []struct {
		name string
		meta string
		want Identity
	}{
		{"the turn's session and thread: the key of its Responses requests",
			`{"session_id":"` + sess + `","thread_id":"` + root + `","turn_id":"x","model":"gpt-5.5"}`, turn},
		{"a thread alone", `{"thread_id":"` + root + `"}`, DeriveIdentity("", "", root)},
		{"no header", "", Identity{}},
		{"not JSON", `{"session_id":`, Identity{}},
		{"not an object", `["` + sess + `"]`, Identity{}},
		{"ids of another type", `{"session_id":7,"thread_id":true}`, Identity{}},
		{"an id too long", `{"thread_id":"` + strings.Repeat("x", 1000) + `"}`, Identity{}},
		{"no ids", `{"turn_id":"x"}`, Identity{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.meta != "" {
				h.Set(TurnMetadataHeader, tt.meta)
			}
			got := TurnMetadataIdentity(h)
			assert.Equal(t, tt.want.Key, got.Key)
			assert.Equal(t, tt.want.Thread, got.Thread)
			assert.Equal(t, tt.want.Session, got.Session)
		})
	}
}

func BenchmarkParseIdentity(b *testing.B) {
	h := headers("session-id", sess, "thread-id", root, "x-client-request-id", root, "originator", "codex_exec")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseIdentity(h); err != nil {
			b.Fatal(err)
		}
	}
}
