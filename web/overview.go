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
	return buildOverview(now, accounts, rows, s.cfg.Relay.Lanes(), t, bindings, pins)
}

// buildOverview lays out the window before now. It is a pure function of
// its inputs; it fails only if a chart cannot be drawn.
func buildOverview(now time.Time, accounts []store.Account, rows []ui.AccountRow, lanes []relay.LaneInfo, t store.Traffic, bindings, pins int) (ui.Overview, error) {
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

	charts, err := minuteCharts(now, t)
	if err != nil {
		return ui.Overview{}, err
	}
	o.Charts = charts

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
	return o, nil
}

// The overview's charts: drawn as the Usage page's are (go-analyze/charts,
// sanitised), a line per series over the window's minutes.
const (
	minuteChartWidth        = 600
	minuteChartHeight       = 200
	narrowMinuteChartWidth  = 400
	narrowMinuteChartHeight = 220
	minuteChartTimes        = 5 // times labelled on the time axis
)

// minuteCharts draws the window ending at now, oldest minute first:
// requests per minute, and failed attempts and switches per minute (both
// counted on attempts). The value axes count whole requests or attempts
// per minute; the time axis is each minute's UTC time, as the console's
// times are. The same numbers are the charts' tables.
func minuteCharts(now time.Time, t store.Traffic) ([]ui.UsageChart, error) {
	n := len(t.Requests)
	labels := make([]string, n)
	for i := range labels {
		labels[i] = now.UTC().Add(-time.Duration(n-1-i) * time.Minute).Format("15:04")
	}
	series := func(name string, color int, v []int) chartSeries {
		s := chartSeries{Name: name, Color: color, Values: make([]float64, n)}
		for i := range min(n, len(v)) {
			s.Values[i] = float64(v[i])
		}
		return s
	}
	specs := []struct {
		id, title, unit string
		series          []chartSeries
	}{
		{"requests", "Requests per minute", "requests / min", []chartSeries{series("requests", 0, t.Requests)}},
		{"failed", "Failed attempts and switches per minute", "attempts / min",
			[]chartSeries{series("failed attempts", 2, t.FailedAttempts), series("switches", 6, t.Switches)}},
	}
	var out []ui.UsageChart
	for _, sp := range specs {
		ch := ui.UsageChart{ID: sp.id, Title: sp.title, Note: "the last 60 minutes, times in UTC",
			Table: ui.ChartTable{Caption: sp.title, Corner: "Minute (UTC)"}}
		draw := lineStyle{format: axisCompact, whole: true, unit: sp.unit, xLabels: minuteChartTimes}.draw
		for _, size := range []struct {
			w, h int
			svg  *string
		}{{minuteChartWidth, minuteChartHeight, &ch.SVG}, {narrowMinuteChartWidth, narrowMinuteChartHeight, &ch.NarrowSVG}} {
			raw, err := draw(labels, sp.series, size.w, size.h)
			if err != nil {
				return nil, fmt.Errorf("draw %s chart: %w", sp.id, err)
			}
			if *size.svg, err = sanitizeSVG(raw, sp.title); err != nil {
				return nil, fmt.Errorf("draw %s chart: %w", sp.id, err)
			}
		}
		for _, sr := range sp.series {
			ch.Legend = append(ch.Legend, ui.LegendKey{Label: sr.Name, Series: sr.Color})
			ch.Table.Head = append(ch.Table.Head, sr.Name)
		}
		for i, l := range labels {
			row := ui.ChartRow{Label: l}
			for _, sr := range sp.series {
				row.Cells = append(row.Cells, strconv.Itoa(int(sr.Values[i])))
			}
			ch.Table.Rows = append(ch.Table.Rows, row)
		}
		out = append(out, ch)
	}
	return out, nil
}

func toneIf(cond bool, tone string) string {
	if cond {
		return tone
	}
	return ""
}
