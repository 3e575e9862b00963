package relay

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/relay/wire"
)

// apiError is an error as Codex reads it: {"error":{type, code, message, ...}}.
type apiError = wire.Error

// writeError answers an HTTP request with one error in the Responses shape.
func writeError(w http.ResponseWriter, status int, e apiError) {
	b, _ := json.Marshal(wire.ErrorBody{Error: e})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// answer is what a client gets when a request cannot be served.
type answer struct {
	Status int
	Err    apiError
	Header http.Header
}

// selectionAnswer maps a selection failure to the answer Codex understands
// best: a conflict is 409; an unavailable owner or an exhausted pool is 429
// usage_limit_reached with the reset time when one is known (Codex then shows
// "try again at"), else 503.
func selectionAnswer(err error, now time.Time) answer {
	var conflict *ConflictError
	var owner *OwnerUnavailableError
	var none *NoAccountError
	switch {
	case errors.As(err, &conflict):
		return answer{Status: http.StatusConflict, Err: apiError{Type: "invalid_request_error", Code: "continuity_owner_conflict",
			Message: "this request carries continuity evidence for more than one account (turn state, previous response, lane or pin); nothing was sent upstream"}}
	case errors.As(err, &owner):
		until := owner.Account.StatusUntil
		if !until.IsZero() && until.After(now) {
			return usageLimitAnswer(until, now, "the account that holds this conversation is unavailable ("+owner.Cause+")")
		}
		return answer{Status: http.StatusServiceUnavailable, Err: apiError{Type: "server_error", Code: "continuity_owner_unavailable",
			Message: "the account that holds this conversation (" + string(owner.Source) + ") cannot serve: " + owner.Cause}}
	case errors.As(err, &none):
		if !none.EarliestReset.IsZero() {
			return usageLimitAnswer(none.EarliestReset, now, "every account in this key's scope is at its usage limit")
		}
		if none.Considered == 0 {
			return answer{Status: http.StatusServiceUnavailable, Err: apiError{Type: "server_error", Code: "no_accounts",
				Message: "no upstream account is configured in this client key's scope"}}
		}
		return answer{Status: http.StatusServiceUnavailable, Err: apiError{Type: "server_error", Code: wire.CodeServerIsOverloaded,
			Message: "no account in this key's scope can serve now (paused, re-auth required or at capacity)"}}
	}
	return answer{Status: http.StatusInternalServerError, Err: apiError{Type: "server_error", Message: "internal error"}}
}

func usageLimitAnswer(until, now time.Time, msg string) answer {
	secs := int64(until.Sub(now).Seconds())
	if secs < 0 {
		secs = 0
	}
	return answer{Status: http.StatusTooManyRequests, Err: apiError{Type: wire.TypeUsageLimitReached, Message: msg,
		ResetsAt: until.Unix(), ResetsInSeconds: secs}}
}

// errorEvent encodes a WebSocket error event as Codex reads it.
func errorEvent(status int, e apiError) []byte {
	return mustJSON(wire.NewErrorEvent(status, e, nil))
}
