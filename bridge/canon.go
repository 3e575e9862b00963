package bridge

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/codexrelay/codex-relay/internal/wire"
)

var errMalformed = errors.New("bridge: malformed JSON")

// member is one member of a JSON object: its key, unescaped, and the raw
// bytes of its value.
type member struct {
	key []byte
	val []byte
}

// objectMembers splits the JSON object b into its members, in order. It
// reports false when b is not one well-formed object.
func objectMembers(b []byte) ([]member, bool) {
	i := wire.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	out := make([]member, 0, 4) // most objects have a few members
	i = wire.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return out, wire.SkipSpace(b, i+1) == len(b)
	}
	for i < len(b) {
		if b[i] != '"' {
			return nil, false
		}
		end, escaped, ok := wire.ScanString(b, i)
		if !ok {
			return nil, false
		}
		key, ok := stringValue(nil, b[i:end], escaped)
		if !ok {
			return nil, false
		}
		i = wire.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = wire.SkipSpace(b, i+1)
		vend, ok := wire.SkipValue(b, i)
		if !ok {
			return nil, false
		}
		out = append(out, member{key: key, val: b[i:vend]})
		i = wire.SkipSpace(b, vend)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = wire.SkipSpace(b, i+1)
		case '}':
			return out, wire.SkipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
	return nil, false
}

// stringValue returns the content of the JSON string s (quotes included),
// unescaped as encoding/json reads it, appended to dst. Without escapes and
// with valid UTF-8 it is s's own bytes, not a copy.
func stringValue(dst, s []byte, escaped bool) ([]byte, bool) {
	body := s[1 : len(s)-1]
	if !escaped && utf8.Valid(body) {
		for _, c := range body {
			if c < 0x20 {
				return nil, false
			}
		}
		if dst == nil {
			return body, true
		}
		return append(dst, body...), true
	}
	for i := 0; i < len(body); {
		c := body[i]
		switch {
		case c == '\\':
			if i+1 >= len(body) {
				return nil, false
			}
			switch e := body[i+1]; e {
			case '"', '\\', '/':
				dst = append(dst, e)
				i += 2
			case 'b':
				dst, i = append(dst, '\b'), i+2
			case 'f':
				dst, i = append(dst, '\f'), i+2
			case 'n':
				dst, i = append(dst, '\n'), i+2
			case 'r':
				dst, i = append(dst, '\r'), i+2
			case 't':
				dst, i = append(dst, '\t'), i+2
			case 'u':
				r, ok := hex4(body, i+2)
				if !ok {
					return nil, false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; a lone half is U+FFFD.
					r2, ok := rune(-1), false
					if i+1 < len(body) && body[i] == '\\' && body[i+1] == 'u' {
						r2, ok = hex4(body, i+2)
					}
					if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
						r = dec
						i += 6
					} else {
						r = utf8.RuneError
					}
				}
				dst = utf8.AppendRune(dst, r)
			default:
				return nil, false
			}
		case c < 0x20:
			return nil, false
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(body[i:])
			dst = utf8.AppendRune(dst, r) // an invalid byte becomes U+FFFD
			i += size
		}
	}
	if dst == nil {
		dst = []byte{}
	}
	return dst, true
}

// hex4 reads the four hex digits of a \u escape at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// stringMember returns the string value of the member named key, if any.
func stringMember(ms []member, key string) string {
	for _, m := range ms {
		if string(m.key) == key && len(m.val) > 0 && m.val[0] == '"' {
			end, escaped, ok := wire.ScanString(m.val, 0)
			if ok && end == len(m.val) {
				if v, ok := stringValue(nil, m.val, escaped); ok {
					return string(v)
				}
			}
		}
	}
	return ""
}

// canonical writes to h an encoding of the JSON value b that is the same
// for every spelling of one value: whitespace is dropped, object members go
// in key order, strings by their unescaped content, numbers by their
// float64 value. Every part is tagged and length-prefixed, so different
// values never meet. It is what decoding into any and re-marshalling did,
// without building the value.
func canonical(h hash.Hash, b []byte) error {
	var scratch [9]byte
	var buf []byte
	tag := func(t byte, n uint64) {
		scratch[0] = t
		binary.BigEndian.PutUint64(scratch[1:], n)
		h.Write(scratch[:])
	}
	var value func(v []byte) error
	value = func(v []byte) error {
		if len(v) == 0 {
			return errMalformed
		}
		switch v[0] {
		case '{':
			ms, ok := objectMembers(v)
			if !ok {
				return errMalformed
			}
			slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
			// A repeated key counts once, with its last value, as a decoder reads it.
			kept := ms[:0]
			for i, m := range ms {
				if i+1 < len(ms) && bytes.Equal(ms[i+1].key, m.key) {
					continue
				}
				kept = append(kept, m)
			}
			ms = kept
			tag('o', uint64(len(ms)))
			for _, m := range ms {
				tag('k', uint64(len(m.key)))
				h.Write(m.key)
				if err := value(m.val); err != nil {
					return err
				}
			}
		case '[':
			i := wire.SkipSpace(v, 1)
			n := uint64(0)
			tag('a', 0)
			for i < len(v) && v[i] != ']' {
				end, ok := wire.SkipValue(v, i)
				if !ok {
					return errMalformed
				}
				if err := value(v[i:end]); err != nil {
					return err
				}
				n++
				i = wire.SkipSpace(v, end)
				if i < len(v) && v[i] == ',' {
					i = wire.SkipSpace(v, i+1)
				} else if i >= len(v) || v[i] != ']' {
					return errMalformed
				}
			}
			if i >= len(v) || wire.SkipSpace(v, i+1) != len(v) {
				return errMalformed
			}
			tag('A', n)
		case '"':
			end, escaped, ok := wire.ScanString(v, 0)
			if !ok || end != len(v) {
				return errMalformed
			}
			str, ok := stringValue(buf[:0], v, escaped)
			if !ok {
				return errMalformed
			}
			if escaped {
				buf = str // reuse the grown buffer for the next escaped string
			}
			tag('s', uint64(len(str)))
			h.Write(str)
		case 't', 'f', 'n':
			switch string(v) {
			case "true":
				tag('t', 0)
			case "false":
				tag('f', 0)
			case "null":
				tag('z', 0)
			default:
				return errMalformed
			}
		default:
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil || !json.Valid(v) {
				return errMalformed
			}
			tag('n', math.Float64bits(f))
		}
		return nil
	}
	i := wire.SkipSpace(b, 0)
	end, ok := wire.SkipValue(b, i)
	if !ok || wire.SkipSpace(b, end) != len(b) {
		return errMalformed
	}
	return value(b[i:end])
}
