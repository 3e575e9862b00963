package relay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// maxObjectDocument bounds a JSON answer the relay reads whole (to learn
// the object it creates or the usage it reports); a larger one streams
// through unread.
const maxObjectDocument = 64 << 20

// forwardObject sends the call to its object's account, or to the account
// selection picks: a call that names no object and whose body can be sent
// again moves to the next account when one fails before answering (a 429,
// a 5xx, no answer), as a Responses request does; one bound to its object's
// account, or streaming its body, gets that account's answer.
func (s *Server) forwardObject(w http.ResponseWriter, c *objectCall) {
	ctx := c.hr.Context()
	exclude := map[string]bool{}
	if c.rt.chatgpt {
		if err := s.excludeKind(ctx, exclude, store.KindChatGPT); err != nil {
			s.failObject(w, c, err)
			return
		}
	}
	c.r.objectOwner = c.owner
	movable := c.owner == "" && c.stream == nil
	for seq := 1; ; seq++ {
		ch, err := s.choose(ctx, c.r, plan{}, exclude, "")
		if err != nil {
			s.failObject(w, c, err)
			return
		}
		acct := ch.target.Account.ID
		started := s.cfg.Now()
		// The attempt's upstream request ends with the client, or when
		// the upstream stays silent for the idle deadline.
		actx, cancel := context.WithCancel(ctx)
		watch := time.AfterFunc(s.cfg.StreamIdleTimeout, cancel)
		resp, err := s.sendObject(actx, c, ch.target)
		if err != nil {
			watch.Stop()
			cancel()
			ch.release()
			e := attemptEnd{Now: s.cfg.Now(), Transport: err, Cancelled: ctx.Err() != nil, Stalled: ctx.Err() == nil && actx.Err() != nil}
			if refusal := c.streamRefusal(); refusal != nil {
				s.failObject(w, c, refusal)
				return
			}
			o := classify(e)
			c.log.attempt(seq, acct, "", o.Class, "", o.Action, 0, "", err.Error(), started, 0)
			if o.Class == classCancelled {
				c.log.ended(classCancelled)
				return
			}
			if unreachableSign(o.Class, e) {
				s.unreachable.mark(acct, s.cfg.Now().Add(unreachableFor))
			}
			if movable && o.Action == actionNext && seq < s.cfg.MaxAttempts {
				exclude[acct] = true
				continue
			}
			s.log.Warn("upstream unreachable", "account", acct, "route", c.rt.name, "err", err)
			f := failUnreachable()
			c.log.answered(f, o.Class)
			writeError(w, f.status, f.err)
			return
		}
		s.unreachable.clear(acct)
		s.foldUsage(acct, resp.Header)
		if resp.StatusCode >= 400 {
			raw, _ := io.ReadAll(io.LimitReader(&idleReader{r: resp.Body, watch: watch, idle: s.cfg.StreamIdleTimeout}, maxErrorBody))
			resp.Body.Close()
			watch.Stop()
			cancel()
			ch.release()
			var ep *wire.Error
			if e, ok := wire.ParseErrorBody(raw); ok {
				ep = &e
			}
			retry, _ := wire.ParseRetryAfter(resp.Header, s.cfg.Now())
			e := attemptEnd{Now: s.cfg.Now(), Status: resp.StatusCode, Err: ep, RetryAfter: retry, Began: true}
			o := classify(e)
			detail := ""
			if ep != nil {
				detail = ep.Message
			}
			status, code := record(e, nil)
			c.log.attempt(seq, acct, "", o.Class, "", o.Action, status, code, detail, started, 0)
			s.penalise(context.WithoutCancel(ctx), acct, o.Penalty)
			if movable && o.Action == actionNext && seq < s.cfg.MaxAttempts {
				exclude[acct] = true
				continue
			}
			c.log.rec.AccountID = acct
			f := screenAnswer(resp.StatusCode, nil, raw, s.cfg.Now())
			c.log.answered(f, o.Class)
			passHeaders(w.Header(), resp.Header)
			setLimitHeaders(w.Header(), c.r.limits)
			if f.body == nil {
				writeError(w, f.status, f.err)
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "" {
				w.Header().Set("Content-Type", ct)
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(f.body)
			return
		}
		retry := movable && seq < s.cfg.MaxAttempts
		cut := func() bool {
			defer cancel()
			defer watch.Stop()
			defer ch.release()
			return s.deliverObject(w, c, ch, resp, watch, seq, started, retry)
		}()
		if cut {
			// The answer broke before any of it reached the client: the
			// next account answers instead, as for a 5xx.
			exclude[acct] = true
			continue
		}
		return
	}
}

// excludeKind excludes every account not of kind (the ChatGPT backend's
// own routes).
func (s *Server) excludeKind(ctx context.Context, exclude map[string]bool, kind store.Kind) error {
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return storeUnavailable("read accounts", err)
	}
	for _, a := range accounts {
		if a.Kind != kind {
			exclude[a.ID] = true
		}
	}
	return nil
}

// objectURL is where the call goes on t's account: below its base URL,
// or for the ChatGPT backend's own routes below that base without /codex.
func (c *objectCall) objectURL(t target) string {
	base := strings.TrimRight(t.Account.BaseURL, "/")
	if c.rt.chatgpt {
		base = strings.TrimSuffix(base, "/codex")
	}
	u := base + c.rest
	if q := c.hr.URL.RawQuery; q != "" {
		u += "?" + q
	}
	return u
}

// sendObject sends the call to t's account: the client's forwardable
// headers (its Content-Type with them: a multipart boundary), the
// account's credentials, and the body read or streamed.
func (s *Server) sendObject(ctx context.Context, c *objectCall, t target) (*http.Response, error) {
	var body io.Reader
	length := int64(0)
	switch {
	case c.body != nil:
		body, length = strings.NewReader(string(c.body)), int64(len(c.body))
	case c.stream != nil:
		body, length = c.stream, c.hr.ContentLength
	}
	req, err := http.NewRequestWithContext(ctx, c.rt.method, c.objectURL(t), body)
	if err != nil {
		return nil, err
	}
	forwardHeaders(req.Header, c.hr.Header)
	t.authorize(req.Header)
	if c.body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.stream != nil && length < 0 {
		length = -1 // chunked: the client sent none
	}
	req.ContentLength = length
	return s.cfg.Upstream.do(t, req)
}

// deliverObject passes a successful answer on. A JSON answer that creates
// or deletes an object, or reports usage, is read whole (bounded) first:
// the object is recorded on the account (before the client can name it)
// and the usage priced. Anything else (file contents, audio, a stream)
// streams through, each write bounded by the client write timeout; an
// upstream that breaks mid-answer breaks the client's answer too, so a
// cut is never a short file.
//
// The attempt (seq, started) is logged here, once its answer is known. A
// JSON answer the relay reads whole and that breaks before its end has
// reached the client in nothing: with retry, deliverObject reports the cut
// (true) and the caller moves the call to the next account; without, the
// client is told the answer was interrupted.
func (s *Server) deliverObject(w http.ResponseWriter, c *objectCall, ch choice, resp *http.Response, watch *time.Timer,
	seq int, started time.Time, retry bool) (cut bool) {
	defer resp.Body.Close()
	ctx := c.hr.Context()
	acct := ch.target.Account.ID
	first := s.cfg.Now().Sub(started)
	body := &idleReader{r: resp.Body, watch: watch, idle: s.cfg.StreamIdleTimeout}
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(strings.ToLower(ct), "application/json") && resp.ContentLength <= maxObjectDocument {
		doc, err := io.ReadAll(io.LimitReader(body, maxObjectDocument+1))
		if err != nil {
			if ctx.Err() != nil {
				c.log.attempt(seq, acct, "", classCancelled, "", actionTerminal, resp.StatusCode, "", err.Error(), started, first)
				c.log.ended(classCancelled)
				return false
			}
			action := actionTerminal
			if retry {
				action = actionNext
			}
			c.log.attempt(seq, acct, "", classStreamCut, "", action, resp.StatusCode, "", err.Error(), started, first)
			if retry {
				return true
			}
			f := failInterrupted()
			c.log.rec.AccountID = acct
			c.log.answered(f, classStreamCut)
			setLimitHeaders(w.Header(), c.r.limits)
			writeError(w, f.status, f.err)
			return false
		}
		c.log.attempt(seq, acct, "", classOK, "", actionDone, resp.StatusCode, "", "", started, first)
		c.log.rec.AccountID = acct
		s.writeObjectHeaders(w, c, resp)
		if int64(len(doc)) <= maxObjectDocument {
			s.noteObjectAnswer(ctx, c, ch, doc)
			c.log.rec.Status = resp.StatusCode
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(doc)
			return false
		}
		// Larger than the relay reads (many large images): what was read
		// goes first, the rest streams through unread.
		c.log.rec.Status = resp.StatusCode
		w.WriteHeader(resp.StatusCode)
		if _, err := w.Write(doc); err != nil {
			c.log.ended(classCancelled)
			return false
		}
		s.finishStream(ctx, w, c, body)
		return false
	}
	c.log.attempt(seq, acct, "", classOK, "", actionDone, resp.StatusCode, "", "", started, first)
	c.log.rec.AccountID = acct
	s.writeObjectHeaders(w, c, resp)
	if loc := resp.Header.Get("Location"); c.rt.creates && loc != "" {
		// An object named by its Location (a realtime call), recorded
		// before the client can name it.
		id := loc[strings.LastIndexByte(loc, '/')+1:]
		s.noteObjectAnswer(ctx, c, ch, mustJSON(map[string]string{"id": id}))
		w.Header().Set("Location", loc)
	}
	if resp.ContentLength >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	c.log.rec.Status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	if c.rt.kind == store.ObjectResponse && c.id != "" && strings.HasPrefix(strings.ToLower(ct), "text/event-stream") {
		// A stored response streamed again (?stream=true): its terminal
		// event's usage is charged, once, as a finished read's is.
		tap := &sseTap{}
		s.finishStream(ctx, w, c, io.TeeReader(body, tap))
		if doc := tap.terminalResponse(); doc != nil {
			s.noteObjectAnswer(ctx, c, ch, doc)
		}
		return false
	}
	s.finishStream(ctx, w, c, body)
	return false
}

// writeObjectHeaders sets a successful answer's headers: the upstream's
// that Codex reads, the client's limits and the content type.
func (s *Server) writeObjectHeaders(w http.ResponseWriter, c *objectCall, resp *http.Response) {
	passHeaders(w.Header(), resp.Header)
	setLimitHeaders(w.Header(), c.r.limits)
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
}

// maxTappedEvent bounds one event an sseTap keeps: a terminal event holds
// the whole response, output included.
const maxTappedEvent = 8 << 20

// sseTap reads a Server-Sent Events stream written through it, line by
// line, and keeps the data of its last terminal event (response.completed,
// .incomplete, .failed); everything else is passed over. An event past
// maxTappedEvent is not kept.
type sseTap struct {
	line     []byte // the line so far
	data     []byte // the event's data so far
	over     bool   // the event is past maxTappedEvent
	terminal []byte
}

func (t *sseTap) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.add(p)
			break
		}
		t.add(p[:i])
		t.endLine()
		p = p[i+1:]
	}
	return n, nil
}

func (t *sseTap) add(b []byte) {
	if len(t.line)+len(t.data)+len(b) > maxTappedEvent {
		t.over, t.line = true, t.line[:0]
		return
	}
	t.line = append(t.line, b...)
}

func (t *sseTap) endLine() {
	line := bytes.TrimSuffix(t.line, []byte("\r"))
	switch {
	case len(line) == 0:
		if !t.over && len(t.data) > 0 {
			if typ, _ := wire.EventType(t.data); wire.IsTerminal(typ) {
				t.terminal = append(t.terminal[:0], t.data...)
			}
		}
		t.data, t.over = t.data[:0], false
	case bytes.HasPrefix(line, []byte("data:")) && !t.over:
		v := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
		if len(t.data) > 0 {
			t.data = append(t.data, '\n')
		}
		t.data = append(t.data, v...)
	}
	t.line = t.line[:0]
}

// terminalResponse is the response object of the stream's terminal event,
// nil when it had none.
func (t *sseTap) terminalResponse() []byte {
	if t.terminal == nil {
		return nil
	}
	var ev struct {
		Response json.RawMessage `json:"response"`
	}
	if json.Unmarshal(t.terminal, &ev) != nil || len(ev.Response) == 0 {
		return nil
	}
	return ev.Response
}

// finishStream streams the rest of an answer whose headers were sent. A
// break mid-answer breaks the client's answer too, rather than end it
// short (a cut file must never read as a whole one).
func (s *Server) finishStream(ctx context.Context, w http.ResponseWriter, c *objectCall, body io.Reader) {
	if err := s.streamThrough(w, body); err != nil {
		c.log.ended(classStreamCut)
		c.log.rec.ErrorCode = string(classStreamCut)
		if ctx.Err() != nil {
			c.log.ended(classCancelled)
			return
		}
		panic(http.ErrAbortHandler)
	}
}

// streamThrough copies an upstream answer to the client, flushing as it
// goes, each write bounded by ClientWriteTimeout (the upstream's silence is
// the watchdog's: see idleReader).
func (s *Server) streamThrough(w http.ResponseWriter, src io.Reader) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.ClientWriteTimeout))
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			_ = rc.Flush()
		}
		if errors.Is(err, io.EOF) {
			_ = rc.SetWriteDeadline(time.Time{})
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// idleReader reads an upstream answer and holds off its watchdog while
// bytes come: an upstream silent for the idle deadline (before its
// headers, or mid-answer) has its request cancelled, which ends the read.
type idleReader struct {
	r     io.Reader
	watch *time.Timer
	idle  time.Duration
}

func (ir *idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	if n > 0 {
		ir.watch.Reset(ir.idle)
	}
	return n, err
}

// objectAnswer is what the relay reads of a JSON answer on an object
// route.
type objectAnswer struct {
	ID     string          `json:"id"`
	FileID string          `json:"file_id"`
	Status string          `json:"status"`
	Model  string          `json:"model"`
	Usage  json.RawMessage `json:"usage"`
	// Data holds an images answer's images (each priced per image too).
	Data []json.RawMessage `json:"data"`
	// ExpiresAt is when the upstream forgets the object (files with an
	// expiry), in Unix seconds.
	ExpiresAt *int64 `json:"expires_at"`
}

// noteObjectAnswer records what a successful JSON answer created, deleted
// or used: a new object on the account that answered (written before the
// client has its id, so every replica finds it), a deleted one forgotten,
// and usage priced into the request's log row. A background response's
// usage is charged once, by the first answer that reports it finished.
func (s *Server) noteObjectAnswer(ctx context.Context, c *objectCall, ch choice, doc []byte) {
	var a objectAnswer
	if json.Unmarshal(doc, &a) != nil {
		return
	}
	scope := c.r.client.scope()
	now := s.cfg.Now()
	images := 0
	if c.rt.images {
		images = len(a.Data)
	}
	hasUsage := len(a.Usage) > 0 && string(a.Usage) != "null" || images > 0
	switch {
	case c.rt.creates:
		id := cmp.Or(a.FileID, a.ID)
		if !validObjectID(id) || id == "" {
			s.log.Warn("object answer without an id", "route", c.rt.name, "account", ch.target.Account.ID)
			return
		}
		c.log.rec.ObjectID = id
		o := store.Object{Scope: scope, ID: id, Kind: c.rt.kind, AccountID: ch.target.Account.ID,
			Organization: ch.target.Account.Organization, ClientKeyID: c.r.client.key.ID, ThreadKey: string(c.r.ident.Key),
			RequestID: c.r.id, Created: now}
		if a.ExpiresAt != nil && *a.ExpiresAt > 0 {
			o.Expires = time.Unix(*a.ExpiresAt, 0)
		}
		if hasUsage && (c.rt.kind != store.ObjectResponse || finishedStatus(a.Status)) {
			o.Settled = now // charged by this answer, below: never by a later read
		}
		wctx, cancel := storeWriteContext(ctx)
		defer cancel()
		if err := s.cfg.Store.PutObject(wctx, o); err != nil {
			s.log.Error("record object: later requests naming it will not find its account", "object", id, "err", err)
		}
	case c.rt.deletes:
		wctx, cancel := storeWriteContext(ctx)
		defer cancel()
		if err := s.cfg.Store.DeleteObject(wctx, scope, c.id); err != nil {
			s.log.Warn("forget deleted object", "object", c.id, "err", err)
		}
		return
	}
	if !hasUsage {
		return
	}
	tr := usageTracker(a.Model, a.Usage)
	tr.images = int64(images)
	if c.rt.kind == store.ObjectResponse && (c.id != "" || !finishedStatus(a.Status)) {
		if c.id == "" {
			return // a background response's usage so far: its final read charges it
		}
		// A stored response read again reports the usage it had: only the
		// first answer that finds it finished charges it.
		if !finishedStatus(a.Status) {
			return
		}
		wctx, cancel := storeWriteContext(ctx)
		defer cancel()
		first, err := s.cfg.Store.SettleObject(wctx, scope, c.id, now)
		if err != nil || !first {
			return
		}
	}
	c.log.served(ch.target.Account.ID, "", attemptResult{tr: *tr}, http.StatusOK, "")
}

// finishedStatus reports a response status whose usage is final.
func finishedStatus(s string) bool {
	return s == "completed" || s == "incomplete" || s == "failed" || s == "cancelled"
}

// usageTracker reads a usage object of any of OpenAI's shapes (the
// Responses API's input_tokens/output_tokens, the embeddings' prompt_tokens,
// the images' with their details) into what charge prices.
func usageTracker(model string, raw json.RawMessage) *tracker {
	var u struct {
		Input   int64 `json:"input_tokens"`
		Output  int64 `json:"output_tokens"`
		Prompt  int64 `json:"prompt_tokens"`
		Total   int64 `json:"total_tokens"`
		Details struct {
			Cached int64 `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutDetails struct {
			Reasoning int64 `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
	}
	tr := &tracker{work: true, model: model}
	if len(raw) == 0 || json.Unmarshal(raw, &u) != nil {
		return tr
	}
	tr.usage = true
	tr.input = cmp.Or(u.Input, u.Prompt)
	tr.outputTok, tr.cached, tr.reasoning = u.Output, u.Details.Cached, u.OutDetails.Reasoning
	tr.total = cmp.Or(u.Total, tr.input+tr.outputTok)
	return tr
}

// listFiles answers GET /files from what the relay knows: the files its
// key's scope created, read from each account that holds some, merged
// newest first. Another tenant's files on a shared account never show,
// and no account is asked when the scope made none.
func (s *Server) listFiles(w http.ResponseWriter, c *objectCall) {
	ctx := c.hr.Context()
	scope := c.r.client.scope()
	objs, err := s.cfg.Store.Objects(ctx, store.ObjectFilter{Scope: scope, Kind: store.ObjectFile})
	if err != nil {
		s.failObject(w, c, storeUnavailable("list files", err))
		return
	}
	mine := map[string]bool{}
	byAccount := map[string]bool{}
	for _, o := range objs {
		mine[o.ID] = true
		byAccount[o.AccountID] = true
	}
	data := []json.RawMessage{}
	type dated struct {
		created int64
		raw     json.RawMessage
	}
	var all []dated
	for acct := range byAccount {
		c.r.objectOwner = acct
		ch, err := s.choose(ctx, c.r, plan{}, map[string]bool{}, "")
		if err != nil {
			s.failObject(w, c, err)
			return
		}
		resp, err := s.sendObject(ctx, c, ch.target)
		ch.release()
		if err != nil {
			s.failObject(w, c, err)
			return
		}
		doc, err := io.ReadAll(io.LimitReader(resp.Body, maxObjectDocument))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			f := screenAnswer(cmp.Or(resp.StatusCode, http.StatusBadGateway), nil, doc, s.cfg.Now())
			c.log.answered(f, classServer)
			writeError(w, f.status, f.err)
			return
		}
		var page struct {
			Data []json.RawMessage `json:"data"`
		}
		_ = json.Unmarshal(doc, &page)
		for _, f := range page.Data {
			var h struct {
				ID      string `json:"id"`
				Created int64  `json:"created_at"`
			}
			if json.Unmarshal(f, &h) == nil && mine[h.ID] {
				all = append(all, dated{h.Created, f})
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].created > all[j].created })
	for _, d := range all {
		data = append(data, d.raw)
	}
	c.log.rec.Status = http.StatusOK
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(mustJSON(map[string]any{"object": "list", "data": data, "has_more": false}))
}
