package relay

import (
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
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// maxErrorBody bounds an upstream error body the relay reads.
const maxErrorBody = 1 << 20

// serveResponses serves POST .../responses (and /compact) over HTTP/SSE.
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request, sub string) {
	ctx := r.Context()
	c := &call{id: store.NewID("req", s.cfg.Now()), start: s.cfg.Now(), transport: "http", path: r.URL.Path, sub: sub}
	var body []byte
	// A refused request that says another replica forwarded it is read (the
	// hop's signature covers the body) and admitted if the hop verifies.
	vouch := func() bool {
		if r.Header.Get(HeaderHop) == "" || len(s.cfg.Replica.HopKey) == 0 {
			return false
		}
		b, err := readBody(r, s.cfg.MaxBodyBytes)
		if err != nil {
			return false
		}
		body, c.hopFrom = b, s.hopSender(r, b)
		return c.hopFrom != ""
	}
	cl, ident, ok := s.admitIdentifiedOr(w, r, vouch)
	if !ok {
		return
	}
	c.client = cl
	if body == nil {
		var err error
		if body, err = readBody(r, s.cfg.MaxBodyBytes); err != nil {
			a := bodyAnswer(err)
			writeError(w, a.Status, a.Err)
			return
		}
		c.hopFrom = s.hopSender(r, body)
	}
	fields, err := continuity.RequestFields(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_json", Message: "the request body is not a valid Responses request: " + err.Error()})
		return
	}
	if !cl.allowsModel(fields.Model) {
		writeError(w, http.StatusForbidden, apiError{Type: "invalid_request_error", Code: "model_not_allowed", Message: fmt.Sprintf("this client key may not use model %q", fields.Model)})
		return
	}
	c.body, c.fields, c.ident = body, fields, ident
	c.turnState = strings.TrimSpace(r.Header.Get(wire.HeaderTurnState))
	c.header = r.Header.Clone()
	if o, ok := s.owners.get(turnStateKey(c.turnState)); ok && o.proxy {
		// The relay made this turn state up; the upstream never saw it.
		c.header.Del(wire.HeaderTurnState)
	}
	if s.forward(w, r, c) {
		return // served by the replica holding the thread's lane
	}
	c.header.Del(HeaderHop)
	s.dispatchHTTP(ctx, w, c)
}

// failure is an answer an attempt produced but did not send.
type failure struct {
	status int
	header http.Header
	body   []byte
	class  Class
}

// dispatchHTTP runs attempts until one answers the client.
func (s *Server) dispatchHTTP(ctx context.Context, w http.ResponseWriter, c *call) {
	exclude := map[string]bool{}
	var attempts []store.Attempt
	var first *failure
	rec := store.RequestRecord{}
	defer func() { s.logRequest(c, rec, attempts) }()
	out := newSSEOut(w)
	// answer sends a failure the client has not seen yet: as an HTTP error,
	// or, when the stream was already committed (keep-alives while waiting
	// for capacity), as its terminal event.
	answer := func(f *failure) {
		if out.committed {
			msg := string(f.body)
			if e, ok := wire.ParseErrorBody(f.body); ok {
				msg = e.Message
			}
			_ = out.event(wire.EventResponseFailed, failedEvent("", c.id, cmp.Or(string(f.class), "upstream_error"), msg))
			return
		}
		c.writeRaw(w, f.status, f.header, f.body)
	}
	var prevAccount string
	rc := newCiphertextRecovery(!s.cfg.DisableRecovery, c)
	refreshed := map[string]bool{}
	for n := 1; n <= s.cfg.MaxAttempts; n++ {
		laneOwner := ""
		if s.pool != nil && c.ident.Key != "" && c.sub == "" {
			laneOwner, _ = s.pool.Owner(s.laneKey(c))
		}
		ch, err := s.chooseFor(ctx, c, exclude, laneOwner, func() {})
		if err != nil {
			a := selectionAnswer(err, s.cfg.Now())
			var none *NoAccountError
			if first != nil && errors.As(err, &none) && none.EarliestReset.IsZero() {
				// Every account failed this request: the client gets the first failure.
				answer(first)
				rec.Status, rec.ErrorCode = first.status, string(first.class)
				return
			}
			if a.Status == http.StatusInternalServerError {
				s.log.Error("select account", "err", err)
			}
			answer(&failure{status: a.Status, body: errorJSON(a.Err), class: selectionClass(err)})
			rec.Status, rec.ErrorCode = a.Status, cmp.Or(a.Err.Code, a.Err.Type)
			attempts = append(attempts, s.attemptRecord(c, n, "", prevAccount, selectionClass(err), "", ActionTerminal, a.Status, a.Err.Code, err.Error(), s.cfg.Now(), 0))
			return
		}
		started := s.cfg.Now()
		if prevAccount != "" && prevAccount != ch.target.Account.ID && c.moveIsFailover() {
			c.recovery = RecoveryFailover
		}
		recovery := c.recovery
		var res Outcome
		var f *failure
		var info attemptInfo
		if s.bridgeable(c, ch.target) {
			res, f, info = s.attemptBridge(ctx, w, out, c, ch)
		} else {
			res, f, info = s.attemptHTTP(ctx, w, out, c, ch)
		}
		s.metrics.attempts.WithLabelValues(ch.target.Account.ID, string(res.Class), string(res.Action)).Inc()
		if s.refreshAfter401(ctx, c, ch.target, res, refreshed) {
			attempts = append(attempts, s.attemptRecord(c, n, ch.target.Account.ID, prevAccount, res.Class, "token_refresh", ActionSame, info.status, info.code, info.detail, started, info.firstEvent))
			prevAccount = ch.target.Account.ID
			continue
		}
		attempts = append(attempts, s.attemptRecord(c, n, ch.target.Account.ID, prevAccount, res.Class, recovery, res.Action, info.status, info.code, info.detail, started, info.firstEvent))
		rec.AccountID, rec.Recovery = ch.target.Account.ID, recovery
		s.penalise(context.WithoutCancel(ctx), ch.target.Account.ID, res.Penalty)
		switch res.Action {
		case ActionDone:
			rec.Status, rec.FirstEvent = http.StatusOK, info.firstEvent
			rec.InputTokens, rec.OutputTokens, rec.CachedTokens = info.tr.input, info.tr.outputTok, info.tr.cached
			return
		case ActionTerminal:
			if res.Class == ClassCiphertext && f != nil {
				if rc.retry(c, ch.target.Account.ID, f, info.status, out.committed, ctx.Err() != nil, s.cfg.MaxAttempts-n, exclude) {
					if first == nil {
						first = rc.first
					}
					prevAccount = ch.target.Account.ID
					continue
				}
				if rc.first != nil {
					f = rc.first // no account accepted: the client gets the first mismatch failure
				}
			}
			rec.Status, rec.ErrorCode, rec.FirstEvent = info.status, cmp.Or(info.code, string(res.Class)), info.firstEvent
			if f != nil {
				answer(f)
			}
			return
		}
		if first == nil && f != nil {
			first = f
		}
		c.dropTurnStateOf(s, ch.target.Account.ID)
		if !info.sameAccount {
			exclude[ch.target.Account.ID] = true
		}
		prevAccount = ch.target.Account.ID
		if ctx.Err() != nil {
			return
		}
	}
	if first == nil {
		first = &failure{status: http.StatusServiceUnavailable, body: errorJSON(apiError{Type: "server_error", Code: wire.CodeServerIsOverloaded, Message: "no account could serve this request"})}
	}
	answer(first)
	rec.Status, rec.ErrorCode = first.status, string(first.class)
}

func selectionClass(err error) Class {
	var conflict *ConflictError
	if errors.As(err, &conflict) {
		return "conflict"
	}
	return "no_account"
}

func (s *Server) attemptRecord(c *call, seq int, account, from string, class Class, recovery string, action Action, status int, code, detail string, started time.Time, first time.Duration) store.Attempt {
	return store.Attempt{RequestID: c.id, Seq: seq, ThreadKey: string(c.ident.Key), SessionID: c.ident.Session,
		ThreadID: c.ident.Thread, AccountID: account, FromAccountID: from, Transport: c.transport, Class: string(class),
		Recovery: recovery, Action: string(action), Status: status, ErrorCode: code, Detail: detail,
		StartedAt: started, EndedAt: s.cfg.Now(), FirstEvent: first}
}

// RecoveryHeader names the last recovery action a request needed.
const RecoveryHeader = "X-Codex-Relay-Recovery"

// writeRaw sends a held answer as the upstream gave it.
func (c *call) writeRaw(w http.ResponseWriter, status int, h http.Header, body []byte) {
	c.markRecovery(w.Header())
	for k, vs := range h {
		w.Header()[k] = vs
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// attemptInfo is what the attempt record needs.
type attemptInfo struct {
	status     int
	code       string
	detail     string
	firstEvent time.Duration
	tr         tracker
	// sameAccount: the next attempt may use the same account (its lane was
	// retired by the upstream, or it serves HTTP only).
	sameAccount bool
}

// passHeaders are upstream answer headers Codex reads: rate limits, turn
// state, request ids.
func passHeaders(dst, src http.Header) {
	for k, vs := range src {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "x-codex-") || lk == "x-request-id" || strings.HasPrefix(lk, "openai-") || strings.HasPrefix(lk, "x-ratelimit-") {
			dst[k] = append([]string(nil), vs...)
		}
	}
}

// attemptHTTP tries the request on one account. It returns the outcome and,
// for a failure the client has not been sent, the answer to send.
func (s *Server) attemptHTTP(ctx context.Context, w http.ResponseWriter, out *sseOut, c *call, ch choice) (Outcome, *failure, attemptInfo) {
	acct := ch.target.Account.ID
	defer s.inFlight(acct)()
	var info attemptInfo
	now := s.cfg.Now()

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := s.cfg.Upstream.Post(actx, ch.target, ch.target.ResponsesURL(c.sub), c.header, c.body)
	if err != nil {
		info.detail = err.Error()
		out := Classify(AttemptEnd{Now: now, Transport: err, Cancelled: ctx.Err() != nil})
		return out, &failure{status: http.StatusBadGateway, body: errorJSON(apiError{Type: "server_error", Code: "upstream_unreachable", Message: "the upstream account could not be reached"}), class: out.Class}, info
	}
	defer resp.Body.Close()
	info.status = resp.StatusCode
	// The account's usage windows, from this answer's headers, once the
	// attempt is over (the client is not kept waiting for the write).
	defer s.foldUsage(context.WithoutCancel(ctx), acct, resp.Header)

	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		e, ok := wire.ParseErrorBody(body)
		var ep *wire.Error
		if ok {
			ep = &e
			info.code = cmp.Or(e.Code, e.Type)
			info.detail = e.Message
		}
		out := Classify(AttemptEnd{Now: now, Status: resp.StatusCode, Err: ep, Cancelled: ctx.Err() != nil})
		h := http.Header{}
		passHeaders(h, resp.Header)
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			h.Set("Content-Type", ct)
		}
		return out, &failure{status: resp.StatusCode, header: h, body: body, class: out.Class}, info
	}

	if !strings.HasPrefix(strings.ToLower(resp.Header.Get("Content-Type")), "text/event-stream") {
		// A JSON answer (the legacy compact route): pass it through.
		body, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes))
		if err != nil {
			info.detail = err.Error()
			out := Classify(AttemptEnd{Now: now, Transport: err, Cancelled: ctx.Err() != nil})
			return out, &failure{status: http.StatusBadGateway, body: errorJSON(apiError{Type: "server_error", Message: "the upstream answer broke off"}), class: out.Class}, info
		}
		h := w.Header()
		passHeaders(h, resp.Header)
		c.markRecovery(h)
		h.Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
		info.firstEvent = s.cfg.Now().Sub(c.start)
		s.settle(context.WithoutCancel(ctx), c, ch, "")
		return Outcome{Class: ClassOK, Action: ActionDone}, nil, info
	}
	// The full input the upstream saw, for continuity; nil when the request
	// chains to a response the relay does not hold.
	full, ferr := s.fullInput(c)
	if ferr != nil {
		full = nil // continuity does not hold the chain: nothing to remember
	}
	end, o, f := s.relaySSE(ctx, out, c, ch, newHTTPSource(resp.Body, cancel), resp.Header, full, nil)
	info.tr, info.status, info.code, info.firstEvent = end.tr, statusOr(end.status, info.status), end.code, end.firstEvent
	if end.detail != "" {
		info.detail = end.detail
	}
	return o, f, info
}

func errorJSON(e apiError) []byte {
	b, _ := json.Marshal(wire.ErrorBody{Error: e})
	return b
}

func statusOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func errCode(e *wire.Error) string {
	if e == nil {
		return ""
	}
	return cmp.Or(e.Code, e.Type)
}

// failedEvent builds a response.failed event for a stream the relay ends.
func failedEvent(responseID, requestID, code, msg string) []byte {
	if responseID == "" {
		responseID = "resp_relay_" + requestID
	}
	b, _ := json.Marshal(map[string]any{
		"type": wire.EventResponseFailed,
		"response": map[string]any{"id": responseID, "object": "response", "status": "failed",
			"error": map[string]string{"code": code, "message": msg}},
	})
	return b
}
