package wire

import "bytes"

// A minimal JSON scanner shared by the packages that must find boundaries in
// raw JSON without decoding it (event sniffing here, request surgery in
// continuity). It never panics and never reads past its input, and checks
// structure only as far as finding boundaries needs: callers that must reject
// malformed JSON validate first.

// SkipSpace returns the index of the first non-space byte at or after i.
func SkipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// ScanString scans the JSON string whose opening quote is b[i] and returns
// the index just past its closing quote, and whether it holds escapes.
// Long strings (message text, ciphertext, tool output) dominate items, so it
// jumps from quote to quote instead of stepping byte by byte: a quote closes
// the string unless an odd run of backslashes precedes it.
func ScanString(b []byte, i int) (end int, escaped, ok bool) {
	j := i + 1
	for j <= len(b) {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false, false
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, bytes.IndexByte(b[i+1:q], '\\') >= 0, true
		}
		j = q + 1
	}
	return 0, false, false
}

// SkipValue returns the index just past the JSON value that starts at b[i].
// Containers are skipped by bracket depth, honouring strings; scalars run to
// the next delimiter.
func SkipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		end, _, ok := ScanString(b, i)
		return end, ok
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _, ok := ScanString(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	default:
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ':', '"', '{', '[', ' ', '\t', '\n', '\r':
				return j, j > i
			}
			j++
		}
		return j, j > i
	}
}
