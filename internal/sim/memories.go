package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// handleMemories serves POST {p}/memories/trace_summarize, Codex's memory
// summariser: {model, traces:[{id, metadata, items}], reasoning?} ->
// {output:[{trace_summary, memory_summary}]}, one per trace, in order,
// each naming its trace and how many items it held.
func (s *Server) handleMemories(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteMemories, "")
		if c == nil {
			return
		}
		var req struct {
			Model  string `json:"model"`
			Traces []struct {
				ID    string            `json:"id"`
				Items []json.RawMessage `json:"items"`
			} `json:"traces"`
		}
		if !c.readJSON(&req) {
			return
		}
		c.ref.update(func(rec *Record) { rec.Model = req.Model })
		if req.Traces == nil {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'traces'.", "traces"))
			return
		}
		out := make([]any, len(req.Traces))
		for i, t := range req.Traces {
			out[i] = object{
				"trace_summary":  fmt.Sprintf("Simulated summary of trace %s (%d items).", t.ID, len(t.Items)),
				"memory_summary": fmt.Sprintf("Simulated memory of trace %s.", t.ID),
			}
		}
		c.answerJSON(http.StatusOK, object{"output": out})
	}
}

// handleAnalytics serves POST /backend-api/codex/analytics-events/events,
// where Codex posts its analytics: recorded (RouteAnalytics) and answered
// {"status":"ok"}. A relay is to accept and drop these, so a record of one
// here is a relay that forwarded it.
func (s *Server) handleAnalytics(w http.ResponseWriter, r *http.Request) {
	c := s.beginObject(w, r, KindChatGPT, RouteAnalytics, "")
	if c == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
	s.mu.Lock()
	s.analytics++
	s.mu.Unlock()
	c.answerJSON(http.StatusOK, object{"status": "ok"})
}

// AnalyticsPosts counts the analytics batches accepted since the last
// Reset; the records with RouteAnalytics show every one, refused ones too.
func (s *Server) AnalyticsPosts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.analytics
}
