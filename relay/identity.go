package relay

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// SessionHeaders are the headers that carry the process session (the root of
// an agent tree), in order of precedence: current Codex sends session-id,
// older clients one of the others.
var SessionHeaders = []string{"session-id", "session_id", "x-codex-session-id", "x-codex-conversation-id"}

// ThreadHeader carries the id of one conversation (a sub-agent has its own).
const ThreadHeader = "thread-id"

// canonical header names, computed once: http.Header.Get would canonicalise
// (and allocate) on every request.
var (
	canonicalSessionHeaders = func() []string {
		out := make([]string, len(SessionHeaders))
		for i, h := range SessionHeaders {
			out[i] = http.CanonicalHeaderKey(h)
		}
		return out
	}()
	canonicalThreadHeader = http.CanonicalHeaderKey(ThreadHeader)
)

func headerValue(h http.Header, canonical string) string {
	if v := h[canonical]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// maxIdentityLen bounds identity header values; longer ones are refused.
const maxIdentityLen = 256

// ThreadKey is an opaque, versioned, source-separated key derived from a
// request's identities. It scopes bindings, lanes and continuity. Every key
// is a hash under a prefix naming its version and source, so no client header
// value can produce one, and keys from different sources never collide.
type ThreadKey string

// Source says what a ThreadKey was derived from.
type Source string

const (
	SourceSessionThread Source = "st" // process session and thread id
	SourceThread        Source = "t"  // thread id alone (no session header)
	SourceSession       Source = "s"  // process session alone (no thread id)
	// SourceHint: a Chat Completions client's prompt_cache_key or user,
	// for a client that sends no identity headers (see HintIdentity).
	SourceHint Source = "h"
)

const keyVersion = "v1"

// Identity is what a request says about who it is, parsed once. The raw
// session stays available for legacy raw-session rows (operator pins); the
// key is what everything thread-scoped uses.
type Identity struct {
	// Session is the process session, normalised; empty when absent.
	Session string
	// SessionHeader names the header Session came from.
	SessionHeader string
	// Thread is the thread id, normalised; empty when absent.
	Thread string
	// Key is derived from Session and Thread; empty when both are absent.
	Key ThreadKey
	// Source says which of them Key was derived from.
	Source Source
	// SessionKey is the process-session preference key, derived from Session
	// alone; empty without a session. Siblings of one tree share it.
	SessionKey ThreadKey
}

// IdentityError is a malformed identity header.
type IdentityError struct {
	Header string
	Reason string
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("invalid %s header: %s", e.Header, e.Reason)
}

// ParseIdentity reads the process session and the thread id from request
// headers, separately, and derives the keys.
func ParseIdentity(h http.Header) (Identity, error) {
	var id Identity
	for i, name := range SessionHeaders {
		v, err := normaliseID(name, headerValue(h, canonicalSessionHeaders[i]))
		if err != nil {
			return Identity{}, err
		}
		if v != "" {
			id.Session, id.SessionHeader = v, name
			break
		}
	}
	thread, err := normaliseID(ThreadHeader, headerValue(h, canonicalThreadHeader))
	if err != nil {
		return Identity{}, err
	}
	return DeriveIdentity(id.Session, id.SessionHeader, thread), nil
}

// ParseGoalIdentity is ParseIdentity for the thread-goal routes, whose thread
// is the payload's threadId rather than a header.
func ParseGoalIdentity(h http.Header, payloadThreadID string) (Identity, error) {
	id, err := ParseIdentity(h)
	if err != nil {
		return Identity{}, err
	}
	thread, err := normaliseID("threadId", payloadThreadID)
	if err != nil {
		return Identity{}, err
	}
	if thread == "" {
		thread = id.Thread
	}
	return DeriveIdentity(id.Session, id.SessionHeader, thread), nil
}

// DeriveIdentity builds an Identity from already normalised values.
func DeriveIdentity(session, sessionHeader, thread string) Identity {
	id := Identity{Session: session, SessionHeader: sessionHeader, Thread: thread}
	switch {
	case session != "" && thread != "":
		id.Key, id.Source = deriveKey(SourceSessionThread, session, thread), SourceSessionThread
	case thread != "":
		id.Key, id.Source = deriveKey(SourceThread, thread), SourceThread
	case session != "":
		id.Key, id.Source = deriveKey(SourceSession, session), SourceSession
	}
	if session != "" {
		id.SessionKey = deriveKey(SourceSession, session)
	}
	return id
}

// TurnMetadataHeader is the header in which Codex describes the turn a
// request belongs to, as JSON: its session_id and thread_id among others.
const TurnMetadataHeader = "x-codex-turn-metadata"

var canonicalTurnMetadataHeader = http.CanonicalHeaderKey(TurnMetadataHeader)

// TurnMetadataIdentity reads the thread of a request that carries no
// identity headers from its turn metadata: Codex's image tool posts
// images/generations and images/edits with only x-codex-turn-metadata, whose
// session_id and thread_id are those of the turn's Responses requests, so
// the image is placed and logged with its thread. No metadata, metadata
// that is not a JSON object or ids that are not usable: no identity.
func TurnMetadataIdentity(h http.Header) Identity {
	raw := headerValue(h, canonicalTurnMetadataHeader)
	if raw == "" || len(raw) > maxTurnMetadataLen {
		return Identity{}
	}
	var meta struct {
		SessionID string `json:"session_id"`
		ThreadID  string `json:"thread_id"`
	}
	if json.Unmarshal([]byte(raw), &meta) != nil {
		return Identity{}
	}
	session, err := normaliseID("session_id", meta.SessionID)
	if err != nil {
		return Identity{}
	}
	thread, err := normaliseID("thread_id", meta.ThreadID)
	if err != nil {
		return Identity{}
	}
	header := ""
	if session != "" {
		header = TurnMetadataHeader
	}
	return DeriveIdentity(session, header, thread)
}

// maxTurnMetadataLen bounds the turn metadata the relay decodes (Codex's is
// under a kilobyte).
const maxTurnMetadataLen = 16 << 10

// HintIdentity places a client that sent no identity headers by a value of
// its body (a Chat client's prompt_cache_key or user, named by field): the
// requests that carry the same value are one thread, with a key no header
// can produce. The value is kept as the thread id for operators (bindings,
// request log) when it is a usable id.
func HintIdentity(field, value string) Identity {
	id := Identity{Key: deriveKey(SourceHint, field, value), Source: SourceHint}
	if v, err := normaliseID(field, value); err == nil {
		id.Thread = v
	}
	return id
}

// deriveKey hashes length-prefixed parts under the source's namespace, so
// ("ab","c") and ("a","bc") differ and no part can imitate a separator.
func deriveKey(src Source, parts ...string) ThreadKey {
	// One buffer, on the stack for ordinary ids, hashed in one call.
	var stack [512]byte
	buf := append(stack[:0], "codex-relay thread key "+keyVersion+" "...)
	buf = append(buf, src...)
	buf = append(buf, 0)
	for _, p := range parts {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(p)))
		buf = append(buf, p...)
	}
	sum := sha256.Sum256(buf)
	var out [3 + 3 + 24]byte // "v1:" + source + ":" + 24 base64 characters of 18 bytes
	n := copy(out[:], keyVersion+":")
	n += copy(out[n:], src)
	out[n] = ':'
	n++
	base64.RawURLEncoding.Encode(out[n:], sum[:18])
	return ThreadKey(out[:n+24])
}

// normaliseID trims a header value; blank is absent. UUIDs (what Codex
// sends) are lower-cased so case variants of one id agree; other values are
// kept exactly. Overlong values and control characters are refused.
func normaliseID(header, v string) (string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return "", nil
	}
	if len(v) > maxIdentityLen {
		return "", &IdentityError{Header: header, Reason: fmt.Sprintf("longer than %d bytes", maxIdentityLen)}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return "", &IdentityError{Header: header, Reason: "control character"}
		}
	}
	// Bytes that are not UTF-8 cannot be stored as text in PostgreSQL (the
	// binding and log writes would fail) nor shown as they are in JSON.
	if !utf8.ValidString(v) {
		return "", &IdentityError{Header: header, Reason: "not UTF-8"}
	}
	if isUUID(v) {
		v = strings.ToLower(v)
	}
	return v, nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
