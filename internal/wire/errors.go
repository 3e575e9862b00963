package wire

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Error types ("type" of an error object) that Codex and the relay act upon.
const (
	TypeInvalidRequest    = "invalid_request_error"
	TypeUsageLimitReached = "usage_limit_reached"
	TypeUsageNotIncluded  = "usage_not_included"
	TypeRateLimit         = "requests"
	TypeInsufficientQuota = "insufficient_quota"
	TypeServerError       = "server_error"
	TypeInvalidGrant      = "invalid_grant"
)

// Error codes ("code" of an error object) that Codex and the relay act upon.
const (
	CodeInvalidEncryptedContent         = "invalid_encrypted_content"
	CodePreviousResponseNotFound        = "previous_response_not_found"
	CodeWebSocketConnectionLimitReached = "websocket_connection_limit_reached"
	CodeRateLimitExceeded               = "rate_limit_exceeded"
	CodeInsufficientQuota               = "insufficient_quota"
	CodeServerIsOverloaded              = "server_is_overloaded"
	CodeContextLengthExceeded           = "context_length_exceeded"
	CodeInvalidAPIKey                   = "invalid_api_key"
	CodeTokenExpired                    = "token_expired"
	CodeRefreshTokenReused              = "refresh_token_reused"
	CodeRefreshTokenInvalidated         = "refresh_token_invalidated"
)

// Error is the error object of the Responses API, as found in an HTTP error
// body, a WebSocket error event, and (Type aside) a response.failed event.
// The usage-limit fields appear only on usage_limit_reached errors: Codex
// shows "try again at <time>" from ResetsAt.
type Error struct {
	Type            string `json:"type,omitempty"`
	Code            string `json:"code,omitempty"`
	Message         string `json:"message"`
	Param           string `json:"param,omitempty"`
	PlanType        string `json:"plan_type,omitempty"`
	ResetsAt        int64  `json:"resets_at,omitempty"`
	ResetsInSeconds int64  `json:"resets_in_seconds,omitempty"`
}

// Error returns a one-line description, so an *Error can travel as an error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("upstream error")
	for _, s := range []string{e.Type, e.Code} {
		if s != "" {
			b.WriteString(" ")
			b.WriteString(s)
		}
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// ErrorBody is the JSON body of an HTTP error answer:
// {"error":{"type":...,"code":...,"message":...}}.
type ErrorBody struct {
	Error Error `json:"error"`
}

// ParseErrorBody decodes an HTTP error body. ok is false when b is not of
// that shape. Real upstreams send "code": null and "param": null, which
// decode as empty strings.
func ParseErrorBody(b []byte) (e Error, ok bool) {
	var body struct {
		Error *json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &body) != nil || body.Error == nil {
		return Error{}, false
	}
	if err := decodeError(*body.Error, &e); err != nil {
		return Error{}, false
	}
	return e, true
}

// decodeError decodes an error object leniently: fields of unexpected JSON
// types (a numeric code, a null type) are left empty instead of failing.
func decodeError(raw []byte, e *Error) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	str := func(k string) string {
		var s string
		if v, ok := m[k]; ok && json.Unmarshal(v, &s) == nil {
			return s
		}
		return ""
	}
	num := func(k string) int64 {
		var f float64
		if v, ok := m[k]; ok && json.Unmarshal(v, &f) == nil {
			return int64(f)
		}
		return 0
	}
	*e = Error{
		Type:            str("type"),
		Code:            str("code"),
		Message:         str("message"),
		Param:           str("param"),
		PlanType:        str("plan_type"),
		ResetsAt:        num("resets_at"),
		ResetsInSeconds: num("resets_in_seconds"),
	}
	return nil
}

// ErrorEvent is the WebSocket form of an HTTP error answer: the status the
// HTTP answer would have had, its error object, and the headers it would have
// carried (rate-limit headers, for example), as one text frame
// {"type":"error","status":429,"error":{...},"headers":{...}}.
type ErrorEvent struct {
	Type    string            `json:"type"`
	Status  int               `json:"status"`
	Error   Error             `json:"error"`
	Headers map[string]string `json:"headers,omitempty"`
}

// NewErrorEvent returns the error event for an HTTP answer with status, error
// object e and headers h (nil for none). Each header keeps its first value,
// under its lower-case name.
func NewErrorEvent(status int, e Error, h http.Header) ErrorEvent {
	ev := ErrorEvent{Type: EventError, Status: status, Error: e}
	if len(h) > 0 {
		ev.Headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				ev.Headers[strings.ToLower(k)] = v[0]
			}
		}
	}
	return ev
}

// ParseErrorEvent decodes a WebSocket error event. ok is false when b is not
// an event of type "error" with an error object.
func ParseErrorEvent(b []byte) (ev ErrorEvent, ok bool) {
	var raw struct {
		Type    string            `json:"type"`
		Status  int               `json:"status"`
		Error   *json.RawMessage  `json:"error"`
		Headers map[string]string `json:"headers"`
	}
	if json.Unmarshal(b, &raw) != nil || raw.Type != EventError || raw.Error == nil {
		return ErrorEvent{}, false
	}
	ev = ErrorEvent{Type: raw.Type, Status: raw.Status, Headers: raw.Headers}
	if decodeError(*raw.Error, &ev.Error) != nil {
		return ErrorEvent{}, false
	}
	return ev, true
}
