package wire

import "encoding/json"

// EventType returns the value of the top-level "type" field of the JSON
// object in data, and whether one was found.
//
// It scans instead of decoding, so it is cheap on the per-event path: it
// allocates nothing for the event types this package names and for other
// values that need no unescaping (only the returned string, for an unknown
// type). It skips nested objects, arrays and strings without looking into
// them, and it does not validate what follows the field: a relay that only
// routes an event needs its type, not a full decode. The first "type" key
// wins, and a value that needs no unescaping is returned byte for byte (even
// invalid UTF-8, which a full decode would replace). ok is false when data is not an object, has no top-level "type", or
// its value is not a string.
func EventType(data []byte) (typ string, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", false
	}
	i++
	for {
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != '"' {
			return "", false
		}
		keyEnd, keyEscaped, ok := scanString(data, i)
		if !ok {
			return "", false
		}
		isType := false
		if keyEscaped {
			var k string
			isType = json.Unmarshal(data[i:keyEnd], &k) == nil && k == "type"
		} else {
			isType = string(data[i+1:keyEnd-1]) == "type"
		}
		i = skipSpace(data, keyEnd)
		if i >= len(data) || data[i] != ':' {
			return "", false
		}
		i = skipSpace(data, i+1)
		if isType {
			if i >= len(data) || data[i] != '"' {
				return "", false
			}
			end, escaped, ok := scanString(data, i)
			if !ok {
				return "", false
			}
			if escaped {
				var s string
				if json.Unmarshal(data[i:end], &s) != nil {
					return "", false
				}
				return s, true
			}
			return internEventType(data[i+1 : end-1]), true
		}
		if i, ok = skipValue(data, i); !ok {
			return "", false
		}
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != ',' {
			return "", false
		}
		i++
	}
}

// internEventType returns the constant for a known event type, so the common
// case allocates nothing (the compiler does not copy b for the switch).
func internEventType(b []byte) string {
	switch string(b) {
	case EventResponseCreated:
		return EventResponseCreated
	case EventResponseInProgress:
		return EventResponseInProgress
	case EventOutputItemAdded:
		return EventOutputItemAdded
	case EventOutputItemDone:
		return EventOutputItemDone
	case EventContentPartAdded:
		return EventContentPartAdded
	case EventContentPartDone:
		return EventContentPartDone
	case EventOutputTextDelta:
		return EventOutputTextDelta
	case EventOutputTextDone:
		return EventOutputTextDone
	case EventFunctionCallArgumentsDelta:
		return EventFunctionCallArgumentsDelta
	case EventFunctionCallArgumentsDone:
		return EventFunctionCallArgumentsDone
	case EventCustomToolCallInputDelta:
		return EventCustomToolCallInputDelta
	case EventReasoningSummaryTextDelta:
		return EventReasoningSummaryTextDelta
	case EventResponseCompleted:
		return EventResponseCompleted
	case EventResponseFailed:
		return EventResponseFailed
	case EventResponseIncomplete:
		return EventResponseIncomplete
	case EventResponseMetadata:
		return EventResponseMetadata
	case EventError:
		return EventError
	case EventRateLimits:
		return EventRateLimits
	case MessageResponseCreate:
		return MessageResponseCreate
	}
	return string(b)
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString scans the JSON string starting at data[i] (a quote) and returns
// the index just past its closing quote and whether it contains escapes.
func scanString(data []byte, i int) (end int, escaped, ok bool) {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped, true
		}
	}
	return 0, false, false
}

// skipValue returns the index just past the JSON value starting at data[i].
// Containers are skipped by depth, honouring strings; scalars run to the next
// delimiter. It checks structure only as far as skipping needs.
func skipValue(data []byte, i int) (int, bool) {
	if i >= len(data) {
		return 0, false
	}
	switch data[i] {
	case '"':
		end, _, ok := scanString(data, i)
		return end, ok
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end, _, ok := scanString(data, j)
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
		for j < len(data) {
			switch data[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				if j == i {
					return 0, false
				}
				return j, true
			}
			j++
		}
		return 0, false
	}
}
