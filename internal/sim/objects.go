package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// accountObjects holds the objects one account created: files, stored
// responses and realtime calls. An object lives on the account that made it
// and nowhere else, as upstream: a relay that asks another account for it
// gets a 404. Owned by Server; guarded by Server.mu.
type accountObjects struct {
	files         map[string]*fileEntry
	fileOrder     []string // oldest first
	responses     map[string]*storedResponse
	responseOrder []string // oldest first
	calls         map[string]bool
	callOrder     []string // oldest first
}

func newAccountObjects() *accountObjects {
	return &accountObjects{files: map[string]*fileEntry{}, responses: map[string]*storedResponse{}, calls: map[string]bool{}}
}

// objectsLocked returns the objects of an account, creating the set.
func (s *Server) objectsLocked(account string) *accountObjects {
	o, ok := s.objects[account]
	if !ok {
		o = newAccountObjects()
		s.objects[account] = o
	}
	return o
}

// addFileLocked keeps a file, dropping the account's oldest past
// Config.MaxObjects.
func (s *Server) addFileLocked(f *fileEntry) {
	o := s.objectsLocked(f.Account)
	for len(o.fileOrder) >= s.cfg.MaxObjects {
		delete(o.files, o.fileOrder[0])
		o.fileOrder = o.fileOrder[1:]
	}
	o.files[f.ID] = f
	o.fileOrder = append(o.fileOrder, f.ID)
}

func (s *Server) deleteFileLocked(account, id string) bool {
	o := s.objectsLocked(account)
	if _, ok := o.files[id]; !ok {
		return false
	}
	delete(o.files, id)
	o.fileOrder = slices.DeleteFunc(o.fileOrder, func(x string) bool { return x == id })
	return true
}

// addResponseLocked keeps a response, dropping (and cancelling) the
// account's oldest past Config.MaxObjects.
func (s *Server) addResponseLocked(sr *storedResponse) {
	o := s.objectsLocked(sr.account)
	for len(o.responseOrder) >= s.cfg.MaxObjects {
		s.dropResponseLocked(o, o.responseOrder[0])
	}
	o.responses[sr.id] = sr
	o.responseOrder = append(o.responseOrder, sr.id)
}

func (s *Server) dropResponseLocked(o *accountObjects, id string) bool {
	sr, ok := o.responses[id]
	if !ok {
		return false
	}
	if sr.cancel != nil {
		sr.cancel()
	}
	delete(o.responses, id)
	o.responseOrder = slices.DeleteFunc(o.responseOrder, func(x string) bool { return x == id })
	return true
}

func (s *Server) addCallLocked(account, id string) {
	o := s.objectsLocked(account)
	for len(o.callOrder) >= s.cfg.MaxObjects {
		delete(o.calls, o.callOrder[0])
		o.callOrder = o.callOrder[1:]
	}
	o.calls[id] = true
	o.callOrder = append(o.callOrder, id)
}

// clearObjectsLocked forgets every object, cancelling background runs.
func (s *Server) clearObjectsLocked() {
	for _, o := range s.objects {
		for _, sr := range o.responses {
			if sr.cancel != nil {
				sr.cancel()
			}
		}
	}
	s.objects = map[string]*accountObjects{}
}

// RealtimeCalls returns the ids of the realtime calls (POST
// .../realtime/calls) an account created, oldest first.
func (s *Server) RealtimeCalls(account string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.objects[account]; ok {
		return slices.Clone(o.callOrder)
	}
	return nil
}

// apiError is an error in the exact shape the OpenAI API uses for its
// object routes: every field present, param and code null when unset
// ({"error":{"message":...,"type":...,"param":null,"code":null}}).
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func strPtr(s string) *string { return &s }

// noSuchFile is the 404 OpenAI answers for a file id its account does not
// hold.
func noSuchFile(id string) apiError {
	return apiError{Message: "No such File object: " + id, Type: wire.TypeInvalidRequest, Param: strPtr("id")}
}

// noSuchResponse is the 404 OpenAI answers for a response id its account
// does not hold.
func noSuchResponse(id string) apiError {
	return apiError{Message: fmt.Sprintf("Response with id '%s' not found.", id), Type: wire.TypeInvalidRequest}
}

// invalidRequest is a 400 naming what is wrong, with param when a field
// is to blame.
func invalidRequest(msg, param string) apiError {
	e := apiError{Message: msg, Type: wire.TypeInvalidRequest}
	if param != "" {
		e.Param = strPtr(param)
	}
	return e
}

// objectCall is one request to an object route once it has been recorded,
// authenticated and checked against the faults.
type objectCall struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	ref   recordRef
	acct  Account
	rl    wire.RateLimits
	fault faultAnswer
	fired Fault // the fault that fired, if any
}

// beginObject records a request to an object route, authenticates it as
// /responses requests are (chatgpt accounts need their ChatGPT-Account-Id)
// and checks the faults of the route. A fault that answers with an error
// status is answered here, with the rate-limit headers; a cut or stall is
// left to the answer (see objectCall.answer). On failure it answers and
// returns nil.
func (s *Server) beginObject(w http.ResponseWriter, r *http.Request, kind Kind, route Route, objectID string) *objectCall {
	rec := headerRecord(r, RecordHTTP, TransportHTTP, route, s.cfg.Now())
	rec.ObjectID = objectID
	ref := s.rec.add(rec)
	acct, fail := s.authenticate(r, kind, true, ref)
	if fail != nil {
		ref.fail(fail.status, fail.err, s.cfg.Now())
		writeError(w, fail.status, fail.err, nil)
		return nil
	}
	return s.objectFault(w, r, ref, acct, route, TransportHTTP)
}

// objectFault checks the faults of route for acct and answers an error
// fault; it returns nil when it answered.
func (s *Server) objectFault(w http.ResponseWriter, r *http.Request, ref recordRef, acct Account, route Route, transport Transport) *objectCall {
	now := s.cfg.Now()
	s.mu.Lock()
	st, ok := s.accounts[acct.ID]
	var rl wire.RateLimits
	var primaryReset time.Time
	if ok {
		rl, primaryReset = st.rateLimits(), st.primaryReset
	}
	f, fired := s.faults.check(faultSite{account: acct.ID, transport: transport, route: route})
	s.mu.Unlock()
	if !ok {
		e := wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidAPIKey, Message: "The account of this token was removed."}
		ref.fail(http.StatusUnauthorized, e, now)
		writeError(w, http.StatusUnauthorized, e, nil)
		return nil
	}
	c := &objectCall{s: s, w: w, r: r, ref: ref, acct: acct, rl: rl, fault: faultAnswer{cutAfter: -1, stallAt: -1}}
	if fired {
		c.fired = f
		ref.update(func(rec *Record) { rec.Fault = f.Kind })
		c.fault = answerFor(f, acct.PlanType, primaryReset, now)
		if c.fault.status != 0 {
			if f.Kind == FaultUsageLimit || f.Kind == FaultSharingCap {
				p := *rl.Primary
				p.UsedPercent = 100
				rl.Primary = &p
			}
			ref.fail(c.fault.status, c.fault.err, now)
			writeError(w, c.fault.status, c.fault.err, &rl)
			return nil
		}
	}
	return c
}

// fail answers an error in the API's object shape.
func (c *objectCall) fail(status int, e apiError) {
	code := ""
	if e.Code != nil {
		code = *e.Code
	}
	c.ref.fail(status, wire.Error{Type: e.Type, Code: code, Message: e.Message}, c.s.cfg.Now())
	writeJSON(c.w, status, object{"error": e})
}

// failBody answers the error a failed body read deserves: 413 past the
// limit, 400 otherwise.
func (c *objectCall) failBody(err error) {
	if errors.Is(err, errBodyTooLarge) {
		c.fail(http.StatusRequestEntityTooLarge, invalidRequest(err.Error(), ""))
		return
	}
	c.fail(http.StatusBadRequest, invalidRequest(err.Error(), ""))
}

// readJSON reads and decodes a JSON body into v, answering 400 (or 413)
// when it cannot; it reports success.
func (c *objectCall) readJSON(v any) bool {
	body, err := readBody(c.r, c.s.cfg.MaxBodyBytes)
	if err != nil {
		c.failBody(err)
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		c.fail(http.StatusBadRequest, invalidRequest(plainDecodeError(err).Error(), ""))
		return false
	}
	return true
}

// noteObject sets the record's ObjectID.
func (c *objectCall) noteObject(id string) {
	c.ref.update(func(r *Record) { r.ObjectID = id })
}

// answerJSON answers v as JSON (see answer).
func (c *objectCall) answerJSON(status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.fail(http.StatusInternalServerError, apiError{Message: err.Error(), Type: "server_error"})
		return
	}
	c.answer(status, "application/json", b)
}

// answer writes the answer in chunks (flushed one by one), with the
// rate-limit headers, honouring the route's cut or stall fault: a cut sends
// the headers and half the body and drops the connection, a stall sends
// the headers and then nothing until the client goes. The record is
// finished before the client can read the end of the answer.
func (c *objectCall) answer(status int, contentType string, chunks ...[]byte) {
	h := c.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Request-Id", "req_"+randomHex(12))
	c.rl.SetHeaders(h)
	rc := http.NewResponseController(c.w)
	now := c.s.cfg.Now
	switch {
	case c.fault.stallAt >= 0:
		c.w.WriteHeader(status)
		_ = rc.Flush()
		ctx, cancel := c.s.requestContext(c.r)
		defer cancel()
		<-ctx.Done()
		c.ref.finish(0, OutcomeStalled, now())
		panic(http.ErrAbortHandler)
	case c.fault.cutAfter >= 0:
		var all []byte
		for _, ch := range chunks {
			all = append(all, ch...)
		}
		c.ref.finish(0, OutcomeCut, now())
		c.w.WriteHeader(status)
		_, _ = c.w.Write(all[:len(all)/2])
		_ = rc.Flush()
		panic(http.ErrAbortHandler)
	}
	total := 0
	for _, ch := range chunks {
		total += len(ch)
	}
	h.Set("Content-Length", fmt.Sprint(total))
	c.ref.finish(status, OutcomeOK, now())
	c.w.WriteHeader(status)
	for _, ch := range chunks {
		_ = rc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		if _, err := c.w.Write(ch); err != nil {
			return
		}
		_ = rc.Flush()
	}
	_ = rc.SetWriteDeadline(time.Time{})
}

// countingReader counts the bytes read through it and fails with
// errBodyTooLarge past max.
type countingReader struct {
	r   io.Reader
	n   int64
	max int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, errBodyTooLarge
	}
	return n, err
}

// waitChanged waits until ch is closed or ctx ends; it reports which.
func waitChanged(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}
