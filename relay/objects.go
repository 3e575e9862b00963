package relay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// bodyMode is how an object route's request body is read.
type bodyMode int

const (
	bodyNone   bodyMode = iota // no body (GET, DELETE)
	bodyJSON                   // JSON, read whole (bounded by MaxBodyBytes): the relay reads its model and references
	bodyStream                 // anything (multipart uploads, audio): streamed upstream as it comes, never held
)

// objectRoute is one route of the OpenAI object API the relay forwards:
// what the request log calls it, how its body comes, which object its path
// names (the {id} segment) and what its answer creates or deletes.
type objectRoute struct {
	name   string // the request log's route: "files.create"
	method string
	path   string // below the prefix; "{id}" is the named object's id
	kind   store.ObjectKind
	// creates: a 2xx answer's "id" (or "file_id") is a new object of kind,
	// on the account that answered; deletes: a 2xx answer deleted the
	// object the path names.
	creates, deletes bool
	body             bodyMode
	// model: the JSON body names the model it asks for, checked against
	// the key's allow-list (and aliased) as a Responses request's is.
	model bool
	// chatgpt: the route lives at the ChatGPT backend's base
	// (/backend-api/...), not below its /codex; only ChatGPT accounts
	// answer it.
	chatgpt bool
	// drop: the relay accepts the request and drops it; nothing goes
	// upstream (Codex's analytics events).
	drop bool
	// images: a 2xx answer's data are images, each charged at the price
	// table's price per image of the model (beside any token usage).
	images bool
}

// objectRoutes are the routes beside /responses that an account answers
// (see docs/PROTOCOL.md, "Every route Codex calls"). Routes under both
// prefixes, /v1 and /backend-api/codex, unless chatgpt.
var objectRoutes = []objectRoute{
	{name: "images.generations", method: http.MethodPost, path: "/images/generations", body: bodyJSON, model: true, images: true},
	{name: "images.edits", method: http.MethodPost, path: "/images/edits", body: bodyStream, model: true, images: true},
	{name: "files.create", method: http.MethodPost, path: "/files", kind: store.ObjectFile, creates: true, body: bodyStream},
	{name: "files.list", method: http.MethodGet, path: "/files", kind: store.ObjectFile},
	{name: "files.get", method: http.MethodGet, path: "/files/{id}", kind: store.ObjectFile},
	{name: "files.content", method: http.MethodGet, path: "/files/{id}/content", kind: store.ObjectFile},
	{name: "files.delete", method: http.MethodDelete, path: "/files/{id}", kind: store.ObjectFile, deletes: true},
	{name: "responses.get", method: http.MethodGet, path: "/responses/{id}", kind: store.ObjectResponse},
	{name: "responses.delete", method: http.MethodDelete, path: "/responses/{id}", kind: store.ObjectResponse, deletes: true},
	{name: "responses.cancel", method: http.MethodPost, path: "/responses/{id}/cancel", kind: store.ObjectResponse, body: bodyJSON},
	{name: "responses.input_items", method: http.MethodGet, path: "/responses/{id}/input_items", kind: store.ObjectResponse},
	{name: "embeddings", method: http.MethodPost, path: "/embeddings", body: bodyJSON, model: true},
	{name: "audio.transcriptions", method: http.MethodPost, path: "/audio/transcriptions", body: bodyStream, model: true},
	{name: "audio.translations", method: http.MethodPost, path: "/audio/translations", body: bodyStream, model: true},
	{name: "audio.speech", method: http.MethodPost, path: "/audio/speech", body: bodyJSON, model: true},
	{name: "memories.trace_summarize", method: http.MethodPost, path: "/memories/trace_summarize", body: bodyJSON, model: true},
	{name: "analytics", method: http.MethodPost, path: "/analytics-events/events", drop: true},
	// A realtime (WebRTC) call: the SDP answer names the call in its
	// Location; the call's sideband WebSocket (/realtime?call_id=) goes to
	// the same account.
	{name: "realtime.calls", method: http.MethodPost, path: "/realtime/calls", kind: store.ObjectRealtimeCall, creates: true, body: bodyStream},
	// The ChatGPT backend's file upload (Codex's attachments): the answer
	// names the file and where to put its bytes (the client uploads them
	// there itself), then the client says they are uploaded.
	{name: "files.create", method: http.MethodPost, path: "/files", kind: store.ObjectFile, creates: true, body: bodyJSON, chatgpt: true},
	{name: "files.uploaded", method: http.MethodPost, path: "/files/{id}/uploaded", kind: store.ObjectFile, body: bodyJSON, chatgpt: true},
	{name: "files.get", method: http.MethodGet, path: "/files/{id}", kind: store.ObjectFile, chatgpt: true},
	{name: "files.download", method: http.MethodGet, path: "/files/download/{id}", kind: store.ObjectFile, chatgpt: true},
	{name: "analytics", method: http.MethodPost, path: "/codex/analytics-events/events", drop: true, chatgpt: true},
}

// matchObjectRoute finds the route for method and rest (the path below
// the prefix), and the object id its path names ("" none). chatgpt says
// the prefix was the ChatGPT backend's base rather than a provider's.
func matchObjectRoute(method, rest string, chatgpt bool) (objectRoute, string, bool) {
	segs := strings.Split(strings.Trim(rest, "/"), "/")
	for _, rt := range objectRoutes {
		if rt.chatgpt != chatgpt || rt.method != method {
			continue
		}
		want := strings.Split(strings.Trim(rt.path, "/"), "/")
		if len(want) != len(segs) {
			continue
		}
		id, ok := "", true
		for i, w := range want {
			switch {
			case w == "{id}" && segs[i] != "" && validObjectID(segs[i]):
				id = segs[i]
			case w != segs[i]:
				ok = false
			}
		}
		if ok {
			return rt, id, true
		}
	}
	return objectRoute{}, "", false
}

// validObjectID accepts the ids OpenAI and the ChatGPT backend issue
// (file-..., file_..., resp_...): letters, digits, '-', '_' and '.', at most
// 200 bytes. Anything else is no id the relay recorded.
func validObjectID(id string) bool {
	if len(id) > 200 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// objectCall is one request on an object route as the relay serves it.
type objectCall struct {
	rt     objectRoute
	id     string // the object the path names ("" none)
	rest   string // the path below the prefix, as the upstream gets it
	r      *request
	hr     *http.Request
	body   []byte    // a JSON body, read whole (nil otherwise)
	stream io.Reader // a streamed body (nil otherwise): limited, or watch over it
	// limited bounds a streamed body; watch, when the key lists models,
	// checks the model field of a streamed multipart body as it passes.
	limited *limitedBody
	watch   *modelWatch
	log     requestLog
	// owner is the account of the object the request names (in its path
	// or its body); "" when it names none.
	owner string
}

// serveObject serves a request on an object route: admitted like a
// Responses request (the key, its model allow-list and budgets), sent to
// the account of the object it names (409 object_on_unavailable_account
// when that account cannot serve, 404 for an object the relay never saw,
// and then no account is asked), or else to the account selection picks,
// and recorded in the request log under its route.
func (s *Server) serveObject(w http.ResponseWriter, hr *http.Request, rt objectRoute, id, rest string) {
	ctx := hr.Context()
	cl, ident, ok := s.admitIdentified(w, hr)
	if !ok {
		return
	}
	if ident.Key == "" {
		ident = TurnMetadataIdentity(hr.Header)
	}
	if rt.drop {
		s.dropObjectRequest(w, hr)
		return
	}
	c := s.newObjectCall(hr, rt, id, rest, cl, ident)
	defer c.log.write()
	defer c.closeWatch()
	if err := s.readObjectBody(w, c); err != nil {
		s.failObject(w, c, err)
		return
	}
	s.serveObjectCall(ctx, w, c)
}

// newObjectCall starts the call's request and its log row.
func (s *Server) newObjectCall(hr *http.Request, rt objectRoute, id, rest string, cl client, ident Identity) *objectCall {
	c := &objectCall{rt: rt, id: id, rest: rest, hr: hr}
	now := s.cfg.Now()
	c.r = &request{id: store.NewID("req", now), start: now, transport: "http", path: hr.URL.Path, client: cl, ident: ident, header: hr.Header}
	c.log = requestLog{s: s, r: c.r, object: true}
	c.log.rec.Route, c.log.rec.ObjectID = rt.name, id
	if cl.keyed {
		s.countKeyUse(cl.key.ID)
	}
	return c
}

// backgroundCreate is POST /responses with background: true (and no
// stream): the upstream answers at once with the queued response, which
// the client polls (GET /responses/{id}) or cancels later, on its account.
var backgroundCreate = objectRoute{name: "responses.create", method: http.MethodPost, path: "/responses",
	kind: store.ObjectResponse, creates: true, body: bodyJSON, model: true}

// serveBackground serves a background response's creation, its body read
// and policed already: it goes where its previous_response_id or files
// live, else where selection picks, and the response it creates is an
// object of that account.
func (s *Server) serveBackground(w http.ResponseWriter, hr *http.Request, cl client, ident Identity, pol policed) {
	rest, _ := cutPrefix(hr.URL.Path, "/backend-api/codex", "/v1")
	c := s.newObjectCall(hr, backgroundCreate, "", rest, cl, ident)
	defer c.log.write()
	c.body = pol.body
	c.r.body, c.r.fields, c.r.asked, c.r.policy = pol.body, pol.fields, pol.asked, pol.note
	if prev := pol.fields.PreviousResponseID; prev != "" {
		acct, err := s.objectAccount(hr.Context(), cl.scope(), prev, store.ObjectResponse)
		var unknown *unknownObjectError
		if err != nil && !errors.As(err, &unknown) {
			s.failObject(w, c, err)
			return
		}
		c.owner = acct
	}
	s.serveObjectCall(hr.Context(), w, c)
}

// serveObjectCall admits a call whose body is read under its key's
// budgets, places it and forwards it.
func (s *Server) serveObjectCall(ctx context.Context, w http.ResponseWriter, c *objectCall) {
	reserved, err := s.admitBudget(ctx, c.r)
	c.r.reserved, c.log.rec.Reserved = reserved, reserved
	c.r.limits = s.limitsFor(ctx, c.r)
	if err != nil {
		s.failObject(w, c, err)
		return
	}
	if err := s.placeObjectCall(ctx, c); err != nil {
		s.failObject(w, c, err)
		return
	}
	if c.rt.name == "files.list" {
		s.listFiles(w, c)
		return
	}
	s.forwardObject(w, c)
}

// readObjectBody reads (or prepares to stream) the call's body and checks
// the model a JSON body names against the key's allow-list.
func (s *Server) readObjectBody(w http.ResponseWriter, c *objectCall) error {
	hr := c.hr
	switch c.rt.body {
	case bodyNone:
		return nil
	case bodyStream:
		if enc := strings.ToLower(strings.TrimSpace(hr.Header.Get("Content-Encoding"))); enc != "" && enc != "identity" {
			return refuse(http.StatusUnsupportedMediaType, "unsupported_encoding",
				"send uploads without a Content-Encoding: the relay streams them as they come")
		}
		if hr.ContentLength > s.cfg.MaxUploadBytes {
			return bodyError(errBodyTooLarge)
		}
		if ct := hr.Header.Get("Content-Type"); strings.HasPrefix(strings.ToLower(ct), "application/json") {
			// Codex sends image edits as JSON: read like one, so its file
			// references place it.
			break
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
		c.limited = &limitedBody{r: hr.Body, left: s.cfg.MaxUploadBytes}
		c.stream = c.limited
		w.Header().Del("Connection")
		if c.rt.model && c.r.client.restrictsModels() {
			// The model is a field of the upload: checked as it streams.
			boundary := multipartBoundary(hr.Header.Get("Content-Type"))
			if boundary == "" {
				return refuse(http.StatusUnsupportedMediaType, "unsupported_media_type",
					"this client key may only use the models it lists: send the upload as multipart/form-data with its \"model\" field")
			}
			c.watch = watchModel(c.limited, boundary, c.r.client.checkUploadModel)
			c.stream = c.watch
		}
		return nil
	}
	body, err := s.readRequestBody(w, hr, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	c.body = body
	var head struct {
		Model json.RawMessage `json:"model"`
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &head); err != nil {
			return refuse(http.StatusBadRequest, "invalid_json", "the request body is not valid JSON")
		}
	}
	var model string
	if len(head.Model) > 0 && string(head.Model) != "null" {
		if err := json.Unmarshal(head.Model, &model); err != nil {
			return refuse(http.StatusBadRequest, "invalid_json", "\"model\" must be a string")
		}
	}
	c.r.body, c.r.fields, c.r.asked = body, continuity.Fields{Model: model}, model
	if c.rt.model {
		if target, ok := c.r.client.key.Policy.ModelAliases[model]; ok {
			c.body = withMember(c.body, "model", target)
			c.r.body, c.r.fields.Model, c.r.policy = c.body, target, "model "+model+">"+target
			return nil
		}
		return c.r.client.checkModel(model)
	}
	return nil
}

// closeWatch ends the model watch's parser, if the call has one.
func (c *objectCall) closeWatch() {
	if c.watch != nil {
		c.watch.close()
	}
}

// streamRefusal is why a streamed body's read failed on the relay's side:
// past MaxUploadBytes, or a model the key may not use; nil when it did not.
func (c *objectCall) streamRefusal() error {
	if c.limited != nil && c.limited.over {
		return bodyError(errBodyTooLarge)
	}
	if c.watch != nil {
		return c.watch.refused()
	}
	return nil
}

// limitedBody streams a request body up to left bytes, and fails past it
// (errBodyTooLarge): the upstream's request breaks, and the client is told
// 413 as for any body too large.
type limitedBody struct {
	r    io.Reader
	left int64
	over bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.over = true
			return 0, errBodyTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// dropObjectRequest accepts a request the relay keeps to itself (Codex's
// analytics events): its body is read and discarded, bounded, and nothing
// goes upstream.
func (s *Server) dropObjectRequest(w http.ResponseWriter, hr *http.Request) {
	if _, err := s.readRequestBody(w, hr, s.cfg.MaxBodyBytes); err != nil {
		s.writeFailure(w, err)
		return
	}
	s.metrics.dropped.Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte("{}"))
}

// placeObjectCall finds the account of the object the call names: in its
// path (unknown: 404, and no account is asked) or in its JSON body (file
// references; unknown ones name no account).
func (s *Server) placeObjectCall(ctx context.Context, c *objectCall) error {
	scope := c.r.client.scope()
	if c.id != "" {
		acct, err := s.objectAccount(ctx, scope, c.id, c.rt.kind)
		if err != nil {
			return err
		}
		c.owner = acct
		return nil
	}
	if c.body != nil {
		acct, err := s.referencedAccount(ctx, scope, c.body)
		if err != nil {
			return err
		}
		if c.owner != "" && acct != "" && acct != c.owner {
			return &conflictError{A: hardOwner{account: c.owner, source: hardPreviousResponse}, B: hardOwner{account: acct, source: hardObject}}
		}
		c.owner = cmp.Or(c.owner, acct)
	}
	return nil
}

// objectAccount is the account of the object id in scope: recorded in the
// store, or (a response streamed through this replica) in the owner index.
func (s *Server) objectAccount(ctx context.Context, scope, id string, kind store.ObjectKind) (string, error) {
	o, err := s.cfg.Store.Object(ctx, scope, id, s.cfg.Now())
	if err == nil {
		return o.AccountID, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return "", storeUnavailable("read the object's account", err)
	}
	if kind == store.ObjectResponse {
		if ow, ok := s.owners.get(responseKey(id)); ok && ow.scope == scope {
			return ow.account, nil
		}
	}
	return "", &unknownObjectError{kind: kind, id: id}
}

// unknownObjectError: a request names an object the relay never saw in its
// key's scope (or that expired). No account is asked.
type unknownObjectError struct {
	kind store.ObjectKind
	id   string
}

func (e *unknownObjectError) Error() string {
	return fmt.Sprintf("no %s with id %s was created through this relay with this client key", e.kind, e.id)
}

// referencedAccount reads the file references in a JSON body ("file_id"
// members, sediment:// URIs) and returns the one account the recorded ones
// live on; two accounts conflict, and nothing goes upstream.
func (s *Server) referencedAccount(ctx context.Context, scope string, body []byte) (string, error) {
	ids := fileReferences(body)
	if len(ids) == 0 {
		return "", nil
	}
	var acct string
	for _, id := range ids {
		o, err := s.cfg.Store.Object(ctx, scope, id, s.cfg.Now())
		if errors.Is(err, store.ErrNotFound) {
			continue // not made through the relay: it names no account
		}
		if err != nil {
			return "", storeUnavailable("read a referenced file's account", err)
		}
		switch {
		case acct == "":
			acct = o.AccountID
		case acct != o.AccountID:
			return "", &conflictError{A: hardOwner{account: acct, source: hardObject}, B: hardOwner{account: o.AccountID, source: hardObject}}
		}
	}
	return acct, nil
}

// fileReferences lists the file ids a JSON body references: the values of
// "file_id" members and the ids in sediment:// URIs (Codex's ChatGPT
// attachments), at any depth, at most 64. A body without "file_id" or
// "sediment://" is not decoded.
func fileReferences(body []byte) []string {
	if !bytes.Contains(body, []byte(`"file_id"`)) && !bytes.Contains(body, []byte("sediment://")) {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil
	}
	var ids []string
	seen := map[string]bool{}
	add := func(id string) {
		if id != "" && validObjectID(id) && !seen[id] && len(ids) < 64 {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		if depth > 32 {
			return
		}
		switch x := v.(type) {
		case map[string]any:
			for k, m := range x {
				if s, ok := m.(string); ok {
					if k == "file_id" {
						add(s)
					} else if id, ok := strings.CutPrefix(s, "sediment://"); ok {
						add(id)
					}
					continue
				}
				walk(m, depth+1)
			}
		case []any:
			for _, m := range x {
				walk(m, depth+1)
			}
		}
	}
	walk(v, 0)
	return ids
}

// failObject answers a call that ended before (or instead of) an upstream
// answer, and records why.
func (s *Server) failObject(w http.ResponseWriter, c *objectCall, err error) {
	f, class := objectFailure(err, s.cfg.Now())
	c.log.attempt(1, "", "", class, "", actionTerminal, f.status, f.code(), err.Error(), s.cfg.Now(), 0)
	c.log.answered(f, class)
	if class == classCancelled {
		return
	}
	for k, vs := range f.header {
		w.Header()[k] = vs
	}
	setLimitHeaders(w.Header(), c.r.limits)
	writeError(w, f.status, f.err)
}

// objectFailure is failureFor with the object routes' own answer: an
// object the relay never saw is 404 not_found (failureFor answers 409
// object_on_unavailable_account for an object whose account cannot serve).
func objectFailure(err error, now time.Time) (*failure, attemptClass) {
	var unknown *unknownObjectError
	switch {
	case errors.As(err, &unknown):
		return relayFailure(http.StatusNotFound, wire.TypeInvalidRequest, "not_found", unknown.Error()), classInvalid
	}
	return failureFor(err, now)
}

// codeObjectUnavailable is the type and code of the 409 for an object
// whose account cannot serve.
const codeObjectUnavailable = "object_on_unavailable_account"

// statusWords says why an owner cannot serve without naming it or what an
// operator wrote: its status alone.
func statusWords(e *ownerUnavailableError) string {
	if !e.InScope {
		return "it is gone or outside this client key's scope"
	}
	if e.Account.Status != "" && e.Account.Status != store.StatusActive {
		return string(e.Account.Status)
	}
	return "at its capacity or already failed"
}

// serveObjectRoute serves r when rest (below a provider prefix) is an
// object route, and reports whether it was.
func (s *Server) serveObjectRoute(w http.ResponseWriter, r *http.Request, rest string) bool {
	rt, id, ok := matchObjectRoute(r.Method, rest, false)
	if ok {
		s.serveObject(w, r, rt, id, rest)
	}
	return ok
}

// statusClass is an HTTP status's class for metrics: "2xx", "4xx", "5xx"
// ("499" for a client that went away).
func statusClass(status int) string {
	switch {
	case status == statusClientClosed:
		return "499"
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	}
	return "2xx"
}

// storedPrevious places a Responses request whose previous_response_id
// names a stored response the relay recorded (a background response,
// perhaps created through another replica) and this replica's owner index
// does not know: only its account can continue it. Continuity that can
// rebuild the chain binds nothing, as for any previous_response_id.
func (s *Server) storedPrevious(ctx context.Context, r *request) error {
	prev := r.fields.PreviousResponseID
	if prev == "" || r.rebuildable() {
		return nil
	}
	if _, ok := s.owners.get(responseKey(prev)); ok {
		return nil
	}
	o, err := s.cfg.Store.Object(ctx, r.client.scope(), prev, s.cfg.Now())
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return storeUnavailable("read the previous response's account", err)
	}
	r.objectOwner = o.AccountID
	return nil
}
