package web

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The overview summarises a recent window of the request log and the
// attempt records. The store lists rows newest first in pages; the window is
// read page by page until it is covered or overviewMaxRows are read, so a
// busy relay costs a bounded read (the overview then says it sampled).
const (
	overviewWindow  = time.Hour
	overviewMaxRows = 5000
	overviewThreads = 8
)

// traffic is the recent records the overview summarises.
type traffic struct {
	requests []store.RequestRecord
	attempts []store.Attempt
	capped   bool // the window held more rows than were read
}

func (s *Server) recentTraffic(ctx context.Context, since time.Time) (traffic, error) {
	var t traffic
	var capped bool
	var err error
	t.requests, capped, err = window(func(off int) ([]store.RequestRecord, int, error) {
		return s.cfg.Store.Requests(ctx, store.RequestFilter{Since: since, Limit: maxPageLimit, Offset: off})
	})
	if err != nil {
		return t, err
	}
	t.capped = capped
	t.attempts, capped, err = window(func(off int) ([]store.Attempt, int, error) {
		return s.cfg.Store.Attempts(ctx, store.AttemptFilter{Since: since, Limit: maxPageLimit, Offset: off})
	})
	t.capped = t.capped || capped
	return t, err
}

// window reads a time window of rows page by page, up to overviewMaxRows,
// and reports whether it stopped there (capped).
func window[T any](page func(off int) ([]T, int, error)) ([]T, bool, error) {
	var out []T
	for {
		rows, total, err := page(len(out))
		if err != nil {
			return out, false, err
		}
		out = append(out, rows...)
		if len(rows) == 0 || len(out) >= total {
			return out, false, nil
		}
		if len(out) >= overviewMaxRows {
			return out, true, nil
		}
	}
}

// overview gathers what the overview shows.
func (s *Server) overview(ctx context.Context) (ui.Overview, error) {
	now := s.cfg.Now()
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return ui.Overview{}, err
	}
	t, err := s.recentTraffic(ctx, now.Add(-overviewWindow))
	if err != nil {
		return ui.Overview{}, err
	}
	_, bindings, err := s.cfg.Store.Bindings(ctx, store.BindingFilter{Limit: 1})
	if err != nil {
		return ui.Overview{}, err
	}
	pins := 0
	for _, k := range []store.BindingKind{store.BindRawSession, store.BindRawThread} {
		_, n, err := s.cfg.Store.Bindings(ctx, store.BindingFilter{Kind: k, Limit: 1})
		if err != nil {
			return ui.Overview{}, err
		}
		pins += n
	}
	rows, err := s.accountRows(ctx, accounts, now)
	if err != nil {
		return ui.Overview{}, err
	}
	return buildOverview(now, accounts, rows, s.cfg.Relay.Lanes(), t, bindings, pins), nil
}

// buildOverview summarises the window before now. It is a pure function
// of its inputs.
func buildOverview(now time.Time, accounts []store.Account, rows []ui.AccountRow, lanes []relay.LaneInfo, t traffic, bindings, pins int) ui.Overview {
	since := now.Add(-overviewWindow)
	const minutes = int(overviewWindow / time.Minute)
	var reqPerMin, switchPerMin, errPerMin [minutes]int
	bucket := func(at time.Time) (int, bool) {
		if at.Before(since) || at.After(now) {
			return 0, false
		}
		i := minutes - 1 - int(now.Sub(at)/time.Minute)
		return i, i >= 0 && i < minutes
	}

	label := map[string]string{}
	for _, a := range accounts {
		label[a.ID] = a.Label
	}
	type threadStat struct {
		thread, session, account string
		last                     time.Time
		requests, switches, errs int
	}
	threads := map[string]*threadStat{}
	nRequests, nFailed := 0, 0
	for _, r := range t.requests {
		i, ok := bucket(r.StartedAt)
		if !ok {
			continue
		}
		nRequests++
		reqPerMin[i]++
		if r.Status >= 400 {
			nFailed++
		}
		if r.ThreadID == "" {
			continue
		}
		ts := threads[r.ThreadID]
		if ts == nil {
			ts = &threadStat{thread: r.ThreadID, session: r.SessionID}
			threads[r.ThreadID] = ts
		}
		ts.requests++
		if r.Status >= 400 {
			ts.errs++
		}
		if r.StartedAt.After(ts.last) {
			ts.last, ts.account = r.StartedAt, r.AccountID
		}
	}
	classes := map[string]int{}
	nSwitches, nErrors := 0, 0
	for _, a := range t.attempts {
		i, ok := bucket(a.StartedAt)
		if !ok {
			continue
		}
		if a.FromAccountID != "" && a.FromAccountID != a.AccountID {
			nSwitches++
			switchPerMin[i]++
			if ts := threads[a.ThreadID]; ts != nil {
				ts.switches++
			}
		}
		if a.Class != "ok" {
			nErrors++
			errPerMin[i]++
			classes[a.Class]++
		}
	}

	o := ui.Overview{Window: "Last 60 minutes", UpdatedAt: clock(now, now)}
	if t.capped {
		o.Sampled = fmt.Sprintf("Busy window: the newest %d requests and attempts are summarised.", overviewMaxRows)
	}

	available, limited := 0, 0
	for _, a := range accounts {
		switch a.Status {
		case store.StatusActive:
			available++
		case store.StatusRateLimited, store.StatusQuotaExceeded:
			limited++
		}
	}
	poolTone := "ok"
	switch {
	case len(accounts) == 0 || available == 0:
		poolTone = "bad"
	case available < len(accounts):
		poolTone = "warn"
	}
	inflight := 0
	for _, r := range rows {
		inflight += r.InFlight
	}
	errTone := ""
	if nErrors > 0 {
		errTone = "warn"
	}
	if nRequests > 0 && nFailed*10 >= nRequests {
		errTone = "bad"
	}
	o.Cards = []ui.Card{
		{Label: "Accounts available", Value: fmt.Sprintf("%d / %d", available, len(accounts)), Tone: poolTone,
			Note: fmt.Sprintf("%d limited, %d other", limited, len(accounts)-available-limited)},
		{Label: "Requests", Value: strconv.Itoa(nRequests), Note: fmt.Sprintf("%.1f / min, %d failed", float64(nRequests)/float64(minutes), nFailed)},
		{Label: "Switches", Value: strconv.Itoa(nSwitches), Note: "requests moved to another account", Tone: toneIf(nSwitches > 0, "warn")},
		{Label: "Failed attempts", Value: strconv.Itoa(nErrors), Note: fmt.Sprintf("%d %s", len(classes), plural(len(classes), "class", "classes")), Tone: errTone},
		{Label: "In flight", Value: strconv.Itoa(inflight), Note: "on this replica"},
		{Label: "Live lanes", Value: strconv.Itoa(len(lanes)), Note: "on every replica"},
		{Label: "Bindings", Value: strconv.Itoa(bindings), Note: fmt.Sprintf("%d %s", pins, plural(pins, "pin", "pins"))},
	}

	o.Traffic = barChart("Requests per minute", "", reqPerMin[:], switchPerMin[:])
	o.Traffic.Legend = []ui.Legend{{Label: "requests"}, {Label: "switches", Tone: "warn"}}
	o.Errors = barChart("Failed attempts per minute", "bad", errPerMin[:], nil)

	for class, n := range classes {
		o.Classes = append(o.Classes, ui.ClassCount{Class: class, Count: n, Tone: classTone(class),
			URL: "/admin/diagnostics?" + url.Values{"class": {class}}.Encode()})
	}
	sort.Slice(o.Classes, func(i, j int) bool {
		if o.Classes[i].Count != o.Classes[j].Count {
			return o.Classes[i].Count > o.Classes[j].Count
		}
		return o.Classes[i].Class < o.Classes[j].Class
	})
	for i := range o.Classes {
		o.Classes[i].Width = o.Classes[i].Count * 100 / o.Classes[0].Count
	}

	list := make([]*threadStat, 0, len(threads))
	for _, ts := range threads {
		list = append(list, ts)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].requests != list[j].requests {
			return list[i].requests > list[j].requests
		}
		return list[i].last.After(list[j].last)
	})
	for _, ts := range list[:min(len(list), overviewThreads)] {
		o.Threads = append(o.Threads, ui.ThreadRow{Thread: ts.thread, Session: ts.session,
			Account: firstNonEmpty(label[ts.account], ts.account), LastSeen: ago(now, ts.last),
			Requests: ts.requests, Switches: ts.switches, Errors: ts.errs,
			URL: "/admin/bindings?" + url.Values{"thread": {ts.thread}}.Encode()})
	}
	o.Accounts = rows
	return o
}

// barChart lays out one bar per value (oldest first) in a 600x70 box, with
// an optional overlay series drawn over the base of each bar.
func barChart(title, tone string, values, overlay []int) ui.Chart {
	const width, height = 600, 70
	c := ui.Chart{Title: title, Tone: tone, Width: width, Height: height,
		From: fmt.Sprintf("-%d min", len(values)), To: "now"}
	peak := 1
	for _, v := range values {
		peak = max(peak, v)
	}
	c.Max = strconv.Itoa(peak)
	step := width / max(len(values), 1)
	for i, v := range values {
		b := ui.Bar{X: i*step + 1, W: step - 2, H: v * height / peak}
		if v > 0 {
			b.H = max(b.H, 2)
		}
		b.Y = height - b.H
		b.Title = fmt.Sprintf("%d min ago: %d", len(values)-1-i, v)
		if overlay != nil && overlay[i] > 0 {
			b.H2 = max(overlay[i]*height/peak, 2)
			b.Y2 = height - b.H2
			b.Title += fmt.Sprintf(" (%d switched)", overlay[i])
		}
		c.Bars = append(c.Bars, b)
	}
	return c
}

func toneIf(cond bool, tone string) string {
	if cond {
		return tone
	}
	return ""
}
