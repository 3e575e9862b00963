package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// apiError is an error as Codex reads it: {"error":{type, code, message, ...}}.
type apiError = wire.Error

// statusClientClosed is recorded (never sent) for a request whose client
// went away before its answer: the de-facto code for it.
const statusClientClosed = 499

// failure is an answer the client has not been sent: an upstream's error as
// it came (held back so the request could still move to another account),
// or one the relay makes. The SSE client sends it as an HTTP error (or, once
// keep-alives committed its answer, as a response.failed event); the
// WebSocket client as an error event.
type failure struct {
	status int
	err    apiError
	// header holds upstream answer headers worth passing on (rate limits,
	// request ids); nil for the relay's own failures.
	header http.Header
	// body is the upstream's HTTP error body as it came; nil: encode err.
	body []byte
	// event is the upstream's terminal event as it came over a lane; nil:
	// encode status and err.
	event []byte
}

// code is the failure's stable code, for records.
func (f *failure) code() string { return cmp.Or(f.err.Code, f.err.Type) }

// httpBody is the failure as an HTTP error body.
func (f *failure) httpBody() []byte {
	if f.body != nil {
		return f.body
	}
	return errorJSON(f.err)
}

// wsEvent is the failure as a WebSocket error event.
func (f *failure) wsEvent() []byte {
	if f.event != nil {
		return f.event
	}
	return mustJSON(wire.NewErrorEvent(f.status, f.err, f.header))
}

// screen is the failure f of an attempt of class as the client may see it.
// An upstream's own error whose class says it is about the account rather
// than the request (its credentials, its billing, what it may do) or that
// the relay cannot read (a server error) is answered with the relay's
// sentence: such bodies have held the account's API key ("Incorrect API key
// provided: sk-..."), and none helps the client, who cannot act on the
// account. The status, the error's type and code, and the headers worth
// passing (request ids, rate limits) stay. Any other upstream error passes
// as it came, credential-shaped text masked. The attempt record keeps the
// upstream's message, masked too. Pure.
func screen(f *failure, class attemptClass) *failure {
	if f == nil || f.body == nil && f.event == nil {
		return f
	}
	var msg string
	switch class {
	case classAuth:
		msg = "the upstream account's credentials were refused; its operator must sign it in again or replace its key"
	case classBilling:
		msg = "the upstream account's billing refused the request"
	case classForbidden:
		msg = "the upstream account may not make this request"
	case classServer:
		msg = "the upstream account failed the request (" + strconv.Itoa(f.status) + " " + http.StatusText(f.status) + ")"
	default:
		out := *f
		if f.body != nil {
			out.body = wire.MaskSecrets(f.body)
		}
		if f.event != nil {
			out.event = wire.MaskSecrets(f.event)
		}
		out.err.Message = wire.MaskSecretsString(f.err.Message)
		return &out
	}
	e := apiError{Type: cmp.Or(f.err.Type, wire.TypeServerError), Code: f.err.Code, Message: msg}
	if e.Code == "" && class == classAuth {
		e.Code = "upstream_auth_failed"
	}
	return &failure{status: f.status, err: e, header: f.header}
}

// screenAnswer is an upstream's HTTP error answer to a one-shot request
// (a model list, a goal call) as the client may see it: classified as an
// attempt's would be, then screened.
func screenAnswer(status int, header http.Header, body []byte, now time.Time) *failure {
	f := &failure{status: status, header: header, body: body}
	if e, ok := wire.ParseErrorBody(body); ok {
		f.err = e
	}
	var ep *apiError
	if f.err != (apiError{}) {
		ep = &f.err
	}
	return screen(f, classify(attemptEnd{Now: now, Status: status, Err: ep}).Class)
}

// relayFailure is a failure the relay makes: a stable code and a plain
// sentence. The cause (a dial error, an account id, an upstream URL) goes
// to the log and the attempt record, never to the client.
func relayFailure(status int, typ, code, msg string) *failure {
	return &failure{status: status, err: apiError{Type: typ, Code: code, Message: msg}}
}

// failUnreachable: the upstream could not be reached (the dial error goes
// to the attempt record).
func failUnreachable() *failure {
	return relayFailure(http.StatusBadGateway, wire.TypeServerError, "upstream_unreachable", "the upstream account could not be reached")
}

// failInterrupted: the upstream's answer broke off before any output.
func failInterrupted() *failure {
	return relayFailure(http.StatusBadGateway, wire.TypeServerError, "upstream_stream_interrupted", "the upstream ended the answer before any output")
}

// failNoLane: no lane slot on the account within the wait.
func failNoLane() *failure {
	return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, wire.CodeServerIsOverloaded, "no upstream connection could be opened for this account now")
}

// failExhausted: the attempt budget ran out with no account's failure to
// show.
func failExhausted() *failure {
	return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, wire.CodeServerIsOverloaded, "no account could serve this request")
}

// requestError is a request the relay refuses itself, before any attempt:
// its status and the error the client reads.
type requestError struct {
	status int
	err    apiError
}

func (e *requestError) Error() string { return e.err.Message }

func refuse(status int, code, msg string) *requestError {
	return &requestError{status: status, err: apiError{Type: wire.TypeInvalidRequest, Code: code, Message: msg}}
}

// storeError is a request the relay could not serve because its database
// did not answer.
type storeError struct {
	op  string
	err error
}

func (e *storeError) Error() string { return e.op + ": " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

func storeUnavailable(op string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &storeError{op: op, err: err}
}

// failureFor maps every error that ends a request before (or instead of)
// an upstream answer to what the client gets, and the class it is recorded
// under. It is the one place such errors become client answers: a conflict
// is 409; an unavailable owner, an exhausted pool, or a compaction whose
// organisation has no account left is 429 usage_limit_reached with the
// reset time when one is known (Codex shows "try again at"), else 503; a
// database that does not answer is 503 store_unavailable; a client that
// went away gets nothing (recorded as 499).
// Messages never carry account ids, upstream URLs or dial errors.
func failureFor(err error, now time.Time) (*failure, attemptClass) {
	var conflict *conflictError
	var owner *ownerUnavailableError
	var none *noAccountError
	var refused *requestError
	var st *storeError
	var limited *keyLimitError
	var stuck *compactionStuckError
	var wrongKeys *keyFailuresError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return &failure{status: statusClientClosed, err: apiError{Type: wire.TypeInvalidRequest, Code: "client_closed", Message: "the client went away"}}, classCancelled
	case errors.As(err, &refused):
		return &failure{status: refused.status, err: refused.err}, classInvalid
	case errors.As(err, &wrongKeys):
		secs := int64(wrongKeys.wait / time.Second)
		return &failure{status: http.StatusTooManyRequests, header: http.Header{"Retry-After": {strconv.FormatInt(secs, 10)}},
			err: apiError{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidAPIKey,
				Message: fmt.Sprintf("%s, and too many wrong client keys came from your address: try again in %d s", msgKeyRejected, secs)}}, classInvalid
	case errors.As(err, &conflict):
		return relayFailure(http.StatusConflict, wire.TypeInvalidRequest, "continuity_owner_conflict",
			fmt.Sprintf("this request's %s and %s belong to different accounts; nothing was sent upstream",
				conflict.A.source.describe(), conflict.B.source.describe())), classConflict
	case errors.As(err, &owner) && owner.Source == hardObject:
		// Objects never move: the client is told to wait, never given a
		// 404 from an account that lacks the object.
		return relayFailure(http.StatusConflict, codeObjectUnavailable, codeObjectUnavailable,
			"the account that holds this object cannot serve now ("+statusWords(owner)+"); objects live on the account "+
				"that created them: try again later"), classNoAccount
	case errors.As(err, &owner):
		until := owner.Account.StatusUntil
		if !until.IsZero() && until.After(now) {
			return usageLimitFailure(until, now, "the account that holds this conversation is unavailable ("+owner.Cause+")"), classNoAccount
		}
		return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, "continuity_owner_unavailable",
			"the account that holds this conversation ("+owner.Source.describe()+") cannot serve: "+owner.Cause), classNoAccount
	case errors.As(err, &stuck):
		if !stuck.EarliestReset.IsZero() {
			return usageLimitFailure(stuck.EarliestReset, now, "the accounts that can read this conversation are at their usage limit; "+
				"it is compacted only there"), classNoAccount
		}
		return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, "compaction_unavailable",
			"no account that can read this conversation can compact it now (paused, re-auth required or at capacity); "+
				"it is compacted only there"), classNoAccount
	case errors.As(err, &none):
		if !none.EarliestReset.IsZero() {
			return usageLimitFailure(none.EarliestReset, now, "every account in this key's scope is at its usage limit"), classNoAccount
		}
		if none.Considered == 0 {
			return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, "no_accounts",
				"no upstream account is configured in this client key's scope"), classNoAccount
		}
		return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, wire.CodeServerIsOverloaded,
			"no account in this key's scope can serve now (paused, re-auth required or at capacity)"), classNoAccount
	case errors.As(err, &limited):
		f := usageLimitFailure(limited.retryAt, now, fmt.Sprintf("this client key is at its limit of %s %s (%s used)",
			formatAmount(limited.limit.Max), limitUnit(limited.limit), formatAmount(limited.used)))
		f.header = http.Header{HeaderLimit: {limited.limit.Name()}}
		return f, classKeyLimit
	case errors.As(err, &st):
		return relayFailure(http.StatusServiceUnavailable, wire.TypeServerError, "store_unavailable",
			"the relay's database is not available for this request (it did not answer, or refuses writes); try again shortly"), classStore
	}
	return relayFailure(http.StatusInternalServerError, wire.TypeServerError, "internal_error", "internal error"), classFailed
}

func usageLimitFailure(until, now time.Time, msg string) *failure {
	secs := max(int64(until.Sub(now).Seconds()), 0)
	return &failure{status: http.StatusTooManyRequests, err: apiError{Type: wire.TypeUsageLimitReached, Message: msg,
		ResetsAt: until.Unix(), ResetsInSeconds: secs}}
}

// writeError answers an HTTP request with one error in the OpenAI shape.
func writeError(w http.ResponseWriter, status int, e apiError) {
	b := errorJSON(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeFailure answers an HTTP request with a failure for err, unless the
// client has gone.
func (s *Server) writeFailure(w http.ResponseWriter, err error) {
	f, class := failureFor(err, s.cfg.Now())
	if class == classCancelled {
		return
	}
	if class == classFailed {
		s.log.Error("request failed", "err", err)
	}
	for k, vs := range f.header {
		w.Header()[k] = vs
	}
	writeError(w, f.status, f.err)
}

// errorJSON is an HTTP error body in the OpenAI shape (see openAIError),
// which Codex and every other OpenAI client read.
func errorJSON(e apiError) []byte { return openAIErrorJSON(e) }

// errorEvent encodes a WebSocket error event as Codex reads it.
func errorEvent(status int, e apiError) []byte {
	return mustJSON(wire.NewErrorEvent(status, e, nil))
}

// failedEvent builds a response.failed event for a stream the relay ends.
func failedEvent(responseID, requestID, code, msg string) []byte {
	if responseID == "" {
		responseID = "resp_relay_" + requestID
	}
	return mustJSON(map[string]any{
		"type": wire.EventResponseFailed,
		"response": map[string]any{"id": responseID, "object": "response", "status": "failed",
			"error": map[string]string{"code": code, "message": msg}},
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("relay: encode " + err.Error()) // only fixed shapes are encoded here
	}
	return b
}
