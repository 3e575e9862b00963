package relay

import (
	"cmp"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// Class names how an attempt ended.
type Class string

const (
	ClassOK           Class = "ok"
	ClassUsageLimit   Class = "usage_limit" // 429 usage_limit_reached
	ClassRateLimit    Class = "rate_limit"  // 429 rate_limit_exceeded and other 429s
	ClassQuota        Class = "quota"       // insufficient_quota, usage_not_included
	ClassAuth         Class = "auth"        // 401
	ClassBilling      Class = "billing"     // 402
	ClassForbidden    Class = "forbidden"   // 403, 407
	ClassServer       Class = "server"      // 5xx
	ClassTransport    Class = "transport"   // no answer: connect, reset, timeout
	ClassStreamCut    Class = "stream_cut"  // the stream ended without a terminal event
	ClassStall        Class = "stall"       // nothing arrived within the idle deadline
	ClassInvalid      Class = "invalid"     // the request itself was refused (400, 404, 413, 422)
	ClassPrevNotFound Class = "previous_response_not_found"
	ClassCiphertext   Class = "ciphertext" // invalid_encrypted_content and its kin
	ClassFailed       Class = "failed"     // response.failed / error event after work
	ClassCancelled    Class = "cancelled"  // the client went away
)

// Action is what to do after an attempt.
type Action string

const (
	ActionDone     Action = "done"         // the client got its answer
	ActionNext     Action = "next_account" // the same request on another account
	ActionTerminal Action = "terminal"     // answer the client with this failure
	ActionSame     Action = "same_account" // the same account again (after a token refresh)
)

// Penalty changes an account's status after an attempt.
type Penalty struct {
	Status store.Status
	Reason string
	Until  time.Time // zero: no set end
}

// Outcome is the one classification of an ended attempt.
type Outcome struct {
	Class   Class
	Action  Action
	Penalty *Penalty // nil: the account's health is untouched
}

// AttemptEnd is what is known when an attempt ends.
type AttemptEnd struct {
	Now time.Time
	// Status is the upstream HTTP status (or the status of a WebSocket error
	// event); 0 when none arrived.
	Status int
	// Err is the upstream error body or event, if any.
	Err *wire.Error
	// Transport is set when no answer arrived (or the stream broke).
	Transport error
	// Completed is true when a response.completed (or incomplete) ended it.
	Completed bool
	// StreamCut: the stream ended without any terminal event.
	StreamCut bool
	// Stalled: the idle deadline passed.
	Stalled bool
	// WorkObserved: something semantic already reached the client.
	WorkObserved bool
	// Cancelled: the client went away.
	Cancelled bool
}

// Classify decides, once, what an ended attempt means. Before any work
// reached the client, account causes (limits, auth, billing, 5xx, transport)
// move the same request to the next account and penalise the account; after
// work was observed nothing is retried.
func Classify(e AttemptEnd) Outcome {
	if e.Completed {
		// A client that hangs up right after the terminal event (Codex exits
		// on it) still got its answer: the turn counts, and binds.
		return Outcome{Class: ClassOK, Action: ActionDone}
	}
	if e.Cancelled {
		return Outcome{Class: ClassCancelled, Action: ActionTerminal}
	}
	o := classifyFailure(e)
	if e.WorkObserved {
		// Output reached the client: never replay; keep any penalty so the
		// next request goes elsewhere.
		o.Action = ActionTerminal
	}
	return o
}

func classifyFailure(e AttemptEnd) Outcome {
	var code, typ, msg string
	if e.Err != nil {
		code, typ, msg = e.Err.Code, e.Err.Type, e.Err.Message
	}
	switch {
	case e.Stalled:
		return Outcome{Class: ClassStall, Action: ActionNext}
	case e.StreamCut:
		return Outcome{Class: ClassStreamCut, Action: ActionNext}
	case e.Transport != nil && e.Status == 0:
		return Outcome{Class: ClassTransport, Action: ActionNext}
	case code == wire.CodePreviousResponseNotFound:
		return Outcome{Class: ClassPrevNotFound, Action: ActionTerminal}
	case IsCiphertextRejection(e.Status, e.Err):
		return Outcome{Class: ClassCiphertext, Action: ActionTerminal}
	case typ == wire.TypeUsageLimitReached:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			// The sharing-cap variant says no reset time: cool down a while.
			until = e.Now.Add(30 * time.Minute)
		}
		return Outcome{Class: ClassUsageLimit, Action: ActionNext, Penalty: &Penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: until}}
	case typ == wire.TypeUsageNotIncluded || typ == wire.TypeInsufficientQuota || code == wire.CodeInsufficientQuota:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			until = e.Now.Add(time.Hour)
		}
		reason := cmp.Or(code, typ)
		return Outcome{Class: ClassQuota, Action: ActionNext, Penalty: &Penalty{Status: store.StatusQuotaExceeded, Reason: reason, Until: until}}
	case e.Status == http.StatusTooManyRequests || code == wire.CodeRateLimitExceeded:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			until = e.Now.Add(retryAfter(msg, time.Minute))
		}
		return Outcome{Class: ClassRateLimit, Action: ActionNext, Penalty: &Penalty{Status: store.StatusRateLimited, Reason: cmp.Or(code, "rate_limited"), Until: until}}
	case e.Status == http.StatusUnauthorized:
		return Outcome{Class: ClassAuth, Action: ActionNext, Penalty: &Penalty{Status: store.StatusReauthRequired, Reason: cmp.Or(code, "upstream answered 401")}}
	case e.Status == http.StatusPaymentRequired:
		return Outcome{Class: ClassBilling, Action: ActionNext, Penalty: &Penalty{Status: store.StatusQuotaExceeded, Reason: cmp.Or(code, "upstream answered 402 (billing)"), Until: e.Now.Add(time.Hour)}}
	case e.Status == http.StatusForbidden || e.Status == http.StatusProxyAuthRequired:
		return Outcome{Class: ClassForbidden, Action: ActionNext, Penalty: &Penalty{Status: store.StatusRateLimited, Reason: "upstream answered " + strconv.Itoa(e.Status) + ": cooling down", Until: e.Now.Add(10 * time.Minute)}}
	case e.Status >= 500 || code == wire.CodeServerIsOverloaded || typ == wire.TypeServerError:
		return Outcome{Class: ClassServer, Action: ActionNext}
	case e.Status >= 400:
		return Outcome{Class: ClassInvalid, Action: ActionTerminal}
	}
	return Outcome{Class: ClassFailed, Action: ActionTerminal}
}

// IsCiphertextRejection reports an upstream refusing ciphertext it did not
// issue: the structured code, or the wording of a rejection that arrives
// without one (seed 000).
func IsCiphertextRejection(status int, e *wire.Error) bool {
	if e == nil || status == http.StatusUnauthorized || status == http.StatusPaymentRequired ||
		status == http.StatusForbidden || status == http.StatusProxyAuthRequired || status == http.StatusTooManyRequests {
		return false
	}
	if e.Code == wire.CodeInvalidEncryptedContent {
		return true
	}
	m := strings.ToLower(e.Message)
	return strings.Contains(m, "could not be decrypted") || strings.Contains(m, "encrypted content") && strings.Contains(m, "could not be verified")
}

func resetTime(now time.Time, e *wire.Error) time.Time {
	if e == nil {
		return time.Time{}
	}
	if e.ResetsAt > 0 {
		return time.Unix(e.ResetsAt, 0).UTC()
	}
	if e.ResetsInSeconds > 0 {
		return now.Add(time.Duration(e.ResetsInSeconds) * time.Second)
	}
	return time.Time{}
}

var tryAgainIn = regexp.MustCompile(`(?i)try again in ([0-9.]+)\s*(ms|s|m)`)

// retryAfter reads "try again in Ns" from a rate-limit message.
func retryAfter(msg string, def time.Duration) time.Duration {
	m := tryAgainIn.FindStringSubmatch(msg)
	if m == nil {
		return def
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || v <= 0 {
		return def
	}
	switch m[2] {
	case "ms":
		return time.Duration(v * float64(time.Millisecond))
	case "m":
		return time.Duration(v * float64(time.Minute))
	}
	return time.Duration(v * float64(time.Second))
}

// errStall is the transport error of a stream that went quiet.
var errStall = errors.New("upstream sent nothing within the idle deadline")
