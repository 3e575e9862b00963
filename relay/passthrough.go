package relay

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// serveModels answers GET .../models from an account the client may use:
// the thread's account when it has one, else the balancer's choice. The
// /v1 route answers the OpenAI list (serveModelList); the Codex route
// passes the account's answer on.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	cl, ident, ok := s.admitIdentified(w, r)
	if !ok {
		return
	}
	setLimitHeaders(w.Header(), s.clientLimits(ctx, cl.key))
	ch, ok := s.chooseOrAnswer(ctx, w, &request{client: cl, ident: ident, header: r.Header})
	if !ok {
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		s.serveModelList(w, r, cl, ch)
		return
	}
	url := ch.target.URL("/models")
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	resp, err := s.cfg.Upstream.get(ctx, ch.target, url, r.Header)
	if err != nil {
		s.upstreamUnreachable(w, ch, err)
		return
	}
	defer resp.Body.Close()
	copyAnswer(w, resp, s.cfg.Now())
}

// goalPayload is the part of a thread-goal request the relay routes by.
type goalPayload struct {
	ThreadID string `json:"threadId"`
}

// serveGoal forwards /thread/goal/{get,set,clear}, routed by the payload's
// threadId (seed 004), to the account that serves that thread.
func (s *Server) serveGoal(w http.ResponseWriter, r *http.Request, op string) {
	if op != "get" && op != "set" && op != "clear" {
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "not_found", Message: "no such goal operation"})
		return
	}
	ctx := r.Context()
	cl, ok := s.admit(w, r)
	if !ok {
		return
	}
	setLimitHeaders(w.Header(), s.clientLimits(ctx, cl.key))
	body, err := s.readRequestBody(w, r, 1<<20)
	if err != nil {
		s.writeFailure(w, err)
		return
	}
	var p goalPayload
	if err := json.Unmarshal(body, &p); err != nil {
		s.writeFailure(w, refuse(http.StatusBadRequest, "invalid_json", "the goal payload is not valid JSON"))
		return
	}
	ident, err := ParseGoalIdentity(r.Header, p.ThreadID)
	if err != nil {
		s.writeFailure(w, refuse(http.StatusBadRequest, "invalid_thread_id", err.Error()))
		return
	}
	ch, ok := s.chooseOrAnswer(ctx, w, &request{client: cl, ident: ident, header: r.Header})
	if !ok {
		return
	}
	resp, err := s.cfg.Upstream.post(ctx, ch.target, ch.target.URL("/thread/goal/"+op), r.Header, body)
	if err != nil {
		s.upstreamUnreachable(w, ch, err)
		return
	}
	defer resp.Body.Close()
	copyAnswer(w, resp, s.cfg.Now())
}

// chooseOrAnswer selects an account for a one-shot request (models, goals)
// and answers the client itself when none can serve.
func (s *Server) chooseOrAnswer(ctx context.Context, w http.ResponseWriter, r *request) (choice, bool) {
	ch, err := s.choose(ctx, r, plan{}, map[string]bool{}, "")
	if err != nil {
		s.writeFailure(w, err)
		return choice{}, false
	}
	ch.release() // a one-shot request does not count as load
	return ch, true
}

// upstreamUnreachable answers a one-shot request whose upstream could not
// be reached: the cause goes to the log, the client gets a plain sentence.
func (s *Server) upstreamUnreachable(w http.ResponseWriter, ch choice, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.log.Warn("upstream unreachable", "account", ch.target.Account.ID, "err", err)
	f := failUnreachable()
	writeError(w, f.status, f.err)
}

// copyAnswer relays a small upstream answer (bounded) with its status; an
// error answer is screened (screenAnswer) first.
func copyAnswer(w http.ResponseWriter, resp *http.Response, now time.Time) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		f := failInterrupted()
		writeError(w, f.status, f.err)
		return
	}
	passHeaders(w.Header(), resp.Header)
	if resp.StatusCode >= 400 {
		f := screenAnswer(resp.StatusCode, nil, body, now)
		if f.body == nil { // the relay's own sentence
			writeError(w, f.status, f.err)
			return
		}
		body = f.body
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}
