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
	i := SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", false
	}
	i++
	for {
		i = SkipSpace(data, i)
		if i >= len(data) || data[i] != '"' {
			return "", false
		}
		keyEnd, keyEscaped, ok := ScanString(data, i)
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
		i = SkipSpace(data, keyEnd)
		if i >= len(data) || data[i] != ':' {
			return "", false
		}
		i = SkipSpace(data, i+1)
		if isType {
			if i >= len(data) || data[i] != '"' {
				return "", false
			}
			end, escaped, ok := ScanString(data, i)
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
		if i, ok = SkipValue(data, i); !ok {
			return "", false
		}
		i = SkipSpace(data, i)
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
