package sim

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// FaultKind names one way the sim misbehaves on purpose.
type FaultKind string

// Fault kinds. Unless noted, a fault applies to response requests (POST
// .../responses, POST .../responses/compact, and each WebSocket
// response.create), and an HTTP status answer becomes an `error` event with
// that status over the WebSocket. A fault with a Route applies to the
// requests of that route instead (see Fault.Route).
const (
	// FaultUsageLimit answers 429 usage_limit_reached with plan_type,
	// resets_at and resets_in_seconds (ResetsIn from now; default the
	// account's primary window reset).
	FaultUsageLimit FaultKind = "usage_limit"
	// FaultSharingCap answers 429 usage_limit_reached without any reset time,
	// as a shared workspace's cap does.
	FaultSharingCap FaultKind = "sharing_cap"
	// FaultRateLimit answers 429 rate_limit_exceeded; with InStream, a
	// response.failed rate_limit_exceeded "Please try again in Ns" after
	// response.created (N from RetryAfter, default 1s).
	FaultRateLimit FaultKind = "rate_limit"
	// FaultInsufficientQuota answers 429 insufficient_quota, or in-stream.
	FaultInsufficientQuota FaultKind = "insufficient_quota"
	// FaultUnauthorized answers 401 token_expired.
	FaultUnauthorized FaultKind = "unauthorized"
	// FaultPaymentRequired answers 402.
	FaultPaymentRequired FaultKind = "payment_required"
	// FaultForbidden answers 403.
	FaultForbidden FaultKind = "forbidden"
	// FaultServerError answers Status (500 by default; 502 and 503 too)
	// with a server_error body, or in-stream.
	FaultServerError FaultKind = "server_error"
	// FaultOverloaded answers 503 server_is_overloaded, or in-stream.
	FaultOverloaded FaultKind = "overloaded"
	// FaultCutStream sends Events events of the response, then drops the
	// connection: no terminal event (HTTP: the body ends abruptly; WebSocket:
	// the connection closes without a close frame).
	FaultCutStream FaultKind = "cut_stream"
	// FaultStall sends Events events, then nothing until the client goes
	// away or the sim closes.
	FaultStall FaultKind = "stall"
	// FaultRefuseWebSocket refuses WebSocket upgrades (it applies to
	// handshakes, not to requests) with Status: 426 by default, which makes
	// Codex use HTTP for the session.
	FaultRefuseWebSocket FaultKind = "refuse_websocket"
	// FaultWebSocketMaxAge gives the WebSocket connections it applies to (at
	// the handshake) a maximum age of MaxAge, a hard limit like the
	// upstream's 60 minutes: when it passes, the sim sends an error event
	// websocket_connection_limit_reached (status 400) and closes the
	// connection. An idle connection gets it at once; a response streaming
	// then is cut by it (the error event comes instead of the rest of the
	// response, before any output if none was sent yet); a message that
	// arrives after the age gets it as its answer. The record of a message
	// the limit answered or cut shows the error and the fault.
	FaultWebSocketMaxAge FaultKind = "websocket_max_age"
)

var faultKinds = map[FaultKind]bool{
	FaultUsageLimit: true, FaultSharingCap: true, FaultRateLimit: true, FaultInsufficientQuota: true,
	FaultUnauthorized: true, FaultPaymentRequired: true, FaultForbidden: true, FaultServerError: true,
	FaultOverloaded: true, FaultCutStream: true, FaultStall: true, FaultRefuseWebSocket: true,
	FaultWebSocketMaxAge: true,
}

// Fault is one planned misbehaviour. Faults are checked in the order they
// were added; every fault that matches a request counts it (Seen), and the
// first one that is due fires. That makes them precise: "fail the third
// request of account a" is {Account: "a", After: 2, Times: 1}.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// Account limits the fault to one account (by ID); empty: every account.
	Account string `json:"account,omitempty"`
	// Transport limits the fault to "http" or "ws"; empty: both.
	Transport Transport `json:"transport,omitempty"`
	// Route limits the fault to the requests of one route; empty: the
	// response requests (RouteResponses and RouteCompact), as before
	// routes had faults. On an object route (RouteFiles, RouteImagesEdits,
	// RouteResponseGet, ...) the error kinds answer with their status and
	// body, cut_stream sends the answer's headers and half its body (Events
	// events of a streamed one) and drops the connection, and stall sends
	// the headers and then nothing. On RouteRealtime, error kinds and
	// refuse_websocket refuse the upgrade, and cut_stream closes the
	// connection after Events server events.
	Route Route `json:"route,omitempty"`
	// After lets this many matching requests through before the fault fires.
	After int `json:"after,omitempty"`
	// Times is how often the fault fires before it retires; zero: forever.
	Times int `json:"times,omitempty"`
	// Rate, between 0 and 1, makes the fault fire on that fraction of the
	// matching requests it is due for, chosen at random (a soak's faults);
	// zero: on every one.
	Rate float64 `json:"rate,omitempty"`
	// IncludePrewarm makes the fault apply to generate:false prewarm
	// requests too; by default they neither count nor fail, so counts match
	// turns.
	IncludePrewarm bool `json:"include_prewarm,omitempty"`
	// Status is the HTTP status of server_error (500, 502, 503) and
	// refuse_websocket (default 426).
	Status int `json:"status,omitempty"`
	// InStream delivers usage_limit, sharing_cap, rate_limit,
	// insufficient_quota, server_error and overloaded as a response.failed
	// event instead of an error status: after response.created, or, with
	// Events above 1, after that many events of the normal response (so
	// output may already have reached the client).
	InStream bool `json:"in_stream,omitempty"`
	// Events is how many events cut_stream and stall send first (every event
	// of the request counts, codex.rate_limits and response.metadata too).
	Events int `json:"events,omitempty"`
	// RetryAfter is the wait a rate_limit asks for; default 1s.
	RetryAfter Duration `json:"retry_after,omitempty"`
	// ResetsIn sets usage_limit's reset time from now.
	ResetsIn Duration `json:"resets_in,omitempty"`
	// MaxAge is websocket_max_age's connection age.
	MaxAge Duration `json:"max_age,omitempty"`
	// Message, when set, replaces the error message of a fault that
	// answers with an error (an upstream that echoes what it was sent:
	// "Incorrect API key provided: sk-...").
	Message string `json:"message,omitempty"`
}

// FaultState is a Fault as installed: its ID and how often it matched and
// fired so far.
type FaultState struct {
	Fault
	ID     int  `json:"id"`
	Seen   int  `json:"seen"`
	Fired  int  `json:"fired"`
	Active bool `json:"active"`
}

func (f *Fault) validate() error {
	if !faultKinds[f.Kind] {
		return fmt.Errorf("fault: unknown kind %q", f.Kind)
	}
	if f.Transport != "" && f.Transport != TransportHTTP && f.Transport != TransportWS {
		return fmt.Errorf("fault %s: transport %q is not http or ws", f.Kind, f.Transport)
	}
	if f.After < 0 || f.Times < 0 || f.Events < 0 || f.RetryAfter < 0 || f.ResetsIn < 0 || f.MaxAge < 0 {
		return fmt.Errorf("fault %s: counts and durations must not be negative", f.Kind)
	}
	if !(f.Rate >= 0 && f.Rate <= 1) {
		return fmt.Errorf("fault %s: rate %g is not between 0 and 1", f.Kind, f.Rate)
	}
	switch f.Kind {
	case FaultServerError:
		if f.Status != 0 && (f.Status < 500 || f.Status > 599) {
			return fmt.Errorf("fault %s: status %d is not a 5xx", f.Kind, f.Status)
		}
	case FaultRefuseWebSocket:
		if f.Status != 0 && (f.Status < 400 || f.Status > 599) {
			return fmt.Errorf("fault %s: status %d is not an error status", f.Kind, f.Status)
		}
	case FaultWebSocketMaxAge:
		if f.MaxAge <= 0 {
			return fmt.Errorf("fault %s: max_age must be positive", f.Kind)
		}
		if f.Transport == TransportHTTP {
			return fmt.Errorf("fault %s: applies to WebSocket connections only", f.Kind)
		}
	}
	if f.Kind == FaultRefuseWebSocket && f.Transport == TransportHTTP {
		return fmt.Errorf("fault %s: applies to WebSocket handshakes only", f.Kind)
	}
	if f.Route != "" && !faultRoutes[f.Route] {
		return fmt.Errorf("fault %s: route %q has no faults", f.Kind, f.Route)
	}
	switch {
	case f.Kind == FaultRefuseWebSocket && f.Route != "" && f.Route != RouteResponses && f.Route != RouteRealtime:
		return fmt.Errorf("fault %s: applies to the responses and realtime WebSocket handshakes only", f.Kind)
	case f.Kind == FaultWebSocketMaxAge && f.Route != "" && f.Route != RouteResponses:
		return fmt.Errorf("fault %s: applies to the responses WebSocket only", f.Kind)
	case f.InStream && f.Route != "" && f.Route != RouteResponses && f.Route != RouteCompact:
		return fmt.Errorf("fault %s: in_stream applies to response requests only", f.Kind)
	}
	if f.InStream {
		switch f.Kind {
		case FaultUsageLimit, FaultSharingCap, FaultRateLimit, FaultInsufficientQuota, FaultServerError, FaultOverloaded:
		default:
			return fmt.Errorf("fault %s: cannot be delivered in-stream", f.Kind)
		}
	}
	return nil
}

// appliesToHandshake reports whether the fault is checked on WebSocket
// handshakes rather than on response requests.
func (f *Fault) appliesToHandshake() bool {
	return f.Kind == FaultRefuseWebSocket || f.Kind == FaultWebSocketMaxAge
}

// faultRoutes are the routes a Fault may name.
var faultRoutes = map[Route]bool{
	RouteResponses: true, RouteCompact: true, RouteModels: true, RouteUsage: true,
	RouteImagesGenerations: true, RouteImagesEdits: true, RouteFiles: true, RouteFileList: true,
	RouteFileGet: true, RouteFileContent: true, RouteFileDelete: true, RouteFileCreate: true,
	RouteFileBlob: true, RouteFileUploaded: true, RouteResponseGet: true, RouteResponseDelete: true,
	RouteResponseCancel: true, RouteResponseInput: true, RouteEmbeddings: true, RouteTranscriptions: true,
	RouteSpeech: true, RouteMemories: true, RouteRealtime: true, RouteRealtimeCalls: true, RouteAnalytics: true,
}

// faultSite describes the event a fault is checked against.
type faultSite struct {
	account   string
	transport Transport
	route     Route
	handshake bool
	prewarm   bool
}

func (f *Fault) matches(s faultSite) bool {
	if f.Route == "" {
		if s.route != RouteResponses && s.route != RouteCompact {
			return false
		}
	} else if f.Route != s.route {
		return false
	}
	// The realtime handshake is where every realtime fault is checked.
	if s.route != RouteRealtime && f.appliesToHandshake() != s.handshake {
		return false
	}
	if f.Account != "" && f.Account != s.account {
		return false
	}
	if f.Transport != "" && f.Transport != s.transport {
		return false
	}
	return !s.prewarm || f.IncludePrewarm
}

// faultSet holds the installed faults. Owned by Server; guarded by Server.mu.
type faultSet struct {
	next   int
	faults []*FaultState
}

func (fs *faultSet) add(f Fault) (FaultState, error) {
	if err := f.validate(); err != nil {
		return FaultState{}, err
	}
	fs.next++
	st := &FaultState{Fault: f, ID: fs.next, Active: true}
	fs.faults = append(fs.faults, st)
	return *st, nil
}

// check counts the event against every matching fault and returns the first
// that fires, if any.
func (fs *faultSet) check(s faultSite) (Fault, bool) {
	var fired *FaultState
	for _, st := range fs.faults {
		if !st.Active || !st.matches(s) {
			continue
		}
		st.Seen++
		if fired == nil && st.Seen > st.After && (st.Rate == 0 || rand.Float64() < st.Rate) {
			st.Fired++
			fired = st
			if st.Times > 0 && st.Fired >= st.Times {
				st.Active = false
			}
		}
	}
	if fired == nil {
		return Fault{}, false
	}
	return fired.Fault, true
}

func (fs *faultSet) list() []FaultState {
	out := make([]FaultState, len(fs.faults))
	for i, st := range fs.faults {
		out[i] = *st
	}
	return out
}

func (fs *faultSet) remove(id int) bool {
	for i, st := range fs.faults {
		if st.ID == id {
			fs.faults = append(fs.faults[:i], fs.faults[i+1:]...)
			return true
		}
	}
	return false
}

func (fs *faultSet) clear() { fs.faults = nil }

// faultAnswer is what a firing fault makes of a response request: an error
// answer (status and error object), a response.failed in the stream, or a
// cut or stalled stream.
type faultAnswer struct {
	kind      FaultKind
	status    int // error answer; 0 when the fault acts on the stream
	err       wire.Error
	inStream  bool
	failAfter int // in-stream failures: events of the normal response sent first
	cutAfter  int // events before the cut; -1: no cut
	stallAt   int // events before the stall; -1: no stall
}

// answerFor turns a fired fault into its answer for an account with the
// given plan and primary reset time, at time now. It is pure.
func answerFor(f Fault, planType string, primaryReset, now time.Time) faultAnswer {
	a := faultAnswer{kind: f.Kind, cutAfter: -1, stallAt: -1, inStream: f.InStream}
	if f.InStream {
		a.failAfter = f.Events
	}
	switch f.Kind {
	case FaultUsageLimit:
		reset := primaryReset
		if f.ResetsIn > 0 {
			reset = now.Add(time.Duration(f.ResetsIn))
		}
		in := int64(reset.Sub(now).Round(time.Second) / time.Second)
		a.status = http.StatusTooManyRequests
		a.err = wire.Error{Type: wire.TypeUsageLimitReached, Message: "The usage limit has been reached",
			PlanType: planType, ResetsAt: reset.Unix(), ResetsInSeconds: max(in, 0)}
	case FaultSharingCap:
		a.status = http.StatusTooManyRequests
		a.err = wire.Error{Type: wire.TypeUsageLimitReached, Message: "The usage limit of this workspace has been reached",
			PlanType: planType}
	case FaultRateLimit:
		wait := time.Duration(f.RetryAfter)
		if wait <= 0 {
			wait = time.Second
		}
		a.status = http.StatusTooManyRequests
		a.err = wire.Error{Type: wire.TypeRateLimit, Code: wire.CodeRateLimitExceeded,
			Message: fmt.Sprintf("Rate limit reached for requests. Please try again in %gs.", wait.Seconds())}
	case FaultInsufficientQuota:
		a.status = http.StatusTooManyRequests
		a.err = wire.Error{Type: "insufficient_quota", Code: "insufficient_quota",
			Message: "You exceeded your current quota, please check your plan and billing details."}
	case FaultUnauthorized:
		a.status = http.StatusUnauthorized
		a.err = wire.Error{Type: "invalid_request_error", Code: "token_expired",
			Message: "Provided authentication token is expired. Please try signing in again."}
	case FaultPaymentRequired:
		a.status = http.StatusPaymentRequired
		a.err = wire.Error{Type: "invalid_request_error", Code: "payment_required",
			Message: "Payment required: the subscription of this account is inactive."}
	case FaultForbidden:
		a.status = http.StatusForbidden
		a.err = wire.Error{Type: "invalid_request_error", Code: "forbidden",
			Message: "This account is not allowed to use this model."}
	case FaultServerError:
		a.status = f.Status
		if a.status == 0 {
			a.status = http.StatusInternalServerError
		}
		a.err = wire.Error{Type: "server_error", Code: "server_error",
			Message: "The server had an error while processing your request."}
	case FaultOverloaded:
		a.status = http.StatusServiceUnavailable
		a.err = wire.Error{Type: "server_error", Code: "server_is_overloaded",
			Message: "Our servers are currently overloaded. Please try again later."}
	case FaultCutStream:
		a.cutAfter = f.Events
	case FaultStall:
		a.stallAt = f.Events
	}
	if f.Message != "" && a.status != 0 {
		a.err.Message = f.Message
	}
	return a
}
