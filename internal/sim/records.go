package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// RecordKind is what a Record describes.
type RecordKind string

const (
	// RecordHTTP is one HTTP request (not a WebSocket handshake).
	RecordHTTP RecordKind = "http"
	// RecordHandshake is one WebSocket upgrade request, accepted or refused.
	RecordHandshake RecordKind = "ws_handshake"
	// RecordMessage is one message a client sent over a WebSocket.
	RecordMessage RecordKind = "ws_message"
)

// Route names the endpoint a record was addressed to.
type Route string

const (
	RouteResponses Route = "responses"
	RouteCompact   Route = "responses/compact"
	RouteModels    Route = "models"
	RouteUsage     Route = "usage"
	RouteToken     Route = "oauth/token"
	RouteGoalGet   Route = "thread/goal/get"
	RouteGoalSet   Route = "thread/goal/set"
	RouteGoalClear Route = "thread/goal/clear"
	RouteUnknown   Route = "unknown"

	// Object routes, under both prefixes unless noted (see routes).
	RouteImagesGenerations Route = "images/generations"    // POST {p}/images/generations
	RouteImagesEdits       Route = "images/edits"          // POST {p}/images/edits (JSON or multipart)
	RouteFiles             Route = "files"                 // POST {p}/files (multipart upload)
	RouteFileList          Route = "files/list"            // GET {p}/files
	RouteFileGet           Route = "files/get"             // GET {p}/files/{id}
	RouteFileContent       Route = "files/content"         // GET {p}/files/{id}/content
	RouteFileDelete        Route = "files/delete"          // DELETE {p}/files/{id}
	RouteFileCreate        Route = "files/create"          // POST /backend-api/files (ChatGPT upload flow)
	RouteFileBlob          Route = "files/blob"            // PUT and GET of the upload URL /_sim/blob/{id}
	RouteFileUploaded      Route = "files/uploaded"        // POST /backend-api/files/{id}/uploaded
	RouteResponseGet       Route = "responses/get"         // GET {p}/responses/{id} (JSON, or SSE with ?stream=true)
	RouteResponseDelete    Route = "responses/delete"      // DELETE {p}/responses/{id}
	RouteResponseCancel    Route = "responses/cancel"      // POST {p}/responses/{id}/cancel
	RouteResponseInput     Route = "responses/input_items" // GET {p}/responses/{id}/input_items
	RouteEmbeddings        Route = "embeddings"            // POST {p}/embeddings
	RouteTranscriptions    Route = "audio/transcriptions"  // POST {p}/audio/transcriptions (multipart)
	RouteSpeech            Route = "audio/speech"          // POST {p}/audio/speech
	RouteMemories          Route = "memories/trace_summarize"
	RouteRealtime          Route = "realtime"       // GET {p}/realtime WebSocket (handshake and messages)
	RouteRealtimeCalls     Route = "realtime/calls" // POST {p}/realtime/calls (SDP offer)
	RouteAnalytics         Route = "analytics"      // POST /backend-api/codex/analytics-events/events
)

// Outcomes of a record.
const (
	OutcomeCompleted = "completed"   // a response ended with response.completed
	OutcomeFailed    = "failed"      // a response ended with response.failed
	OutcomeError     = "error"       // an error answer (HTTP status or WebSocket error event)
	OutcomeCut       = "cut"         // the stream was cut by a fault
	OutcomeStalled   = "stalled"     // the stream stalled by a fault until the client left
	OutcomeGone      = "client_gone" // the client went away (or the sim closed) mid-answer
	OutcomeUpgraded  = "upgraded"    // a WebSocket handshake was accepted
	OutcomeOK        = "ok"          // a non-streaming answer succeeded
)

// ToolOutput is a tool result a request carried: its call id and (clipped)
// output text.
type ToolOutput struct {
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// Record is what the sim saw of one HTTP request, WebSocket handshake or
// WebSocket message, and what it answered. Records are values: Records
// returns copies.
type Record struct {
	Seq       int64      `json:"seq"`
	Time      time.Time  `json:"time"`
	Kind      RecordKind `json:"kind"`
	Transport Transport  `json:"transport"`
	Method    string     `json:"method"`
	Path      string     `json:"path"`
	Route     Route      `json:"route"`
	// ConnID identifies the WebSocket connection of handshakes and messages.
	ConnID int64 `json:"conn_id,omitempty"`
	// Account is the ID of the account the bearer token belongs to; empty
	// when it belongs to none.
	Account string `json:"account,omitempty"`

	// Identity headers, as sent (the handshake's, for WebSocket messages).
	SessionID        string `json:"session_id,omitempty"`
	ThreadID         string `json:"thread_id,omitempty"`
	ClientRequestID  string `json:"client_request_id,omitempty"`
	WindowID         string `json:"window_id,omitempty"`
	TurnMetadata     string `json:"turn_metadata,omitempty"`
	TurnState        string `json:"turn_state,omitempty"`
	Originator       string `json:"originator,omitempty"`
	UserAgent        string `json:"user_agent,omitempty"`
	ChatGPTAccountID string `json:"chatgpt_account_id,omitempty"`
	OpenAIBeta       string `json:"openai_beta,omitempty"`
	// WSExtensions is the WebSocket handshake's Sec-WebSocket-Extensions
	// as the client offered them (handshakes only).
	WSExtensions    string `json:"ws_extensions,omitempty"`
	ContentEncoding string `json:"content_encoding,omitempty"`
	// ClientKey is true when Authorization carried a relay client key
	// (Bearer crk_...): a relay must never send one upstream.
	ClientKey bool `json:"client_key"`

	// Body fields of response requests.
	Model              string   `json:"model,omitempty"`
	ServiceTier        string   `json:"service_tier,omitempty"`
	ReasoningEffort    string   `json:"reasoning_effort,omitempty"`
	PromptCacheKey     string   `json:"prompt_cache_key,omitempty"`
	PreviousResponseID string   `json:"previous_response_id,omitempty"`
	Generate           *bool    `json:"generate,omitempty"`
	Stream             bool     `json:"stream,omitempty"` // a WebSocket message has none
	InputCount         int      `json:"input_count"`
	InputTypes         []string `json:"input_types,omitempty"`
	// ToolTypes are the types of the request's tools, in order ("function",
	// "custom", "namespace", "image_generation", ...).
	ToolTypes   []string     `json:"tool_types,omitempty"`
	ToolOutputs []ToolOutput `json:"tool_outputs,omitempty"`
	// ClientTurnState is client_metadata["x-codex-turn-state"] (WebSocket).
	ClientTurnState string `json:"client_turn_state,omitempty"`
	// RequestKind is request_kind from x-codex-turn-metadata (turn,
	// prewarm, compaction).
	RequestKind string `json:"request_kind,omitempty"`
	// GoalThreadID is the threadId of a goal route's payload.
	GoalThreadID string `json:"goal_thread_id,omitempty"`
	// ObjectID is the object a request to an object route names in its
	// path (a file, a stored response, a realtime call), or the one it
	// created (a file upload, a stored or background response, a call).
	ObjectID string `json:"object_id,omitempty"`
	// MessageType is the type of a Realtime client event (RouteRealtime
	// messages).
	MessageType string `json:"message_type,omitempty"`
	// FileIDs are the file ids a request's body refers to: input_file and
	// input_image parts of a response request, images of an image edit.
	FileIDs []string `json:"file_ids,omitempty"`

	// Outcome.
	Status       int       `json:"status"`
	Outcome      string    `json:"outcome,omitempty"`
	ErrorType    string    `json:"error_type,omitempty"`
	ErrorCode    string    `json:"error_code,omitempty"`
	ErrorMessage string    `json:"error_message,omitempty"`
	Fault        FaultKind `json:"fault,omitempty"`
	ResponseID   string    `json:"response_id,omitempty"`
	// TurnStateSent is the turn state the sim issued for this request, if
	// any (header over HTTP, response.metadata over WebSocket).
	TurnStateSent string   `json:"turn_state_sent,omitempty"`
	Events        int      `json:"events"`
	EventTypes    []string `json:"event_types,omitempty"`
	// Usage is the usage the sim reported in the response's
	// response.completed event (nil: none was sent).
	Usage *RecordUsage `json:"usage,omitempty"`
	// Done is false while the answer is still being written.
	Done     bool          `json:"done"`
	Duration time.Duration `json:"duration"`
}

// RecordUsage is a response's usage as the sim reported it.
type RecordUsage struct {
	InputTokens     int64 `json:"input_tokens"`
	CachedTokens    int64 `json:"cached_tokens"`
	OutputTokens    int64 `json:"output_tokens"`
	ReasoningTokens int64 `json:"reasoning_tokens"`
	TotalTokens     int64 `json:"total_tokens"`
}

// HasInputType reports whether the request's input held an item of type t.
func (r Record) HasInputType(t string) bool { return slices.Contains(r.InputTypes, t) }

// RecordFilter selects records; zero fields match everything.
type RecordFilter struct {
	Account   string     `json:"account,omitempty"`
	Kind      RecordKind `json:"kind,omitempty"`
	Transport Transport  `json:"transport,omitempty"`
	Route     Route      `json:"route,omitempty"`
	ThreadID  string     `json:"thread_id,omitempty"`
	SessionID string     `json:"session_id,omitempty"`
	ConnID    int64      `json:"conn_id,omitempty"`
	// Since keeps records with a Seq greater than this.
	Since int64 `json:"since,omitempty"`
}

func (f RecordFilter) match(r *Record) bool {
	return (f.Account == "" || r.Account == f.Account) &&
		(f.Kind == "" || r.Kind == f.Kind) &&
		(f.Transport == "" || r.Transport == f.Transport) &&
		(f.Route == "" || r.Route == f.Route) &&
		(f.ThreadID == "" || r.ThreadID == f.ThreadID) &&
		(f.SessionID == "" || r.SessionID == f.SessionID) &&
		(f.ConnID == 0 || r.ConnID == f.ConnID) &&
		r.Seq > f.Since
}

// recorder keeps the newest records, up to max. Safe for concurrent use:
// every field is guarded by mu, and a record is only changed through its
// recordRef, under mu.
type recorder struct {
	mu      sync.Mutex
	max     int
	seq     int64
	records []*Record
}

// recordRef lets the handler that created a record fill in its outcome.
type recordRef struct {
	rec *recorder
	r   *Record
}

func (rc *recorder) add(r Record) recordRef {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.seq++
	r.Seq = rc.seq
	p := &r
	if len(rc.records) >= rc.max {
		drop := len(rc.records) - rc.max + 1
		rc.records = slices.Delete(rc.records, 0, drop)
	}
	rc.records = append(rc.records, p)
	return recordRef{rec: rc, r: p}
}

// update changes the record under the recorder's lock.
func (ref recordRef) update(f func(r *Record)) {
	if ref.rec == nil {
		return
	}
	ref.rec.mu.Lock()
	defer ref.rec.mu.Unlock()
	f(ref.r)
}

// event notes one event sent for the record.
func (ref recordRef) event(typ string) {
	ref.update(func(r *Record) {
		r.Events++
		r.EventTypes = append(r.EventTypes, typ)
	})
}

// finish sets the final outcome and duration.
func (ref recordRef) finish(status int, outcome string, now time.Time) {
	ref.update(func(r *Record) {
		r.Status = status
		r.Outcome = outcome
		r.Done = true
		r.Duration = now.Sub(r.Time)
	})
}

// fail sets an error outcome.
func (ref recordRef) fail(status int, e wire.Error, now time.Time) {
	ref.update(func(r *Record) {
		r.ErrorType, r.ErrorCode, r.ErrorMessage = e.Type, e.Code, e.Message
	})
	ref.finish(status, OutcomeError, now)
}

func (rc *recorder) list(f RecordFilter) []Record {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []Record
	for _, r := range rc.records {
		if f.match(r) {
			out = append(out, r.clone())
		}
	}
	return out
}

// takeFinished removes the finished records and returns them, oldest
// first; the records still being written stay.
func (rc *recorder) takeFinished() []Record {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []Record
	rc.records = slices.DeleteFunc(rc.records, func(r *Record) bool {
		if r.Done {
			out = append(out, r.clone())
		}
		return r.Done
	})
	return out
}

// clone copies r, its slices too.
func (r *Record) clone() Record {
	c := *r
	c.InputTypes = slices.Clone(r.InputTypes)
	c.ToolTypes = slices.Clone(r.ToolTypes)
	c.ToolOutputs = slices.Clone(r.ToolOutputs)
	c.EventTypes = slices.Clone(r.EventTypes)
	c.FileIDs = slices.Clone(r.FileIDs)
	if r.Generate != nil {
		g := *r.Generate
		c.Generate = &g
	}
	if r.Usage != nil {
		u := *r.Usage
		c.Usage = &u
	}
	return c
}

func (rc *recorder) clear() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.records = nil
}

// headerRecord starts a record from the identity headers of r.
func headerRecord(r *http.Request, kind RecordKind, transport Transport, route Route, now time.Time) Record {
	h := r.Header
	token := bearerToken(r)
	return Record{
		Time:             now,
		Kind:             kind,
		Transport:        transport,
		Method:           r.Method,
		Path:             r.URL.Path,
		Route:            route,
		SessionID:        firstHeader(h, wire.HeaderSessionID, "session_id", "x-codex-session-id", "x-codex-conversation-id"),
		ThreadID:         h.Get(wire.HeaderThreadID),
		ClientRequestID:  h.Get(wire.HeaderClientRequestID),
		WindowID:         h.Get(wire.HeaderWindowID),
		TurnMetadata:     h.Get(wire.HeaderTurnMetadata),
		TurnState:        h.Get(wire.HeaderTurnState),
		Originator:       h.Get(wire.HeaderOriginator),
		UserAgent:        h.Get("User-Agent"),
		ChatGPTAccountID: h.Get(wire.HeaderChatGPTAccountID),
		OpenAIBeta:       h.Get(wire.HeaderOpenAIBeta),
		WSExtensions:     strings.Join(h.Values("Sec-WebSocket-Extensions"), ", "),
		ContentEncoding:  h.Get("Content-Encoding"),
		ClientKey:        strings.HasPrefix(token, "crk_"),
		RequestKind:      requestKind(h.Get(wire.HeaderTurnMetadata)),
	}
}

func firstHeader(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// noteRequest copies the body fields of req into the record.
func (ref recordRef) noteRequest(req *responseRequest) {
	ref.update(func(r *Record) {
		r.Model = req.Model
		r.ServiceTier = req.ServiceTier
		if req.Reasoning != nil {
			r.ReasoningEffort = req.Reasoning.Effort
		}
		r.PromptCacheKey = req.PromptCacheKey
		r.PreviousResponseID = req.PreviousResponseID
		r.Stream = req.Stream
		r.FileIDs = req.fileIDs
		if req.Generate != nil {
			g := *req.Generate
			r.Generate = &g
		}
		for _, tool := range req.Tools {
			r.ToolTypes = append(r.ToolTypes, tool.Type)
		}
		r.InputCount = len(req.Input)
		r.InputTypes = make([]string, len(req.Input))
		for i, it := range req.Input {
			r.InputTypes[i] = it.Type
			if (it.Type == "function_call_output" || it.Type == "custom_tool_call_output") && it.CallID != "" {
				r.ToolOutputs = append(r.ToolOutputs, ToolOutput{CallID: it.CallID, Output: clip(it.outputText(), 1024)})
			}
		}
		r.ClientTurnState = req.clientTurnState()
		if kind := requestKind(metadataString(req.ClientMetadata, "x-codex-turn-metadata")); kind != "" {
			r.RequestKind = kind // per message: more precise than the handshake's
		}
	})
}

// usage records the usage of a response.completed event.
func (ref recordRef) usage(ev []byte) {
	var env struct {
		Response struct {
			Usage *wire.Usage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(ev, &env) != nil || env.Response.Usage == nil {
		return
	}
	u := env.Response.Usage
	ref.update(func(r *Record) {
		r.Usage = &RecordUsage{InputTokens: u.InputTokens, CachedTokens: u.Cached(), OutputTokens: u.OutputTokens,
			ReasoningTokens: u.Reasoning(), TotalTokens: u.TotalTokens}
	})
}
