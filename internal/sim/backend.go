package sim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// handleModels serves GET {base}/models: {"models":[...]} for the ChatGPT
// backend (the shape Codex fetches with ?client_version=), the OpenAI list
// shape for /v1.
func (s *Server) handleModels(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteModels, s.cfg.Now()))
		if _, fail := s.authenticate(r, kind, false, ref); fail != nil {
			ref.fail(fail.status, fail.err, s.cfg.Now())
			writeError(w, fail.status, fail.err, nil)
			return
		}
		var body any
		if kind == KindChatGPT {
			models := make([]any, len(s.cfg.Models))
			for i, m := range s.cfg.Models {
				models[i] = object{"slug": m, "display_name": m, "visibility": "list", "supported_in_api": true, "priority": i}
			}
			body = object{"models": models}
		} else {
			data := make([]any, len(s.cfg.Models))
			for i, m := range s.cfg.Models {
				data[i] = object{"id": m, "object": "model", "created": 1700000000, "owned_by": "openai"}
			}
			body = object{"object": "list", "data": data}
		}
		ref.finish(http.StatusOK, OutcomeOK, s.cfg.Now())
		writeJSON(w, http.StatusOK, body)
	}
}

// handleUsage serves GET /backend-api/wham/usage for ChatGPT accounts: the
// primary (5-hour) and secondary (weekly) windows with used percent, window
// length, and reset time.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteUsage, s.cfg.Now()))
	acct, fail := s.authenticate(r, KindChatGPT, false, ref)
	if fail != nil {
		ref.fail(fail.status, fail.err, s.cfg.Now())
		writeError(w, fail.status, fail.err, nil)
		return
	}
	s.mu.Lock()
	st, ok := s.accounts[acct.ID]
	var rl wire.RateLimits
	if ok {
		rl = st.rateLimits()
	}
	s.mu.Unlock()
	if !ok {
		e := wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidAPIKey, Message: "The account of this token was removed."}
		ref.fail(http.StatusUnauthorized, e, s.cfg.Now())
		writeError(w, http.StatusUnauthorized, e, nil)
		return
	}
	now := s.cfg.Now().Unix()
	window := func(w *wire.RateLimitWindow) object {
		return object{
			"used_percent":         w.UsedPercent,
			"limit_window_seconds": w.WindowMinutes * 60,
			"reset_after_seconds":  max(w.ResetAt-now, 0),
			"reset_at":             w.ResetAt,
		}
	}
	reached := rl.Primary.UsedPercent >= 100 || rl.Secondary.UsedPercent >= 100
	email := acct.Email
	if email == "" {
		email = acct.ID + "@sim.invalid"
	}
	var credits any
	if rl.Credits != nil {
		credits = rl.Credits
	}
	ref.finish(http.StatusOK, OutcomeOK, s.cfg.Now())
	writeJSON(w, http.StatusOK, object{
		"user_id":    "user-" + acct.ID,
		"account_id": acct.ChatGPTAccountID,
		"email":      email,
		"plan_type":  acct.PlanType,
		"rate_limit": object{
			"allowed":          !reached,
			"limit_reached":    reached,
			"primary_window":   window(rl.Primary),
			"secondary_window": window(rl.Secondary),
		},
		"code_review_rate_limit": nil,
		"credits":                credits,
	})
}

// handleGoal serves POST /backend-api/codex/thread/goal/{get,set,clear}.
// The payload names the thread ("threadId"); goals live per account and
// thread, so a goal set through one account is not visible through another.
//
//	set:   {"threadId":"t", ...goal fields}  -> {"threadId":"t","goal":{...goal fields}}
//	get:   {"threadId":"t"}                  -> {"threadId":"t","goal":{...} | null}
//	clear: {"threadId":"t"}                  -> {"threadId":"t","cleared":true|false}
func (s *Server) handleGoal(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	route := map[string]Route{"get": RouteGoalGet, "set": RouteGoalSet, "clear": RouteGoalClear}[op]
	if route == "" {
		s.handleUnknown(w, r)
		return
	}
	ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, route, s.cfg.Now()))
	acct, fail := s.authenticate(r, KindChatGPT, true, ref)
	if fail != nil {
		ref.fail(fail.status, fail.err, s.cfg.Now())
		writeError(w, fail.status, fail.err, nil)
		return
	}
	bad := func(msg string) {
		e := wire.Error{Type: wire.TypeInvalidRequest, Message: msg}
		ref.fail(http.StatusBadRequest, e, s.cfg.Now())
		writeError(w, http.StatusBadRequest, e, nil)
	}
	body, err := readBody(r, s.cfg.MaxBodyBytes)
	if err != nil {
		bad(err.Error())
		return
	}
	var payload map[string]json.RawMessage
	if err := json.Unmarshal(body, &payload); err != nil {
		bad(plainDecodeError(err).Error())
		return
	}
	var thread string
	if json.Unmarshal(payload["threadId"], &thread) != nil || thread == "" {
		bad("threadId is required")
		return
	}
	ref.update(func(rec *Record) { rec.GoalThreadID = thread })
	key := goalKey{acct.ID, thread}
	answer := object{"threadId": thread}
	s.mu.Lock()
	switch op {
	case "set":
		delete(payload, "threadId")
		goal, _ := json.Marshal(payload)
		s.goals[key] = goal
		answer["goal"] = json.RawMessage(goal)
	case "get":
		if g, ok := s.goals[key]; ok {
			answer["goal"] = g
		} else {
			answer["goal"] = nil
		}
	case "clear":
		_, ok := s.goals[key]
		delete(s.goals, key)
		answer["cleared"] = ok
	}
	s.mu.Unlock()
	ref.finish(http.StatusOK, OutcomeOK, s.cfg.Now())
	writeJSON(w, http.StatusOK, answer)
}

// handleToken serves POST /oauth/token with grant_type=refresh_token, in a
// form or JSON body as auth.openai.com accepts. A refresh token works once:
// the answer carries a new access token and a new refresh token, and the
// old refresh token is then refused with 401 refresh_token_reused.
func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	ref := s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteToken, s.cfg.Now()))
	bad := func(status int, e wire.Error) {
		ref.fail(status, e, s.cfg.Now())
		writeError(w, status, e, nil)
	}
	body, err := readBody(r, 1<<20)
	if err != nil {
		bad(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()})
		return
	}
	var grantType, refreshToken string
	isJSON := strings.HasPrefix(strings.ToLower(r.Header.Get("Content-Type")), "application/json") ||
		strings.HasPrefix(strings.TrimSpace(string(body)), "{")
	if isJSON {
		var p struct {
			GrantType    string `json:"grant_type"`
			RefreshToken string `json:"refresh_token"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			bad(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Message: plainDecodeError(err).Error()})
			return
		}
		grantType, refreshToken = p.GrantType, p.RefreshToken
	} else {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			bad(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Message: "invalid form body: " + err.Error()})
			return
		}
		grantType, refreshToken = form.Get("grant_type"), form.Get("refresh_token")
	}
	if grantType != "refresh_token" {
		bad(http.StatusBadRequest, wire.Error{Type: "unsupported_grant_type", Code: "unsupported_grant_type",
			Message: "Only grant_type=refresh_token is supported."})
		return
	}
	if refreshToken == "" {
		bad(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Code: "invalid_request", Message: "refresh_token is required."})
		return
	}
	s.mu.Lock()
	grant, account, status, e := s.refreshLocked(refreshToken)
	s.mu.Unlock()
	if account != "" {
		ref.update(func(rec *Record) { rec.Account = account })
	}
	if e != nil {
		bad(status, *e)
		return
	}
	ref.finish(http.StatusOK, OutcomeOK, s.cfg.Now())
	writeJSON(w, http.StatusOK, grant)
}

// handleUnknown answers 404 for every other path, and records it: a relay
// that calls a wrong path shows up in the records.
func (s *Server) handleUnknown(w http.ResponseWriter, r *http.Request) {
	transport := TransportHTTP
	kind := RecordHTTP
	if isWebSocketUpgrade(r) {
		transport, kind = TransportWS, RecordHandshake
	}
	ref := s.rec.add(headerRecord(r, kind, transport, RouteUnknown, s.cfg.Now()))
	e := wire.Error{Type: wire.TypeInvalidRequest, Code: "not_found", Message: "No route " + r.Method + " " + r.URL.Path + " in the simulated upstream."}
	ref.fail(http.StatusNotFound, e, s.cfg.Now())
	writeError(w, http.StatusNotFound, e, nil)
}
