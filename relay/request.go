package relay

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// request is one client request on the Responses routes, as admitted: who
// sent it, who it says it is, and its body. What the client sent is fixed
// once admitted; what each attempt sends, and where, is a plan (plan.go),
// and the request's memory across attempts is its tries (decide.go). Its
// bookkeeping fields (hopFrom, reserved, bindingsAhead) are set, and
// bindingsAhead taken, by the request's own goroutine, each as its comment
// says: a request is never shared between goroutines.
type request struct {
	id        string
	start     time.Time
	transport string // "http" or "ws"
	path      string
	sub       string // "" or "/compact"
	hopFrom   string // the replica that forwarded this request here, if one did
	client    client
	ident     Identity
	header    http.Header // the client's headers, as they may go upstream
	// body is a Responses request body (a WebSocket message without its
	// "type"), and fields what the relay reads of it.
	body   []byte
	fields continuity.Fields
	// received is the body as the client sent it, before the key's policy
	// (a forwarded request is policed where it is served); asked is the
	// model it asked for, and policy what the policy changed.
	received []byte
	asked    string
	policy   string
	// reserved: the request holds a budget reservation (set once, by its
	// admission, before any attempt).
	reserved bool
	// keyUse is its key's limits and their use as its admission read them
	// (nil: the key has none, or the store did not answer); limits is what
	// its client is told of its limits, worked out once after admission
	// (nil: nothing is known). See limits.go.
	keyUse []limitUse
	limits *wire.RateLimits
	// turnState is the client's x-codex-turn-state, if any.
	turnState string
	// compaction says how the request is a compaction ("" when it is not;
	// see compactionOf).
	compaction string
	// history is the whole input behind body: its own input or, when it
	// chains with previous_response_id, the thread's history up to that
	// response and then the new items, from continuity; nil when continuity
	// does not hold the chain.
	history []json.RawMessage
	// objectOwner is the account of the objects the request names or
	// references (files, a stored response), which alone can read them
	// ("": none; see referencedAccount).
	objectOwner string
	// bindingsAhead is the thread's bindings, being read while the
	// request waits for its lane lease; its first choice takes them.
	bindingsAhead *bindingsRead
}

// bindingsRead is a read of a request's bindings under way.
type bindingsRead struct {
	done chan struct{} // closed once rows and err are set
	rows []store.Binding
	err  error
}

// newRequest admits a request: its history is resolved once, from
// continuity as it stands when the request arrives (a request's own
// attempts commit nothing before it ends).
func (s *Server) newRequest(transport, path, sub string, cl client, ident Identity, header http.Header, received []byte, pol policed, turnState string) *request {
	now := s.cfg.Now()
	fields := pol.fields
	r := &request{id: store.NewID("req", now), start: now, transport: transport, path: path, sub: sub,
		client: cl, ident: ident, header: header, body: pol.body, fields: fields, received: received,
		asked: pol.asked, policy: pol.note, turnState: turnState,
		compaction: compactionOf(transport, sub, fields, pol.body, header)}
	switch prev := fields.PreviousResponseID; {
	case prev == "":
		r.history = fields.Input
	case ident.Key != "":
		if h, err := s.conts.Resolve(r.contKey(), prev, fields.Input); err == nil {
			r.history = h
		}
	}
	return r
}

// rebuildable reports whether continuity holds the history behind the
// request's previous_response_id, so the full request can go anywhere.
func (r *request) rebuildable() bool {
	return r.fields.PreviousResponseID != "" && r.history != nil
}

// route names the request in the request log: "responses",
// "responses.compact" or "chat.completions".
func (r *request) route() string {
	switch {
	case r.sub == "/compact":
		return "responses.compact"
	case strings.HasSuffix(r.path, "/chat/completions"):
		return "chat.completions"
	}
	return "responses"
}

func (r *request) contKey() continuity.Key {
	return continuity.Key{Thread: string(r.ident.Key), Scope: r.client.scope()}
}

// threadLane is the key of the thread's bridge lane.
func (r *request) threadLane() bridge.Key {
	return bridge.Key{Thread: string(r.ident.Key), Scope: r.client.scope()}
}

// prewarm reports a WebSocket prewarm (generate: false): it asks for a
// response id to chain on, not for output.
func (r *request) prewarm() bool {
	return r.fields.Generate != nil && !*r.fields.Generate
}

// responseBody reads a WebSocket response.create into a Responses request
// body: the message without its "type", every other byte as it came. It
// reuses msg's bytes: the caller must hold no other use of msg.
func responseBody(msg []byte) []byte {
	return cutMember(msg, "type")
}
