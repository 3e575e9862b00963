package relay

import (
	"cmp"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// attemptClass names how an attempt ended; it is recorded with the attempt
// (the diagnostics' "class") and counted in metrics. The set is closed: every
// value is a constant below.
type attemptClass string

const (
	classOK              attemptClass = "ok"
	classUsageLimit      attemptClass = "usage_limit" // 429 usage_limit_reached
	classRateLimit       attemptClass = "rate_limit"  // 429 rate_limit_exceeded and other 429s
	classQuota           attemptClass = "quota"       // insufficient_quota, usage_not_included
	classAuth            attemptClass = "auth"        // 401
	classBilling         attemptClass = "billing"     // 402
	classForbidden       attemptClass = "forbidden"   // 403, 407
	classServer          attemptClass = "server"      // 5xx
	classTransport       attemptClass = "transport"   // no answer: connect, reset, timeout
	classStreamCut       attemptClass = "stream_cut"  // the stream ended without a terminal event
	classStall           attemptClass = "stall"       // nothing arrived within the idle deadline
	classInvalid         attemptClass = "invalid"     // the request itself was refused (400, 404, 413, 422)
	classPrevNotFound    attemptClass = "previous_response_not_found"
	classCiphertext      attemptClass = "ciphertext"       // invalid_encrypted_content and its kin
	classFailed          attemptClass = "failed"           // response.failed / error event after work
	classCancelled       attemptClass = "cancelled"        // the client went away
	classClientStalled   attemptClass = "client_stalled"   // the client stopped reading: a write to it timed out
	classConnectionLimit attemptClass = "connection_limit" // the upstream retired its WebSocket (60-minute limit)
	classChainRefused    attemptClass = "chain_refused"    // the upstream refused a chain the relay made
	classLaneCapacity    attemptClass = "lane_capacity"    // no lane slot on the account within the wait
	// Classes of requests that ended before any attempt: selection said no.
	classConflict  attemptClass = "conflict"
	classNoAccount attemptClass = "no_account"
	classStore     attemptClass = "store_unavailable"
	classKeyLimit  attemptClass = "key_limit" // the client key is at one of its limits
)

// nextAction is what to do after an attempt.
type nextAction string

const (
	actionDone     nextAction = "done"         // the client got its answer
	actionNext     nextAction = "next_account" // the same request on another account
	actionTerminal nextAction = "terminal"     // answer the client with this failure
	actionSame     nextAction = "same_account" // the same account again (a fresh lane, token or request form)
)

// penalty changes an account's status after an attempt.
type penalty struct {
	Status store.Status
	Reason string
	Until  time.Time // zero: no set end
}

// outcome is the one classification of an ended attempt.
type outcome struct {
	Class   attemptClass
	Action  nextAction
	Penalty *penalty // nil: the account's health is untouched
	// Recovery names what an actionSame retry does ("token_refresh", ...),
	// recorded with the attempt; "" otherwise.
	Recovery string
}

// attemptEnd is everything known when an attempt ends. Attempts gather
// the facts; nothing decides on them but the decision step (decide.go),
// through classify, and the client's failure and the attempt's record are
// built from them (clientFailure, record).
type attemptEnd struct {
	Now time.Time
	// Status is the upstream HTTP status (or the status of a WebSocket error
	// event); 0 when none arrived.
	Status int
	// Err is the upstream error body or event, if any.
	Err *wire.Error
	// RetryAfter is the wait the upstream asked for in its headers
	// (Retry-After, retry-after-ms); zero when it named none.
	RetryAfter time.Duration
	// Transport is set when no answer arrived (or the stream broke).
	Transport error
	// Completed is true when a response.completed (or incomplete) ended it.
	Completed bool
	// StreamCut: the stream ended without any terminal event.
	StreamCut bool
	// Stalled: the idle deadline passed.
	Stalled bool
	// Committed: output reached the client; nothing may be replayed.
	Committed bool
	// Cancelled: the client went away.
	Cancelled bool
	// ClientStalled: the client stopped reading and a write to it timed out.
	ClientStalled bool
	// ChainRefused: the upstream answered previous_response_not_found to a
	// chain the relay made on its lane (it keeps none), not to the client's.
	ChainRefused bool
	// LaneCapacity: the account's lane cap stayed full for the whole wait.
	LaneCapacity bool
	// LaneGone: the upstream had ended the lane's connection before the
	// request went (its age limit, or a close while the lane was idle):
	// nothing was sent, and the account answers fresh connections.
	LaneGone bool
	// Refreshed: the account's token was refreshed after this 401, so the
	// same account may take the request again. Not an attempt's fact: the
	// decision step sets it from the refresh it asked for (decide.go).
	Refreshed bool
	// Began: the upstream's answer had begun (an HTTP answer's headers
	// came, or the request went over a lane): a break after it is an
	// answer interrupted, before it an upstream that could not be reached.
	Began bool
	// Header holds the upstream answer's headers worth passing on with its
	// failure (rate limits, request ids); Body is its HTTP error body as it
	// came, and Event its terminal event as it came over a stream, not sent
	// to the client. Nil when there was none: the failure is encoded from
	// Status and Err (clientFailure).
	Header http.Header
	Body   []byte
	Event  []byte
}

// classify names how an ended attempt ended, and what its class alone
// calls for; decide (decide.go) folds in the request's state. Before any output
// reached the client, account causes (limits, auth, billing, 5xx,
// transport) move the same request to the next account and penalise the
// account, and causes of the relay's own means (a retired connection, a
// refused chain, a refreshed token) retry on the same account; after output,
// nothing is retried.
func classify(e attemptEnd) outcome {
	switch {
	case e.Completed:
		// A client that hangs up right after the terminal event (Codex exits
		// on it) still got its answer: the turn counts, and binds.
		return outcome{Class: classOK, Action: actionDone}
	case e.ClientStalled:
		return outcome{Class: classClientStalled, Action: actionTerminal}
	case e.Cancelled:
		return outcome{Class: classCancelled, Action: actionTerminal}
	}
	o := classifyFailure(e)
	if e.Committed {
		// Output reached the client: never replay; keep any penalty so the
		// next request goes elsewhere.
		o.Action, o.Recovery = actionTerminal, ""
	}
	return o
}

func classifyFailure(e attemptEnd) outcome {
	var code, typ, msg string
	if e.Err != nil {
		code, typ, msg = e.Err.Code, e.Err.Type, e.Err.Message
	}
	switch {
	case e.LaneCapacity:
		return outcome{Class: classLaneCapacity, Action: actionNext}
	case e.LaneGone:
		// The upstream retired the connection before the request reached
		// it: a fresh lane on the same account takes it, with no penalty
		// and no unreachable mark.
		return outcome{Class: classConnectionLimit, Action: actionSame, Recovery: "fresh_lane"}
	case e.Stalled:
		return outcome{Class: classStall, Action: actionNext}
	case e.StreamCut:
		return outcome{Class: classStreamCut, Action: actionNext}
	case e.Transport != nil && e.Status == 0:
		return outcome{Class: classTransport, Action: actionNext}
	case code == wire.CodeWebSocketConnectionLimitReached:
		// The upstream retires connections at its age limit: a fresh lane on
		// the same account takes the request, with no penalty.
		return outcome{Class: classConnectionLimit, Action: actionSame, Recovery: "fresh_lane"}
	case code == wire.CodePreviousResponseNotFound && e.ChainRefused:
		// The relay chained on its lane and the upstream keeps no chains: the
		// same account gets the full request.
		return outcome{Class: classChainRefused, Action: actionSame, Recovery: "full_request"}
	case code == wire.CodePreviousResponseNotFound:
		return outcome{Class: classPrevNotFound, Action: actionTerminal}
	case isCiphertextRejection(e.Status, e.Err):
		return outcome{Class: classCiphertext, Action: actionTerminal}
	case typ == wire.TypeUsageLimitReached:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			// The sharing-cap variant says no reset time: cool down a while.
			until = e.Now.Add(cmp.Or(e.RetryAfter, 30*time.Minute))
		}
		return outcome{Class: classUsageLimit, Action: actionNext, Penalty: &penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: until}}
	case typ == wire.TypeUsageNotIncluded || typ == wire.TypeInsufficientQuota || code == wire.CodeInsufficientQuota:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			until = e.Now.Add(time.Hour)
		}
		return outcome{Class: classQuota, Action: actionNext, Penalty: &penalty{Status: store.StatusQuotaExceeded, Reason: cmp.Or(code, typ), Until: until}}
	case e.Status == http.StatusTooManyRequests || code == wire.CodeRateLimitExceeded:
		until := resetTime(e.Now, e.Err)
		if until.IsZero() {
			until = e.Now.Add(cmp.Or(e.RetryAfter, retryAfter(msg, time.Minute)))
		}
		return outcome{Class: classRateLimit, Action: actionNext, Penalty: &penalty{Status: store.StatusRateLimited, Reason: cmp.Or(code, "rate_limited"), Until: until}}
	case e.Status == http.StatusUnauthorized && e.Refreshed:
		return outcome{Class: classAuth, Action: actionSame, Recovery: "token_refresh"}
	case e.Status == http.StatusUnauthorized:
		return outcome{Class: classAuth, Action: actionNext, Penalty: &penalty{Status: store.StatusReauthRequired, Reason: cmp.Or(code, "upstream answered 401")}}
	case e.Status == http.StatusPaymentRequired:
		return outcome{Class: classBilling, Action: actionNext, Penalty: &penalty{Status: store.StatusQuotaExceeded, Reason: cmp.Or(code, "upstream answered 402 (billing)"), Until: e.Now.Add(time.Hour)}}
	case e.Status == http.StatusForbidden || e.Status == http.StatusProxyAuthRequired:
		return outcome{Class: classForbidden, Action: actionNext, Penalty: &penalty{Status: store.StatusRateLimited, Reason: "upstream answered " + strconv.Itoa(e.Status) + ": cooling down", Until: e.Now.Add(10 * time.Minute)}}
	case e.Status >= 500 || code == wire.CodeServerIsOverloaded || typ == wire.TypeServerError:
		return outcome{Class: classServer, Action: actionNext}
	case e.Status >= 400:
		return outcome{Class: classInvalid, Action: actionTerminal}
	}
	return outcome{Class: classFailed, Action: actionTerminal}
}

// isCiphertextRejection reports an upstream refusing ciphertext it did not
// issue: the structured code, or the wording of a rejection that arrives
// without one (seed 000).
func isCiphertextRejection(status int, e *wire.Error) bool {
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

// unreachableFor is how long new threads pass over an account whose
// upstream did not answer: long enough that a dead port does not make
// every new thread wait out a connect or handshake deadline, short enough
// that an upstream back from a blip is used again soon.
const unreachableFor = 30 * time.Second

// unreachableSign reports an attempt that found the account's upstream not
// answering at all: no connection, no handshake, no answer to a request
// it had taken, before anything reached the client. A stream cut or
// stalled after it started is the upstream's trouble with one request,
// not a dead port. Pure.
func unreachableSign(c attemptClass, e attemptEnd) bool {
	if e.Committed || e.Cancelled {
		return false
	}
	return c == classTransport || (c == classStall && e.Status == 0)
}
