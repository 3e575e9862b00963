package web

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web/ui"
)

// frame builds the part every console page shares, and consumes the flash
// message the previous action left.
func (s *Server) frame(c echo.Context, nav, title string) ui.Frame {
	sess, _ := c.Get(sessionKey).(session)
	who := principalOf(c)
	f := ui.Frame{Title: title, Nav: nav, Intro: nav, CSRF: s.sessions.csrf(purposeSession, sess), Who: who.Actor, Role: string(who.Role),
		Person: who.UserID != ""}
	if now, ok := c.Get(flashNowKey).(*ui.Flash); ok {
		f.Flash = now
	}
	if ck, err := c.Cookie(flashCookie); err == nil {
		if kind, text, ok := s.sessions.openFlash(ck.Value); ok && f.Flash == nil {
			f.Flash = &ui.Flash{Kind: kind, Text: text}
		}
		s.clearCookie(c, flashCookie)
	}
	return f
}

// subframe is frame for a page under a section (an account's page): the
// section's tab is current, but its explanation, written for the list, is
// not shown.
func (s *Server) subframe(c echo.Context, nav, title string) ui.Frame {
	f := s.frame(c, nav, title)
	f.Intro = ""
	return f
}

// flashNowKey holds a message for the page this very answer renders (a form
// shown again with its error), as a *ui.Flash.
const flashNowKey = "codex_relay.flash"

// flash leaves a one-time message for the next page; kind is ok or error.
func (s *Server) flash(c echo.Context, kind, text string) {
	s.setCookie(c, flashCookie, s.sessions.sealFlash(kind, text), flashTTL)
}

// names resolves account and client-key ids to what operators call them.
type names struct {
	accounts []store.Account
	keys     []store.ClientKey
	account  map[string]string
	key      map[string]string
}

func (s *Server) names(ctx context.Context) (names, error) {
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return names{}, err
	}
	keys, err := s.cfg.Store.ClientKeys(ctx)
	if err != nil {
		return names{}, err
	}
	n := names{accounts: accounts, keys: keys, account: map[string]string{}, key: map[string]string{}}
	for _, a := range accounts {
		n.account[a.ID] = a.Label
	}
	for _, k := range keys {
		n.key[k.ID] = k.Name
	}
	return n, nil
}

func (n names) accountName(id string) string {
	if id == "" {
		return "—"
	}
	return cmp.Or(n.account[id], id)
}

func (n names) keyName(id string) string {
	if id == "" {
		return "keyless"
	}
	return cmp.Or(n.key[id], id)
}

func (n names) accountOptions(selected string) []ui.Option {
	out := make([]ui.Option, len(n.accounts))
	for i, a := range n.accounts {
		out[i] = ui.Option{Value: a.ID, Label: a.Label, Selected: a.ID == selected}
	}
	return out
}

func (n names) keyOptions(selected string) []ui.Option {
	out := make([]ui.Option, len(n.keys))
	for i, k := range n.keys {
		out[i] = ui.Option{Value: k.ID, Label: k.Name, Selected: k.ID == selected}
	}
	return out
}

func choices(selected string, values ...string) []ui.Option {
	out := make([]ui.Option, len(values))
	for i, v := range values {
		out[i] = ui.Option{Value: v, Label: strings.ReplaceAll(v, "_", " "), Selected: v == selected}
	}
	return out
}

// pagerFor describes one page of a list at path with the filters v.
func pagerFor(path string, v url.Values, p page, shown, total int) ui.Pager {
	pg := ui.Pager{Total: total}
	if shown > 0 {
		pg.From, pg.To = p.Offset+1, p.Offset+shown
	}
	link := func(off int) string {
		q := url.Values{}
		for k, vs := range v {
			q[k] = vs
		}
		if off > 0 {
			q.Set("offset", strconv.Itoa(off))
		}
		if p.Limit != p.def {
			q.Set("limit", strconv.Itoa(p.Limit))
		}
		if len(q) == 0 {
			return path
		}
		return path + "?" + q.Encode()
	}
	if p.Offset > 0 {
		pg.Prev = link(max(p.Offset-p.Limit, 0))
	}
	if p.Offset+shown < total {
		pg.Next = link(p.Offset + shown)
	}
	return pg
}

func withQuery(path string, v url.Values) string {
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

func (s *Server) overviewPage(c echo.Context) error {
	ctx := c.Request().Context()
	o, err := s.overview(ctx)
	if err != nil {
		return err
	}
	setup, err := s.setupView(ctx, relayBaseURL(c))
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, ui.OverviewPage(s.frame(c, "overview", "Overview"), o, setup))
}

// accountRows shows accounts with their usage, load and bindings.
func (s *Server) accountRows(ctx context.Context, accounts []store.Account, now time.Time) ([]ui.AccountRow, error) {
	lanes := map[string]int{}
	for _, l := range s.cfg.Relay.Lanes() {
		lanes[l.AccountID]++
	}
	rows := make([]ui.AccountRow, len(accounts))
	for i, a := range accounts {
		_, laneCap := s.cfg.Relay.AccountLanes(a.ID)
		_, bound, err := s.cfg.Store.Bindings(ctx, store.BindingFilter{AccountID: a.ID, Limit: 1})
		if err != nil {
			return nil, err
		}
		r := ui.AccountRow{ID: a.ID, Label: a.Label, Kind: string(a.Kind), Organization: cmp.Or(a.Organization, "—"),
			Email: a.Email, Plan: a.PlanType, BaseURL: a.BaseURL, Tags: strings.Join(a.Tags, ", "), Proxy: a.Proxy.String(),
			Status: strings.ReplaceAll(string(a.Status), "_", " "), Tone: statusTone(a.Status), Reason: a.StatusReason,
			InFlight: s.cfg.Relay.InFlight(a.ID), Lanes: lanes[a.ID], LaneCap: laneCap, Bindings: bound, Paused: a.Status == store.StatusPaused,
			URL: accountURL(a.ID), ResumeHint: resumeHint(a.Status),
			BindingsURL:    "/admin/bindings?" + url.Values{"account": {a.ID}}.Encode(),
			RequestsURL:    "/admin/requests?" + url.Values{"account": {a.ID}}.Encode(),
			DiagnosticsURL: "/admin/diagnostics?" + url.Values{"account": {a.ID}}.Encode()}
		if !a.StatusUntil.IsZero() {
			r.Until = "until " + stamp(a.StatusUntil) + " (" + until(now, a.StatusUntil) + ")"
		}
		for _, w := range []struct {
			w        store.Window
			fallback string
		}{{a.Primary, "5h"}, {a.Secondary, "7d"}} {
			if !w.w.Known {
				continue
			}
			u := ui.Usage{Label: windowLabel(w.w.WindowMinutes, w.fallback), Percent: clampPct(w.w.UsedPercent),
				Text: strconv.FormatFloat(w.w.UsedPercent, 'f', 0, 64) + "%", Tone: usedTone(w.w.UsedPercent)}
			if !w.w.ResetAt.IsZero() {
				u.Reset = "resets " + stamp(w.w.ResetAt)
				u.Text += " · resets " + until(now, w.w.ResetAt)
			}
			r.Usage = append(r.Usage, u)
		}
		rows[i] = r
	}
	return rows, nil
}

func (s *Server) accountsPage(c echo.Context) error {
	return s.renderAccounts(c, http.StatusOK, ui.AccountForm{})
}

func (s *Server) renderAccounts(c echo.Context, status int, form ui.AccountForm) error {
	ctx := c.Request().Context()
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return err
	}
	rows, err := s.accountRows(ctx, accounts, s.cfg.Now())
	if err != nil {
		return err
	}
	p := ui.Accounts{Accounts: rows, Form: form}
	now := s.cfg.Now()
	for _, si := range s.signIns.list(now) {
		p.SignIns = append(p.SignIns, s.signInView(si, now))
	}
	return s.render(c, status, ui.AccountsPage(s.frame(c, "accounts", "Accounts"), p))
}

func (s *Server) bindingsPage(c echo.Context) error {
	ctx := c.Request().Context()
	q, err := parseBindingQuery(c)
	if err != nil {
		return err
	}
	rows, total, err := s.cfg.Store.Bindings(ctx, q.filter())
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	v := q.values()
	lanes := s.cfg.Relay.Lanes()
	p := ui.Bindings{
		Search: ui.BindingSearch{Session: q.Session, Thread: q.Thread, Accounts: n.accountOptions(q.Account),
			Keys: n.keyOptions(q.ClientKey), Kinds: choices(string(q.Kind), "thread", "session", "raw_thread", "raw_session"),
			Filtered: len(v) > 0},
		Pager:    pagerFor("/admin/bindings", v, q.page, len(rows), total),
		Return:   withQuery("/admin/bindings", v),
		Accounts: n.accountOptions(""),
	}
	for _, b := range rows {
		r := ui.BindingRow{ID: b.ID, Kind: strings.ReplaceAll(string(b.Kind), "_", " "), Strength: string(b.Strength),
			Source: b.Source, Why: bindingWhy(b.Source), Pin: isPin(b.Kind), AccountID: b.AccountID, Account: n.accountName(b.AccountID),
			Session: b.SessionID, Thread: b.ThreadID, ClientKey: n.keyName(b.ClientScope),
			Age: span(now.Sub(b.CreatedAt)), Created: "set " + stamp(b.CreatedAt), LastSeen: ago(now, b.LastSeenAt),
			Expires: "never", Abandoned: b.AbandonedScope,
			AccountURL: "/admin/bindings?" + url.Values{"account": {b.AccountID}}.Encode(),
			SessionURL: "/admin/bindings?" + url.Values{"session": {b.SessionID}}.Encode(),
			ThreadURL:  "/admin/bindings?" + url.Values{"thread": {b.ThreadID}}.Encode()}
		if b.ThreadID != "" {
			r.RequestsURL = "/admin/requests?" + url.Values{"thread": {b.ThreadID}}.Encode()
		}
		if !b.ExpiresAt.IsZero() {
			r.Expires = until(now, b.ExpiresAt)
		}
		if r.Pin {
			r.ClientKey = "every client" // a pin holds whatever key the client uses
			r.Moves = pinMoves(b, lanes, n)
		}
		p.Rows = append(p.Rows, r)
	}
	if q.Thread != "" {
		if p.Objects, err = s.threadObjects(ctx, rows, n); err != nil {
			return err
		}
	}
	return s.render(c, http.StatusOK, ui.BindingsPage(s.frame(c, "bindings", "Bindings"), p))
}

// pinMoves says what a pin does to its threads whose live lanes are on
// another account: they move at their next request ("" when none is).
func pinMoves(pin store.Binding, lanes []relay.LaneInfo, n names) string {
	moving := 0
	from := ""
	for _, l := range lanes {
		matches := pin.Kind == store.BindRawSession && l.SessionID == pin.SessionID || pin.Kind == store.BindRawThread && l.ThreadID == pin.ThreadID
		if matches && l.AccountID != pin.AccountID {
			moving++
			from = n.accountName(l.AccountID)
		}
	}
	switch moving {
	case 0:
		return ""
	case 1:
		return "its live lane on " + from + " moves to " + n.accountName(pin.AccountID) + " at its next request"
	}
	return fmt.Sprintf("%d live lanes on other accounts move to %s at their next request", moving, n.accountName(pin.AccountID))
}

// lanesView lists the live lanes of every replica.
func (s *Server) lanesView(ctx context.Context) (ui.Lanes, error) {
	n, err := s.names(ctx)
	if err != nil {
		return ui.Lanes{}, err
	}
	now := s.cfg.Now()
	var p ui.Lanes
	for _, l := range s.cfg.Relay.Lanes() {
		p.Lanes = append(p.Lanes, ui.LaneRow{Kind: l.Kind, KindNote: laneKindNote(l.Kind), Account: n.accountName(l.AccountID), AccountID: l.AccountID,
			Session: l.SessionID, Thread: l.ThreadID, Age: span(now.Sub(l.OpenedAt)), Opened: "opened " + stamp(l.OpenedAt),
			Requests: l.Requests, Replica: l.Replica, Retiring: l.Retiring, URL: "/admin/bindings?" + url.Values{"thread": {l.ThreadID}}.Encode()})
	}
	return p, nil
}

func (s *Server) lanesPage(c echo.Context) error {
	p, err := s.lanesView(c.Request().Context())
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, ui.LanesPage(s.frame(c, "lanes", "Lanes"), p))
}

// attemptClasses and recoveries are the values diagnostics can be filtered by.
var (
	attemptClasses = []string{"ok", "usage_limit", "rate_limit", "quota", "auth", "billing", "forbidden", "server",
		"transport", "stream_cut", "stall", "invalid", "previous_response_not_found", "ciphertext", "failed",
		"cancelled", "client_stalled", "connection_limit", "chain_refused", "lane_capacity", "conflict", "no_account",
		"store_unavailable", "key_limit"}
	recoveries = []string{"failover", "reasoning_recovery", "account_mismatch", "fallback", "owner_retired",
		"token_refresh", "fresh_lane", "full_request"}
)

// diagnosticsView shows a page of the requests that have an attempt the
// filter selects, each as its whole timeline: a request that failed over
// reads the same, ending as it ended, whether the filter is the first
// attempt's class or none. The attempts the filter selected are marked.
func (s *Server) diagnosticsView(ctx context.Context, q attemptQuery) (ui.Diagnostics, error) {
	f := q.filter()
	rows, total, err := s.cfg.Store.RequestAttempts(ctx, f)
	if err != nil {
		return ui.Diagnostics{}, err
	}
	n, err := s.names(ctx)
	if err != nil {
		return ui.Diagnostics{}, err
	}
	now := s.cfg.Now()
	v := q.values()
	p := ui.Diagnostics{
		Filter: ui.DiagnosticsFilter{Request: q.Request, Thread: q.Thread, Classes: choices(q.Class, attemptClasses...),
			Recoveries: choices(q.Recovery, recoveries...), Accounts: n.accountOptions(q.Account)},
	}
	if q.Offset == 0 {
		p.LiveURL = withQuery("/admin/live/diagnostics", v)
	}
	groups := map[string][]store.Attempt{}
	var order []string
	for _, a := range rows {
		if _, ok := groups[a.RequestID]; !ok {
			order = append(order, a.RequestID)
		}
		groups[a.RequestID] = append(groups[a.RequestID], a)
	}
	p.Pager = pagerFor("/admin/diagnostics", v, q.page, len(order), total)
	narrowed := f.Class != "" || f.Recovery != "" || f.AccountID != ""
	for _, id := range order {
		as := groups[id]
		sort.Slice(as, func(i, j int) bool { return as[i].Seq < as[j].Seq })
		start, end := as[0].StartedAt, as[0].EndedAt
		for _, a := range as {
			if a.StartedAt.Before(start) {
				start = a.StartedAt
			}
			if a.EndedAt.After(end) {
				end = a.EndedAt
			}
		}
		total := max(end.Sub(start), time.Millisecond)
		last := as[len(as)-1]
		t := ui.Timeline{RequestID: id, Thread: last.ThreadID, Session: last.SessionID,
			Started: clock(now, start), Total: span(end.Sub(start)) + ", " + strconv.Itoa(len(as)) + " " + plural(len(as), "attempt", "attempts"),
			Outcome: strings.ReplaceAll(last.Class, "_", " "), Tone: classTone(last.Class),
			URL: "/admin/diagnostics?" + url.Values{"request": {id}}.Encode(), RequestURL: requestURL(id)}
		for _, a := range as {
			r := attemptRow(a, n)
			r.Matched = narrowed && (f.Class == "" || a.Class == f.Class) && (f.Recovery == "" || a.Recovery == f.Recovery) &&
				(f.AccountID == "" || a.AccountID == f.AccountID)
			r.BarW = max(int(a.EndedAt.Sub(a.StartedAt)*100/total), 2)
			r.BarX = min(int(a.StartedAt.Sub(start)*100/total), 100-r.BarW)
			t.Attempts = append(t.Attempts, r)
		}
		p.Requests = append(p.Requests, t)
	}
	return p, nil
}

func (s *Server) diagnosticsPage(c echo.Context) error {
	q, err := parseAttemptQuery(c)
	if err != nil {
		return err
	}
	p, err := s.diagnosticsView(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, ui.DiagnosticsPage(s.frame(c, "diagnostics", "Diagnostics"), p))
}

func (s *Server) requestsPage(c echo.Context) error {
	ctx := c.Request().Context()
	q, err := parseRequestQuery(c)
	if err != nil {
		return err
	}
	rows, total, err := s.cfg.Store.Requests(ctx, q.filter())
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	p := ui.Requests{
		Filter: ui.RequestFilter{Thread: q.Thread, Session: q.Session, Accounts: n.accountOptions(q.Account),
			Keys: n.keyOptions(q.ClientKey), Transports: choices(q.Transport, "http", "ws")},
		Pager: pagerFor("/admin/requests", q.values(), q.page, len(rows), total),
	}
	if q.Thread != "" {
		if p.Thread, err = s.threadUsage(ctx, q.Thread, n); err != nil {
			return err
		}
	}
	for _, r := range rows {
		row := ui.RequestRow{ID: r.ID, URL: requestURL(r.ID), Started: clock(now, r.StartedAt), StartedFull: stamp(r.StartedAt) + " · " + r.ID,
			Transport: r.Transport, Path: r.Path, Model: r.Model, Account: n.accountName(r.AccountID), AccountID: r.AccountID,
			Thread: r.ThreadID, Session: r.SessionID, ClientKey: n.keyName(r.ClientKeyID), Status: strconv.Itoa(r.Status),
			Tone: httpTone(r.Status), ErrorCode: r.ErrorCode, Recovery: r.Recovery, Duration: span(r.Duration),
			Tokens:         strconv.FormatInt(r.InputTokens, 10) + " / " + strconv.FormatInt(r.OutputTokens, 10) + " / " + strconv.FormatInt(r.CachedTokens, 10),
			DiagnosticsURL: "/admin/diagnostics?" + url.Values{"request": {r.ID}}.Encode(),
			ThreadURL:      "/admin/requests?" + url.Values{"thread": {r.ThreadID}}.Encode()}
		if r.FirstEvent > 0 {
			row.FirstEvent = span(r.FirstEvent)
		}
		p.Rows = append(p.Rows, row)
	}
	return s.render(c, http.StatusOK, ui.RequestsPage(s.frame(c, "requests", "Request log"), p))
}

func (s *Server) keysPage(c echo.Context) error {
	return s.renderKeys(c, http.StatusOK, nil, ui.KeyForm{})
}

// renderKeys shows the keys page; created, when set, is a key just made,
// whose secret this answer shows once.
func (s *Server) renderKeys(c echo.Context, status int, created *ui.CreatedKey, form ui.KeyForm) error {
	ctx := c.Request().Context()
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	// Keys are never deleted: none listed is none ever created, so the
	// relay is keyless (store.KeysEverCreated) until this form makes one.
	p := ui.Keys{Created: created, Form: form, Accounts: n.accountOptions(""), FirstKey: len(n.keys) == 0}
	for _, k := range n.keys {
		p.Keys = append(p.Keys, keyRow(k, n, now))
	}
	if created != nil {
		created.Config = CodexConfig(relayBaseURL(c))
		c.Response().Header().Set("Cache-Control", "no-store")
	}
	return s.render(c, status, ui.KeysPage(s.frame(c, "keys", "Client keys"), p))
}

func (s *Server) settingsPage(c echo.Context) error { return s.renderSettings(c, http.StatusOK, nil) }

// renderSettings shows the settings page; prices, when set, is a refused
// price table form, shown again as typed.
func (s *Server) renderSettings(c echo.Context, status int, prices *ui.PriceForm) error {
	ctx := c.Request().Context()
	st := s.cfg.Store
	cur, latest, err := st.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	cookie := "no (this request came over plain HTTP)"
	if secure(c) {
		cookie = "yes (this request came over TLS)"
	}
	p := ui.Settings{Groups: []ui.SettingGroup{
		{Title: "Database", Items: []ui.Setting{
			{Name: "Location", Value: st.Location().String(), Note: "CODEX_RELAY_DATABASE_URL (password never shown)"},
			{Name: "Kind", Value: string(st.Dialect()), Note: "SQLite for one process; PostgreSQL for several replicas"},
			{Name: "Schema version", Value: strconv.FormatInt(cur, 10) + " of " + strconv.FormatInt(latest, 10), Note: "migrations are applied at start, under a lock"},
		}},
		{Title: "Pool", Items: []ui.Setting{
			{Name: "Accounts", Value: strconv.Itoa(len(n.accounts)), Note: "manage them on the Accounts page or with /api/v1/accounts"},
			{Name: "Client keys", Value: strconv.Itoa(len(n.keys)), Note: "with none, only loopback clients are served"},
			{Name: "Client routes", Value: "/backend-api/codex/*, /v1/*", Note: "Codex's Responses API, HTTP/SSE and WebSocket"},
		}},
		{Title: "Console and admin API", Items: []ui.Setting{
			{Name: "Admin API", Value: "/api/v1", Note: "Authorization: Bearer <CODEX_RELAY_ADMIN_TOKEN>; document at /api/v1/openapi.json"},
			{Name: "Session lifetime", Value: span(sessionTTL) + ", or " + span(sessionIdle) + " without a page or form",
				Note: "kept in the database, so signing out ends a session on every replica; its cookie is signed, HttpOnly and SameSite=Strict; a new admin token ends every session"},
			{Name: "Secure cookies", Value: cookie, Note: "Secure is set whenever the console is served over TLS"},
			{Name: "Login rate limit", Value: strconv.Itoa(loginBurst) + " attempts, then 1 per " + span(loginRefill), Note: "per client address"},
			{Name: "Live updates", Value: "every " + span(s.cfg.LiveInterval), Note: "overview, lanes, diagnostics and sign-ins, over SSE"},
			{Name: "ChatGPT sign-in", Value: cmp.Or(s.cfg.AuthURL, oauth.DefaultIssuer), Note: "CODEX_RELAY_AUTH_URL: the auth server of the Accounts page's Sign in with ChatGPT; a code waits " + span(s.cfg.SignInTimeout) + " for its approval"},
			s.ssoSetting(),
			{Name: "Admin token sign-in", Value: map[bool]string{false: "on", true: "off once an admin person exists"}[s.cfg.NoAdminTokenLogin],
				Note: "CODEX_RELAY_ADMIN_TOKEN_LOGIN; the admin API takes the admin token either way"},
		}},
		{Title: "This replica", Items: []ui.Setting{
			{Name: "Replica id", Value: s.cfg.Relay.ReplicaID(), Note: "marked \"this one\" under Replicas"},
			{Name: "Go", Value: runtime.Version()},
		}},
	}}
	reps, err := s.replicaViews(ctx)
	if err != nil {
		return err
	}
	group := ui.SettingGroup{Title: "Replicas"}
	now := s.cfg.Now()
	for _, r := range reps {
		name := r.Name
		if r.Self {
			name += " (this one)"
		}
		note := "takes forwarded requests at " + r.Address
		if r.Address == "" {
			note = "takes no forwarded requests (no advertised address)"
		}
		group.Items = append(group.Items, ui.Setting{Name: name, Note: note,
			Value: fmt.Sprintf("up %s, heartbeat %s ago, %d lanes", span(now.Sub(r.StartedAt)), span(now.Sub(r.HeartbeatAt)), r.Lanes)})
	}
	if len(group.Items) == 0 {
		group.Items = []ui.Setting{{Name: "None registered yet", Note: "each replica registers within a heartbeat (5 s) of starting"}}
	}
	p.Groups = append(p.Groups, group)
	pv, err := s.pricesView(ctx, prices)
	if err != nil {
		return err
	}
	return s.render(c, status, ui.SettingsPage(s.frame(c, "settings", "Settings"), p, pv))
}

// auditActions are the actions the audit log records, for its filter.
var auditActions = []string{"login", "login.failed", "logout", "binding.reset", "binding.pin", "account.create",
	"account.import", "account.update", "account.delete", "account.pause", "account.resume", "key.create", "key.update", "key.revoke",
	"prices.replace", "user.create", "user.update", "user.delete", "token.create", "token.revoke"}

func (s *Server) auditPage(c echo.Context) error {
	q, err := parseAuditQuery(c)
	if err != nil {
		return err
	}
	entries, total, err := s.cfg.Store.AuditLog(c.Request().Context(), q.filter())
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	actions := make([]ui.Option, len(auditActions))
	for i, a := range auditActions {
		actions[i] = ui.Option{Value: a, Label: a, Selected: a == q.Action}
	}
	// Who: the admin token and every person (a person's choice finds
	// what they did through their tokens too), and whatever the query named.
	users, err := s.cfg.Store.Users(c.Request().Context())
	if err != nil {
		return err
	}
	actors := []string{actorAdminToken}
	for _, u := range users {
		actors = append(actors, u.Email)
	}
	if q.Actor != "" && !slices.Contains(actors, q.Actor) {
		actors = append(actors, q.Actor)
	}
	p := ui.Audit{
		Filter: ui.AuditFilter{Target: q.Target, Actors: choices(q.Actor, actors...), Actions: actions},
		Pager:  pagerFor("/admin/audit", q.values(), q.page, len(entries), total),
	}
	for _, e := range entries {
		p.Rows = append(p.Rows, ui.AuditRow{At: clock(now, e.At), AtFull: stamp(e.At), Actor: e.Actor, User: e.UserEmail, Address: e.Address,
			Action: e.Action, Target: e.Target, Detail: e.Detail, Tone: auditTone(e.Action)})
	}
	return s.render(c, http.StatusOK, ui.AuditPage(s.frame(c, "audit", "Audit log"), p))
}

// threadObjects lists the objects the threads of rows created (files,
// stored responses), newest first.
func (s *Server) threadObjects(ctx context.Context, rows []store.Binding, n names) ([]ui.ObjectRow, error) {
	now := s.cfg.Now()
	seen := map[string]bool{}
	var out []ui.ObjectRow
	for _, b := range rows {
		if b.Kind != store.BindThread || seen[b.Key] {
			continue
		}
		seen[b.Key] = true
		objs, err := s.cfg.Store.Objects(ctx, store.ObjectFilter{ThreadKey: b.Key, Limit: 200})
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			r := ui.ObjectRow{ID: o.ID, Kind: string(o.Kind), Account: n.accountName(o.AccountID), Created: ago(now, o.Created),
				Expires: "when deleted", AccountURL: "/admin/bindings?" + url.Values{"account": {o.AccountID}}.Encode()}
			if !o.Expires.IsZero() {
				r.Expires = until(now, o.Expires)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// ssoSetting describes the console's single sign-on for the Settings page.
func (s *Server) ssoSetting() ui.Setting {
	if s.oidc == nil {
		return ui.Setting{Name: "Single sign-on", Value: "off", Note: "CODEX_RELAY_OIDC_ISSUER and its companions turn it on (README, People, roles and personal tokens)"}
	}
	o := s.oidc.cfg
	return ui.Setting{Name: "Single sign-on", Value: o.Issuer,
		Note: "OpenID Connect, client " + o.ClientID + ", roles from the " + o.RoleClaim + " claim; redirect URI " + strings.TrimRight(o.PublicURL, "/") + oidcPath + "/callback"}
}
