package relay

import (
	"bytes"
	"encoding/json"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// withoutMetadataKey removes key from the body's top-level client_metadata
// object. Every byte outside client_metadata is kept; the body is returned
// unchanged when there is nothing to remove or it cannot be read.
func withoutMetadataKey(body []byte, key string) []byte {
	start, end, ok := memberValue(body, "client_metadata")
	if !ok {
		return body
	}
	var md map[string]json.RawMessage
	if json.Unmarshal(body[start:end], &md) != nil {
		return body
	}
	if _, ok := md[key]; !ok {
		return body
	}
	delete(md, key)
	return splice(body, start, end, encodeKeepingBytes(md)) // the other values keep their bytes
}

// memberValue finds the value of a top-level member of a JSON object and
// returns its byte range.
func memberValue(body []byte, name string) (start, end int, ok bool) {
	_, start, end, ok = member(body, name)
	return start, end, ok
}

// member finds a top-level member of a JSON object: where its key starts and
// its value's byte range.
func member(body []byte, name string) (keyStart, start, end int, ok bool) {
	i := wire.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, 0, false
	}
	i++
	want, _ := json.Marshal(name)
	for {
		i = wire.SkipSpace(body, i)
		if i >= len(body) || body[i] == '}' {
			return 0, 0, 0, false
		}
		ks := i
		keyEnd, _, ok := wire.ScanString(body, i)
		if !ok {
			return 0, 0, 0, false
		}
		key := body[i:keyEnd]
		i = wire.SkipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return 0, 0, 0, false
		}
		vs := wire.SkipSpace(body, i+1)
		ve, ok := wire.SkipValue(body, vs)
		if !ok {
			return 0, 0, 0, false
		}
		if bytes.Equal(key, want) {
			return ks, vs, ve, true
		}
		i = wire.SkipSpace(body, ve)
		if i < len(body) && body[i] == ',' {
			i++
		}
	}
}

// withoutMember removes a top-level member of a JSON object body, keeping
// every other byte; the body is returned unchanged when it has no such member.
func withoutMember(body []byte, name string) []byte {
	start, end, ok := memberSpan(body, name)
	if !ok {
		return body
	}
	out := make([]byte, 0, len(body)-(end-start))
	out = append(out, body[:start]...)
	return append(out, body[end:]...)
}

// cutMember is withoutMember done in body's own bytes, for a body nothing
// else holds (a client's WebSocket message, read whole into a buffer of
// its own): a message at the 64 MiB limit is not copied once more for it.
func cutMember(body []byte, name string) []byte {
	start, end, ok := memberSpan(body, name)
	if !ok {
		return body
	}
	return append(body[:start], body[end:]...)
}

// memberSpan finds the top-level member name of the object body, with
// one comma beside it: the bytes [start, end) to remove.
func memberSpan(body []byte, name string) (start, end int, ok bool) {
	ks, _, ve, ok := member(body, name)
	if !ok {
		return 0, 0, false
	}
	// The member, and one comma with it.
	start, end = ks, ve
	if j := wire.SkipSpace(body, end); j < len(body) && body[j] == ',' {
		end = wire.SkipSpace(body, j+1)
	} else if p := bytes.LastIndexByte(body[:start], ','); p >= 0 && wire.SkipSpace(body, p+1) == start {
		start = p
	}
	return start, end, true
}
