package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// Statuses of a stored response.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
	StatusIncomplete = "incomplete"
)

// storedResponse is a response kept by store:true or background:true, on
// its account. Owned by Server; every field is guarded by Server.mu.
type storedResponse struct {
	id, account, model string
	createdAt          int64
	background         bool
	status             string
	// response is the latest response object an event carried.
	response json.RawMessage
	input    []json.RawMessage // with ids
	events   [][]byte          // as streamed; events[i] has sequence_number i
	// changed is closed (and replaced) whenever events or status change,
	// which wakes the streams that follow the response.
	changed       chan struct{}
	cancel        context.CancelFunc // a background run; nil otherwise
	contextTokens int
}

func (sr *storedResponse) terminal() bool {
	switch sr.status {
	case StatusCompleted, StatusFailed, StatusCancelled, StatusIncomplete:
		return true
	}
	return false
}

func (sr *storedResponse) notifyLocked() {
	close(sr.changed)
	sr.changed = make(chan struct{})
}

// appendLocked keeps one streamed event and follows the status it reports;
// it refuses events once the response ended (a cancelled run's late ones).
func (sr *storedResponse) appendLocked(ev []byte) bool {
	if sr.terminal() {
		return false
	}
	sr.events = append(sr.events, ev)
	var env struct {
		Response json.RawMessage `json:"response"`
	}
	if json.Unmarshal(ev, &env) == nil && len(env.Response) > 0 {
		sr.response = env.Response
	}
	switch typ, _ := wire.EventType(ev); typ {
	case wire.EventResponseCreated, "response.in_progress":
		sr.status = StatusInProgress
	case wire.EventResponseCompleted:
		sr.status = StatusCompleted
	case wire.EventResponseFailed:
		sr.status = StatusFailed
	case "response.incomplete":
		sr.status = StatusIncomplete
	}
	sr.notifyLocked()
	return true
}

// objectLocked is the response object as GET answers it: the latest one
// streamed, with the current status.
func (sr *storedResponse) objectLocked() object {
	o := object{}
	if sr.response != nil {
		_ = json.Unmarshal(sr.response, &o)
	}
	if len(o) == 0 {
		o = object{"id": sr.id, "object": "response", "created_at": sr.createdAt, "model": sr.model, "output": []any{}}
	}
	o["status"] = sr.status
	o["background"] = sr.background
	o["store"] = true
	return o
}

// StoredResponse is a stored or background response as the sim keeps it.
type StoredResponse struct {
	ID         string
	Account    string
	Status     string // StatusQueued, StatusInProgress, StatusCompleted, ...
	Background bool
	Model      string
	// Object is the response object as GET {p}/responses/{id} answers it.
	Object json.RawMessage
	// InputItems are the request's input items, each with its id.
	InputItems []json.RawMessage
	// Events counts the events streamed so far.
	Events int
}

func (sr *storedResponse) snapshotLocked() StoredResponse {
	obj, _ := json.Marshal(sr.objectLocked())
	return StoredResponse{ID: sr.id, Account: sr.account, Status: sr.status, Background: sr.background,
		Model: sr.model, Object: obj, InputItems: slices.Clone(sr.input), Events: len(sr.events)}
}

// StoredResponse returns a response an account stored (store:true or
// background:true).
func (s *Server) StoredResponse(account, id string) (StoredResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.storedLocked(account, id)
	if sr == nil {
		return StoredResponse{}, false
	}
	return sr.snapshotLocked(), true
}

// StoredResponses returns the responses an account stored, oldest first.
func (s *Server) StoredResponses(account string) []StoredResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[account]
	if !ok {
		return nil
	}
	out := make([]StoredResponse, 0, len(o.responseOrder))
	for _, id := range o.responseOrder {
		out = append(out, o.responses[id].snapshotLocked())
	}
	return out
}

func (s *Server) storedLocked(account, id string) *storedResponse {
	if o, ok := s.objects[account]; ok {
		return o.responses[id]
	}
	return nil
}

// storedContext finds a completed stored response of account for
// previous_response_id: its context tokens.
func (s *Server) storedContext(account string) func(id string) (int, bool) {
	return func(id string) (int, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		sr := s.storedLocked(account, id)
		if sr == nil || sr.status != StatusCompleted {
			return 0, false
		}
		return sr.contextTokens, true
	}
}

// storeResponse keeps the response v answers req with, on account.
func (s *Server) storeResponse(account string, req *responseRequest, v *verdict, status string) *storedResponse {
	sr := &storedResponse{id: v.responseID, account: account, model: req.Model, createdAt: s.cfg.Now().Unix(),
		background: req.Background, status: status, input: withItemIDs(req.rawInput),
		changed: make(chan struct{}), contextTokens: v.contextTokens}
	s.mu.Lock()
	s.addResponseLocked(sr)
	s.mu.Unlock()
	return sr
}

// withItemIDs gives every input item an id, as the API's input_items list
// shows them, and a message's string content the form of a part list.
func withItemIDs(items []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(items))
	for _, raw := range items {
		var it map[string]any
		if json.Unmarshal(raw, &it) != nil {
			continue
		}
		typ, _ := it["type"].(string)
		if typ == "" {
			if _, ok := it["role"]; ok {
				typ = "message"
				it["type"] = typ
			}
		}
		if text, ok := it["content"].(string); ok && typ == "message" {
			part := "input_text"
			if it["role"] == "assistant" {
				part = "output_text"
			}
			it["content"] = []any{object{"type": part, "text": text}}
		}
		if id, _ := it["id"].(string); id == "" {
			prefix := "item_"
			if typ == "message" {
				prefix = "msg_"
			}
			it["id"] = prefix + randomHex(12)
		}
		b, _ := json.Marshal(it)
		out = append(out, b)
	}
	return out
}

// storeSink keeps a background run's events in its stored response.
type storeSink struct {
	s  *Server
	sr *storedResponse
}

func (k storeSink) send(ctx context.Context, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	if !k.sr.appendLocked(data) {
		return context.Canceled
	}
	return nil
}

// teeSink sends through sink and keeps each event in a stored response
// first, so a GET sees what the client is about to read.
type teeSink struct {
	sink
	store storeSink
}

func (k teeSink) send(ctx context.Context, data []byte) error {
	k.store.s.mu.Lock()
	k.store.sr.appendLocked(data)
	k.store.s.mu.Unlock()
	return k.sink.send(ctx, data)
}

// endStored marks a stored response whose stream ended without a terminal
// event (the client left, a fault cut it) incomplete.
func (s *Server) endStored(sr *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sr.terminal() {
		sr.status = StatusIncomplete
		sr.notifyLocked()
	}
}

// runBackground runs a background response detached from its request, on
// the sim's lifetime: queued while its delay runs, in progress from
// response.created, then completed (or failed) as its script ends. Its
// events are kept for GET .../responses/{id}?stream=true. Cancel and
// Close end it. It reports false when the sim is closed.
func (s *Server) runBackground(sr *storedResponse, v verdict) bool {
	if !s.enter() {
		return false
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	sr.cancel = cancel
	s.mu.Unlock()
	run := v
	run.fault.cutAfter, run.fault.stallAt = -1, -1 // the faults act on the streams that follow it
	go func() {
		defer s.handlers.Done()
		defer cancel()
		s.stream(ctx, storeSink{s: s, sr: sr}, run.events, &run, recordRef{})
		s.endStored(sr) // cancelled already when Cancel ended it
	}()
	return true
}

// follow streams a stored response's events after sequence number after,
// then its live ones until it ends, through sk; the fault's cut or stall
// counts the events this stream sent. It returns the outcome, as stream
// does.
func (s *Server) follow(ctx context.Context, sk sink, sr *storedResponse, after int, fa faultAnswer, ref recordRef) string {
	next, sent := max(after+1, 0), 0
	for {
		s.mu.Lock()
		var evs [][]byte
		if next < len(sr.events) {
			evs = sr.events[next:len(sr.events):len(sr.events)]
		}
		done, status, changed := sr.terminal(), sr.status, sr.changed
		s.mu.Unlock()
		for _, ev := range evs {
			if sent == fa.cutAfter {
				return OutcomeCut
			}
			if sent == fa.stallAt {
				<-ctx.Done()
				return OutcomeStalled
			}
			typ, _ := wire.EventType(ev)
			ref.event(typ)
			switch typ {
			case wire.EventResponseCompleted:
				ref.usage(ev)
				ref.finish(http.StatusOK, OutcomeCompleted, s.cfg.Now())
			case wire.EventResponseFailed:
				ref.finish(http.StatusOK, OutcomeFailed, s.cfg.Now())
			}
			if err := sk.send(ctx, ev); err != nil {
				return OutcomeGone
			}
			next++
			sent++
		}
		if done {
			switch {
			case fa.cutAfter >= 0:
				return OutcomeCut
			case fa.stallAt >= 0:
				<-ctx.Done()
				return OutcomeStalled
			case status == StatusCompleted:
				return OutcomeCompleted
			case status == StatusFailed:
				return OutcomeFailed
			}
			return OutcomeOK // cancelled or incomplete: the stream just ends
		}
		if !waitChanged(ctx, changed) {
			return OutcomeGone
		}
	}
}

// handleStoredResponse serves GET {p}/responses/{id} (the object, or with
// ?stream=true its events after ?starting_after=N, then live ones until it
// ends), DELETE {p}/responses/{id}, POST {p}/responses/{id}/cancel and GET
// {p}/responses/{id}/input_items, for responses of the caller's account
// only.
func (s *Server) handleStoredResponse(kind Kind, route Route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		c := s.beginObject(w, r, kind, route, id)
		if c == nil {
			return
		}
		q := r.URL.Query()
		s.mu.Lock()
		sr := s.storedLocked(c.acct.ID, id)
		var obj object
		var input []json.RawMessage
		if sr != nil {
			switch route {
			case RouteResponseDelete:
				s.dropResponseLocked(s.objectsLocked(c.acct.ID), id)
			case RouteResponseCancel:
				if sr.background && !sr.terminal() {
					sr.status = StatusCancelled
					if sr.cancel != nil {
						sr.cancel()
					}
					sr.notifyLocked()
				}
			}
			obj, input = sr.objectLocked(), sr.input
		}
		s.mu.Unlock()
		if sr == nil {
			c.fail(http.StatusNotFound, noSuchResponse(id))
			return
		}
		switch route {
		case RouteResponseGet:
			if q.Get("stream") == "true" {
				c.streamStored(sr, q.Get("starting_after"))
				return
			}
			c.answerJSON(http.StatusOK, obj)
		case RouteResponseDelete:
			c.answerJSON(http.StatusOK, object{"id": id, "object": "response", "deleted": true})
		case RouteResponseCancel:
			if !sr.background {
				c.fail(http.StatusBadRequest, invalidRequest("Cannot cancel a synchronous response.", ""))
				return
			}
			c.answerJSON(http.StatusOK, obj)
		case RouteResponseInput:
			c.inputItems(input)
		}
	}
}

// streamStored answers GET ...?stream=true as SSE.
func (c *objectCall) streamStored(sr *storedResponse, startingAfter string) {
	after := -1
	if startingAfter != "" {
		n, err := strconv.Atoi(startingAfter)
		if err != nil || n < 0 {
			c.fail(http.StatusBadRequest, invalidRequest("Invalid value for 'starting_after': expected a sequence number.", "starting_after"))
			return
		}
		after = n
	}
	ctx, cancel := c.s.requestContext(c.r)
	defer cancel()
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Request-Id", "req_"+randomHex(12))
	c.rl.SetHeaders(h)
	c.w.WriteHeader(http.StatusOK)
	sk := &sseSink{rc: http.NewResponseController(c.w), sse: wire.NewSSEWriter(c.w), timeout: c.s.cfg.WriteTimeout}
	defer func() { _ = sk.rc.SetWriteDeadline(time.Time{}) }()
	_ = sk.sse.Flush()
	outcome := c.s.follow(ctx, sk, sr, after, c.fault, c.ref)
	c.ref.finish(http.StatusOK, outcome, c.s.cfg.Now())
	switch outcome {
	case OutcomeCompleted, OutcomeFailed, OutcomeOK:
	default:
		panic(http.ErrAbortHandler)
	}
}

// inputItems answers GET .../input_items: ?order=desc (the default) or
// asc, ?limit= 1 to 100 (default 20), ?after= an item id.
func (c *objectCall) inputItems(input []json.RawMessage) {
	q := c.r.URL.Query()
	items := slices.Clone(input)
	switch q.Get("order") {
	case "", "desc":
		slices.Reverse(items)
	case "asc":
	default:
		c.fail(http.StatusBadRequest, invalidRequest("Invalid value for 'order': expected asc or desc.", "order"))
		return
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			c.fail(http.StatusBadRequest, invalidRequest("Invalid value for 'limit': expected 1 to 100.", "limit"))
			return
		}
		limit = n
	}
	itemID := func(raw json.RawMessage) string {
		var it struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &it)
		return it.ID
	}
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(items, func(raw json.RawMessage) bool { return itemID(raw) == after })
		if i < 0 {
			c.fail(http.StatusNotFound, apiError{Message: "No input item with id '" + after + "'.", Type: wire.TypeInvalidRequest, Param: strPtr("after")})
			return
		}
		items = items[i+1:]
	}
	more := len(items) > limit
	if more {
		items = items[:limit]
	}
	l := listObject(items, itemID)
	l["has_more"] = more
	c.answerJSON(http.StatusOK, l)
}
