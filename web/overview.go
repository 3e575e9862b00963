package web

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The overview summarises the last hour of the request log and the attempt
// records, counted by the database (per minute, per class, busiest
// threads), so its cost does not grow with traffic.
const (
	overviewWindow  = time.Hour
	overviewThreads = 8
)

// overview gathers what the overview shows.
func (s *Server) overview(ctx context.Context) (ui.Overview, error) {
	now := s.cfg.Now()
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return ui.Overview{}, err
	}
	t, err := s.cfg.Store.Traffic(ctx, now, int(overviewWindow/time.Minute), overviewThreads)
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

// buildOverview lays out the window before now. It is a pure function of
// its inputs.
func buildOverview(now time.Time, accounts []store.Account, rows []ui.AccountRow, lanes []relay.LaneInfo, t store.Traffic, bindings, pins int) ui.Overview {
	const minutes = int(overviewWindow / time.Minute)
	label := map[string]string{}
	for _, a := range accounts {
		label[a.ID] = a.Label
	}
	sum := func(v []int) int {
		n := 0
		for _, x := range v {
			n += x
		}
		return n
	}
	nRequests, nFailed, nSwitches, nErrors := sum(t.Requests), sum(t.Failed), sum(t.Switches), sum(t.FailedAttempts)
	classes := t.Classes

	o := ui.Overview{Window: "Last 60 minutes", UpdatedAt: clock(now, now)}

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

	o.Traffic = barChart("Requests per minute", "", t.Requests, t.Switches)
	o.Traffic.Legend = []ui.Legend{{Label: "requests"}, {Label: "switches", Tone: "warn"}}
	o.Errors = barChart("Failed attempts per minute", "bad", t.FailedAttempts, nil)

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

	for _, ts := range t.Threads {
		o.Threads = append(o.Threads, ui.ThreadRow{Thread: ts.ThreadID, Session: ts.SessionID,
			Account: cmp.Or(label[ts.AccountID], ts.AccountID), LastSeen: ago(now, ts.LastAt),
			Requests: ts.Requests, Switches: ts.Switches, Errors: ts.Errors,
			URL: "/admin/bindings?" + url.Values{"thread": {ts.ThreadID}}.Encode()})
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
