package continuity

import (
	"bytes"
	"encoding/json"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// This file holds a small JSON scanner that finds the top-level members of an
// object and the elements of an array as byte ranges, without decoding the
// values it skips. Requests and items are passed on byte for byte, so the
// package must know where a member starts and ends, which encoding/json does
// not tell; and it must match keys exactly (encoding/json matches struct
// fields case-insensitively, the upstream does not).
//
// The scanner never panics and never reads past its input. It checks
// structure only as far as finding boundaries needs: callers that must
// reject malformed JSON call json.Valid first.

// member is one member of a JSON object, as offsets into the scanned bytes.
type member struct {
	start    int // the key's opening quote
	valStart int // the value's first byte
	end      int // one past the value's last byte
}

// scanObject calls fn for each member of the JSON object in b, in order, with
// the key's token (quotes included) and whether it holds escapes. It returns
// the offset of the closing brace, and false when b does not start (after
// whitespace) with a well-delimited object; fn may then have been called for
// the members before the fault. Bytes after the closing brace are ignored.
func scanObject(b []byte, fn func(key []byte, escaped bool, m member)) (closing int, ok bool) {
	i := wire.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	i = wire.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, false
		}
		keyEnd, escaped, ok := wire.ScanString(b, i)
		if !ok {
			return 0, false
		}
		j := wire.SkipSpace(b, keyEnd)
		if j >= len(b) || b[j] != ':' {
			return 0, false
		}
		vs := wire.SkipSpace(b, j+1)
		ve, ok := wire.SkipValue(b, vs)
		if !ok {
			return 0, false
		}
		fn(b[i:keyEnd], escaped, member{start: i, valStart: vs, end: ve})
		i = wire.SkipSpace(b, ve)
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case '}':
			return i, true
		case ',':
			i = wire.SkipSpace(b, i+1)
		default:
			return 0, false
		}
	}
}

// scanArray calls fn for each element of the JSON array in b, in order. It
// returns false when b does not start (after whitespace) with a
// well-delimited array.
func scanArray(b []byte, fn func(elem []byte)) bool {
	i := wire.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = wire.SkipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return true
	}
	for {
		end, ok := wire.SkipValue(b, i)
		if !ok {
			return false
		}
		fn(b[i:end])
		i = wire.SkipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ']':
			return true
		case ',':
			i = wire.SkipSpace(b, i+1)
		default:
			return false
		}
	}
}

// keyName returns the name a key token spells. Unescaped keys are returned
// as a sub-slice (no allocation); escaped ones are decoded, and a key that
// does not decode matches nothing.
func keyName(tok []byte, escaped bool) []byte {
	if len(tok) < 2 {
		return nil
	}
	if !escaped {
		return tok[1 : len(tok)-1]
	}
	var s string
	if json.Unmarshal(tok, &s) != nil {
		return nil
	}
	return []byte(s)
}

// stringValue returns the string a JSON string token holds; ok is false when
// v is not a string.
func stringValue(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1]), true
	}
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// stringBytes is stringValue without the copy when v holds no escapes: the
// result may alias v. It is nil when v is not a string.
func stringBytes(v []byte) []byte {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1]
	}
	if s, ok := stringValue(v); ok {
		return []byte(s)
	}
	return nil
}

func isNull(v []byte) bool { return string(v) == "null" }

// hasValue reports whether a value carries something: not null and not the
// empty string. Ciphertext and file ids are strings; any other non-null
// value is counted too, so an odd shape errs on the side of "present".
func hasValue(v []byte) bool {
	return len(v) > 0 && !isNull(v) && string(v) != `""`
}

// rewriteObject returns a copy of the object obj (whose members ms and
// closing brace offset were found by scanObject) with the members whose drop
// flag is set removed, the value of member replace (if >= 0) written by
// value, and, when addKey is not empty, a member addKey:value appended at the
// end. Everything else, including whitespace and key order, is kept byte for
// byte: a kept member is followed by the separator that followed it before.
func rewriteObject(obj []byte, ms []member, closing int, drop []bool, replace int, addKey string, value func([]byte) []byte, sizeHint int) []byte {
	out := make([]byte, 0, len(obj)+sizeHint)
	if len(ms) == 0 {
		out = append(out, obj[:closing]...)
	} else {
		out = append(out, obj[:ms[0].start]...)
	}
	wrote := false
	for i, m := range ms {
		if drop[i] {
			continue
		}
		if wrote {
			out = append(out, obj[ms[i-1].end:m.start]...) // holds exactly one comma
		}
		if i == replace {
			out = append(out, obj[m.start:m.valStart]...)
			out = value(out)
		} else {
			out = append(out, obj[m.start:m.end]...)
		}
		wrote = true
	}
	if addKey != "" {
		if wrote {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, addKey...)
		out = append(out, `":`...)
		out = value(out)
	}
	if len(ms) == 0 {
		return append(out, obj[closing:]...)
	}
	return append(out, obj[ms[len(ms)-1].end:]...)
}
