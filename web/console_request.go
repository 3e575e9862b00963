package web

import (
	"cmp"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The request page: one request of the log whole, with its attempts, the
// ids it carries linked to their pages, its usage and cost.

func requestURL(id string) string { return "/admin/requests/" + url.PathEscape(id) }

// maxRequestAttempts bounds the attempts a request page shows; the loop
// makes a handful at most.
const maxRequestAttempts = 100

func (s *Server) requestPage(c echo.Context) error {
	ctx := c.Request().Context()
	id := c.Param("id")
	r, err := s.cfg.Store.Request(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return &HTTPError{Status: http.StatusNotFound, Code: "not_found", Err: err,
			Msg: "No request " + id + " in the request log: the id is wrong, or the request is older than the log keeps (CODEX_RELAY_RETENTION)."}
	}
	if err != nil {
		return err
	}
	atts, _, err := s.cfg.Store.Attempts(ctx, store.AttemptFilter{RequestID: id, Limit: maxRequestAttempts})
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	f := s.frame(c, "requests", "Request "+r.ID)
	f.Intro = "request"
	return s.render(c, http.StatusOK, ui.RequestPage(f, requestDetail(r, atts, n)))
}

// attemptRow is one attempt as the Diagnostics and request pages list it.
func attemptRow(a store.Attempt, n names) ui.AttemptRow {
	r := ui.AttemptRow{Seq: a.Seq, Account: n.accountName(a.AccountID), Class: a.Class, Tone: classTone(a.Class),
		Recovery: a.Recovery, Action: strings.ReplaceAll(a.Action, "_", " "), ErrorCode: a.ErrorCode, Detail: a.Detail,
		Duration: span(a.EndedAt.Sub(a.StartedAt)), Started: stamp(a.StartedAt)}
	if a.FromAccountID != "" {
		r.From = n.accountName(a.FromAccountID)
	}
	if a.Status != 0 {
		r.Status = strconv.Itoa(a.Status)
	}
	if a.FirstEvent > 0 {
		r.FirstEvent = span(a.FirstEvent)
	}
	return r
}

// requestDetail lays out one request and its attempts. Pure.
func requestDetail(r store.RequestRecord, atts []store.Attempt, n names) ui.RequestDetail {
	d := ui.RequestDetail{ID: r.ID, Started: stamp(r.StartedAt), Transport: r.Transport, Path: r.Path,
		Model: cmp.Or(r.Model, "—"), Served: r.ModelServed, Tier: r.ServiceTier, Policy: r.Policy,
		Status: strconv.Itoa(r.Status), Tone: httpTone(r.Status), ErrorCode: r.ErrorCode, Recovery: r.Recovery,
		Thread: r.ThreadID, Session: r.SessionID, Key: n.keyName(r.ClientKeyID), Account: n.accountName(r.AccountID),
		FirstEvent: "—", FirstOutput: "—", Duration: span(r.Duration),
		Input: thousands(r.InputTokens), Cached: thousands(r.CachedTokens), Output: thousands(r.OutputTokens),
		Reasoning: thousands(r.ReasoningTokens), Total: thousands(r.TotalTokens), Cost: dollars(r.CostNanos),
		Unpriced: r.Unpriced, Charged: r.Charged,
		DiagnosticsURL: "/admin/diagnostics?" + url.Values{"request": {r.ID}}.Encode()}
	switch {
	case r.Status >= 200 && r.Status < 300:
		d.Answer = "answered in full"
	case r.Status == statusClientClosed:
		d.Answer = "the client went away before its answer ended"
	default:
		d.Answer = cmp.Or(http.StatusText(r.Status), "an error")
	}
	if r.ThreadID != "" {
		d.ThreadURL = "/admin/bindings?" + url.Values{"thread": {r.ThreadID}}.Encode()
		d.ThreadRequestsURL = "/admin/requests?" + url.Values{"thread": {r.ThreadID}}.Encode()
	}
	if r.SessionID != "" {
		d.SessionURL = "/admin/bindings?" + url.Values{"session": {r.SessionID}}.Encode()
	}
	if r.ClientKeyID != "" {
		d.KeyURL = keyURL(r.ClientKeyID)
	}
	if r.AccountID != "" {
		d.AccountURL = accountURL(r.AccountID)
	}
	if r.FirstEvent > 0 {
		d.FirstEvent = span(r.FirstEvent)
	}
	if r.FirstOutput > 0 {
		d.FirstOutput = span(r.FirstOutput)
	}
	sort.Slice(atts, func(i, j int) bool { return atts[i].Seq < atts[j].Seq })
	for _, a := range atts {
		row := attemptRow(a, n)
		if a.AccountID != "" {
			row.AccountURL = accountURL(a.AccountID)
		}
		d.Attempts = append(d.Attempts, row)
	}
	if len(atts) > 0 && r.Status >= 300 {
		d.Cause = atts[len(atts)-1].Detail
	}
	return d
}
