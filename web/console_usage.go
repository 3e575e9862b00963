package web

import (
	"bytes"
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-analyze/charts"
	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/report"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The Usage page: the request log's tokens, cost, cache hits and time to
// first token over a window, as totals, charts (SVG drawn on the server by
// github.com/go-analyze/charts, sanitised, embedded inline) and tables;
// each key's budgets; and CSV downloads of the report GET /api/v1/usage
// answers, for the same window and filters. The requests page filtered by
// a thread shows that thread's usage (threadUsage).

// usagePresets are the page's ready-made windows: the last 24 hours by the
// hour, or the last 7 or 30 calendar days (today included) by the day.
var usagePresets = []struct{ Value, Label string }{{"24h", "24 hours"}, {"7d", "7 days"}, {"30d", "30 days"}}

// maxUsageDays bounds the window the page charts; the admin API reports
// any window.
const maxUsageDays = 366

// hourlyUpTo is the longest window charted by the hour; longer ones are
// charted by the day.
const hourlyUpTo = 48 * time.Hour

// usagePageQuery is the Usage page's form: a preset window (Range) or a
// window of calendar days, the dimension the charts are stacked by, and
// the key and account filters. From and To are the window, [From, To).
type usagePageQuery struct {
	Range        string // 24h, 7d, 30d; "" when the window is from/to dates
	From, To     time.Time
	By           report.Group // GroupKey or GroupModel
	Key, Account string
}

// parseUsagePageQuery reads the Usage page's parameters: range (24h, 7d or
// 30d), or from and to as dates (YYYY-MM-DD in loc; to is included); by
// (key, the default, or model); key and account. Dates win over a range;
// with neither, the window is the last 7 days.
func parseUsagePageQuery(c echo.Context, now time.Time, loc *time.Location) (usagePageQuery, error) {
	q := usagePageQuery{Range: query(c, "range"), By: report.GroupKey, Key: query(c, "key"), Account: query(c, "account")}
	switch query(c, "by") {
	case "", "key":
	case "model":
		q.By = report.GroupModel
	default:
		return q, badField("by", "must be key or model")
	}
	from, to := query(c, "from"), query(c, "to")
	if from != "" || to != "" {
		q.Range = ""
	} else if q.Range == "" {
		q.Range = "7d"
	}
	t := now.In(loc)
	today := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, loc)
	switch q.Range {
	case "24h":
		q.To = time.Date(t.Year(), t.Month(), t.Day(), t.Hour()+1, 0, 0, 0, loc)
		q.From = q.To.Add(-24 * time.Hour)
	case "7d", "30d":
		days := 7
		if q.Range == "30d" {
			days = 30
		}
		q.From, q.To = today.AddDate(0, 0, 1-days), today.AddDate(0, 0, 1)
	case "":
		end := today
		if to != "" {
			d, err := time.ParseInLocation(time.DateOnly, to, loc)
			if err != nil {
				return q, badField("to", "must be a date such as 2026-11-30")
			}
			end = d
		}
		start := end.AddDate(0, 0, -6)
		if from != "" {
			d, err := time.ParseInLocation(time.DateOnly, from, loc)
			if err != nil {
				return q, badField("from", "must be a date such as 2026-11-30")
			}
			start = d
		}
		if end.Before(start) {
			return q, badField("to", "must be on or after from (%s)", start.Format(time.DateOnly))
		}
		if end.Sub(start) >= maxUsageDays*24*time.Hour {
			return q, badField("from", "the page shows at most %d days at once; GET /api/v1/usage reports any window", maxUsageDays)
		}
		q.From, q.To = start, end.AddDate(0, 0, 1)
	default:
		return q, badField("range", "must be 24h, 7d or 30d")
	}
	return q, nil
}

func (q usagePageQuery) hourly() bool { return q.To.Sub(q.From) <= hourlyUpTo }

func (q usagePageQuery) filter() store.UsageFilter {
	return store.UsageFilter{From: q.From, To: q.To, KeyID: q.Key, AccountID: q.Account}
}

// link is the page with q's filters and the window given by kv (range, or
// from and to).
func (q usagePageQuery) link(kv ...string) string {
	v := pairs(append([]string{"by", string(q.By), "key", q.Key, "account", q.Account}, kv...)...)
	if q.By == report.GroupKey {
		v.Del("by")
	}
	return withQuery("/admin/usage", v)
}

// csvURL is the console's CSV download of q's window and filters, one row
// per groupBy.
func (q usagePageQuery) csvURL(groupBy string, loc *time.Location) string {
	v := pairs("from", q.From.In(loc).Format(time.RFC3339), "to", q.To.In(loc).Format(time.RFC3339),
		"key", q.Key, "account", q.Account, "group_by", groupBy)
	return "/admin/usage.csv?" + v.Encode()
}

// usageDownloads are the CSV groupings the page links, the default first.
var usageDownloads = []struct{ GroupBy, Label string }{
	{"day,key", "day and key"}, {"day,model", "day and model"}, {"day,account", "day and account"},
	{"hour,key", "hour and key"}, {"key,model", "key and model"}, {"account", "account"}, {"thread", "thread"},
}

// defaultUsageCSVGroups is the grouping of /admin/usage.csv without
// group_by.
const defaultUsageCSVGroups = "day,key"

func (s *Server) usagePage(c echo.Context) error {
	ctx := c.Request().Context()
	now, loc := s.cfg.Now(), s.cfg.Location
	q, err := parseUsagePageQuery(c, now, loc)
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	p, err := s.usageView(ctx, q, n, loc)
	if err != nil {
		return err
	}
	if p.Budgets, err = s.budgetViews(ctx, n.keys, q.Key, now, loc); err != nil {
		return err
	}
	return s.render(c, http.StatusOK, ui.UsagePage(s.frame(c, "usage", "Usage"), p))
}

// usageCSV answers /admin/usage.csv: the CSV GET /api/v1/usage?format=csv
// answers, from the same handler, for the console's session. group_by
// defaults to day,key.
func (s *Server) usageCSV(c echo.Context) error {
	v := c.QueryParams() // echo's parsed query, which s.usage reads
	v.Set("format", "csv")
	if strings.TrimSpace(v.Get("group_by")) == "" {
		v.Set("group_by", defaultUsageCSVGroups)
	}
	c.Request().URL.RawQuery = v.Encode()
	return s.usage(c)
}

// usageFold sums the window's request log rows into the reports the page
// shows, in one pass over the log.
type usageFold struct {
	totals    *report.Aggregator // no groups
	byGroup   *report.Aggregator // bucket, key or model
	byAccount *report.Aggregator // bucket, account
	byBucket  *report.Aggregator // bucket
}

func newUsageFold(bucket, by report.Group, loc *time.Location) *usageFold {
	return &usageFold{
		totals:    report.NewAggregator(nil, loc),
		byGroup:   report.NewAggregator([]report.Group{bucket, by}, loc),
		byAccount: report.NewAggregator([]report.Group{bucket, report.GroupAccount}, loc),
		byBucket:  report.NewAggregator([]report.Group{bucket}, loc),
	}
}

func (f *usageFold) add(r store.UsageRow) error {
	f.totals.Add(r)
	f.byGroup.Add(r)
	f.byAccount.Add(r)
	f.byBucket.Add(r)
	return nil
}

// usageView builds the Usage page but its budgets.
func (s *Server) usageView(ctx context.Context, q usagePageQuery, n names, loc *time.Location) (ui.UsageReport, error) {
	bucket := report.GroupDay
	if q.hourly() {
		bucket = report.GroupHour
	}
	fold := newUsageFold(bucket, q.By, loc)
	if err := s.cfg.Store.EachUsageRow(ctx, q.filter(), fold.add); err != nil {
		return ui.UsageReport{}, err
	}
	p := ui.UsageReport{
		Filter: ui.UsageFilter{From: q.From.In(loc).Format(time.DateOnly), To: q.To.Add(-time.Millisecond).In(loc).Format(time.DateOnly),
			Zone: loc.String(), By: choices(string(q.By), "key", "model"), Keys: n.keyOptions(q.Key), Accounts: n.accountOptions(q.Account)},
		Window: usageWindow(q, loc),
	}
	for _, r := range usagePresets {
		p.Filter.Presets = append(p.Filter.Presets, ui.Preset{Label: r.Label, URL: q.link("range", r.Value), Current: q.Range == r.Value})
	}
	for _, d := range usageDownloads {
		p.Downloads = append(p.Downloads, ui.Download{Label: d.Label, URL: q.csvURL(d.GroupBy, loc)})
	}
	total := fold.totals.Rows()[0]
	p.Cards = usageCards(total)
	if total.Requests == 0 {
		p.Empty = true
		return p, nil
	}
	buckets := usageBuckets(q.From, q.To, bucket, loc)
	name := func(v string) string {
		if q.By == report.GroupKey {
			return n.keyName(v)
		}
		return cmp.Or(v, "unknown")
	}
	what := "key"
	if q.By == report.GroupModel {
		what = "model"
	}
	drawn, err := usageCharts(buckets, bucket, what, name, n.accountName, fold, loc)
	if err != nil {
		return ui.UsageReport{}, err
	}
	for i := range drawn {
		if drawn[i].ID == "cost" && drawn[i].SVG == "" {
			drawn[i].Empty = costEmpty(total)
		}
	}
	p.Charts = drawn
	return p, nil
}

// usageWindow says the window in words: its days, or its hours.
func usageWindow(q usagePageQuery, loc *time.Location) string {
	from, last := q.From.In(loc), q.To.Add(-time.Millisecond).In(loc)
	if q.hourly() {
		return "From " + from.Format("2006-01-02 15:04") + " to " + q.To.In(loc).Format("2006-01-02 15:04") + ", by the hour"
	}
	days := int(math.Round(q.To.Sub(q.From).Hours() / 24))
	return fmt.Sprintf("%s to %s (%d %s), by the day", from.Format(time.DateOnly), last.Format(time.DateOnly), days, plural(days, "day", "days"))
}

// usageCards are the window's totals.
func usageCards(t report.Row) []ui.Card {
	errTone := ""
	if t.Errors > 0 {
		errTone = "warn"
	}
	errNote := "none"
	if t.Requests > 0 {
		errNote = percentText(float64(t.Errors)/float64(t.Requests)) + " of requests"
	}
	return []ui.Card{
		{Label: "Requests", Value: thousands(t.Requests), Note: "in the window"},
		{Label: "Tokens", Value: compact(float64(t.TotalTokens)), Note: "in " + compact(float64(t.InputTokens)) + " (cached " +
			compact(float64(t.CachedInputTokens)) + ") · out " + compact(float64(t.OutputTokens)) + " (reasoning " + compact(float64(t.ReasoningTokens)) + ")"},
		costCard(t),
		{Label: "Cache-hit rate", Value: percentText(t.CacheHitRate()), Note: "of input tokens"},
		{Label: "Time to first token", Value: millisPair(t.TTFTP50MS, t.TTFTP95MS), Note: "p50 / p95"},
		{Label: "Errors", Value: thousands(t.Errors), Note: errNote, Tone: errTone},
	}
}

// costCard is the window's cost, with what was not priced by its own
// entry in the price table.
func costCard(t report.Row) ui.Card {
	c := ui.Card{Label: "Cost", Value: dollars(t.CostNanos), Note: "US dollars, as priced"}
	if t.UnpricedRequests > 0 {
		c.Note = thousands(t.UnpricedRequests) + " unpriced: the price table has no entry for their model (Settings → Prices)"
		c.Tone = "warn"
	}
	return c
}

// costEmpty says why a window with requests shows no cost.
func costEmpty(t report.Row) string {
	switch {
	case t.TotalTokens == 0:
		return "No request in this window reported token usage, so none has a cost."
	case t.UnpricedRequests > 0:
		return "The requests of this window used tokens but cost $0: the price table has no entry for their models and no fallback model to price them at (Settings → Prices). A cost_usd limit does not count them."
	default:
		return "The requests of this window used tokens, at prices of $0 in the price table (Settings → Prices)."
	}
}

// usageBuckets lists the window's days (or hours) as report rows name
// them (report.DayLayout, report.HourLayout), in order, empty ones
// included. An hour a clock change repeats is listed once, as the report
// folds it.
func usageBuckets(from, to time.Time, bucket report.Group, loc *time.Location) []string {
	var out []string
	if bucket == report.GroupHour {
		f := from.In(loc)
		for t := time.Date(f.Year(), f.Month(), f.Day(), f.Hour(), 0, 0, 0, loc); t.Before(to); t = t.Add(time.Hour) {
			if l := t.In(loc).Format(report.HourLayout); len(out) == 0 || out[len(out)-1] != l {
				out = append(out, l)
			}
		}
		return out
	}
	f := from.In(loc)
	for d := time.Date(f.Year(), f.Month(), f.Day(), 0, 0, 0, 0, loc); d.Before(to); d = d.AddDate(0, 0, 1) {
		out = append(out, d.Format(report.DayLayout))
	}
	return out
}

// bucketLabel is a bucket's short name on a chart's axis: "Jan 2", or
// "15:00".
func bucketLabel(v string, bucket report.Group, loc *time.Location) string {
	if bucket == report.GroupHour {
		if t, err := time.ParseInLocation(report.HourLayout, v, loc); err == nil {
			return t.Format("15:04")
		}
		return v
	}
	if t, err := time.ParseInLocation(report.DayLayout, v, loc); err == nil {
		return t.Format("Jan 2")
	}
	return v
}

// seriesColors is the console's chart palette, by series; console.css
// colours the legend swatches (.swatch.series-N) the same, in the same
// order. The last is for what the charts fold into "other".
var seriesColors = [...]string{"#0969da", "#1a7f37", "#bc4c00", "#8250df", "#bf3989", "#1b7c83", "#9a6700", "#6e7781"}

// otherSeries is the palette index of "other"; the named series take the
// ones before it.
const otherSeries = len(seriesColors) - 1

// chartSeries is one series of a chart: its name, its palette index, and
// a value per bucket (NaN: none, drawn as a gap).
type chartSeries struct {
	Name   string
	Color  int
	Values []float64
}

// usageCharts draws the page's four charts: tokens and cost stacked by key
// or model, cache-hit rate per account, and time to first token.
func usageCharts(buckets []string, bucket report.Group, what string, name, accountName func(string) string,
	fold *usageFold, loc *time.Location) ([]ui.UsageChart, error) {
	index := make(map[string]int, len(buckets))
	labels := make([]string, len(buckets))
	for i, b := range buckets {
		index[b] = i
		labels[i] = bucketLabel(b, bucket, loc)
	}
	period := "day"
	if bucket == report.GroupHour {
		period = "hour"
	}
	corner := strings.ToUpper(period[:1]) + period[1:]

	tokens, cost := groupSeries(fold.byGroup.Rows(), index, len(buckets), what, name)
	cache, cacheNote := cacheSeries(fold.byAccount.Rows(), index, len(buckets), accountName)
	ttft := ttftSeries(fold.byBucket.Rows(), index, len(buckets))

	specs := []struct {
		id, title, note, empty string
		series                 []chartSeries
		draw                   func(labels []string, ss []chartSeries, width, height int) ([]byte, error)
		cell                   func(float64) string
		total                  bool
	}{
		{"tokens", "Tokens per " + period + " by " + what, "total tokens: input, output and reasoning", "No tokens were used in this window.",
			tokens, stackedBars(axisCompact), func(v float64) string { return thousands(int64(v)) }, true},
		{"cost", "Cost per " + period + " by " + what, "US dollars, as each request was priced", "Nothing was priced in this window.",
			cost, stackedBars(axisDollars), func(v float64) string { return dollars(int64(math.Round(v * 1e9))) }, true},
		{"cache", "Cache-hit rate per " + period + " by account", cmp.Or(cacheNote, "cached share of input tokens; prompt caches are per account"),
			"No input tokens in this window.", cache, lineChart(axisPercent, 0, 100), func(v float64) string { return percentText(v / 100) }, false},
		{"ttft", "Time to first token per " + period, "p50 and p95, of the requests that had output", "No request had output in this window.",
			ttft, lineChart(axisMillis, 0, -1), func(v float64) string { return span(time.Duration(v) * time.Millisecond) }, false},
	}
	var out []ui.UsageChart
	for _, sp := range specs {
		ch := ui.UsageChart{ID: sp.id, Title: sp.title, Note: sp.note, Empty: sp.empty,
			Table: ui.ChartTable{Caption: sp.title, Corner: corner}}
		if !drawable(sp.series) {
			out = append(out, ch)
			continue
		}
		for _, size := range []struct {
			w, h int
			svg  *string
		}{{chartWidth, chartHeight, &ch.SVG}, {narrowChartWidth, narrowChartHeight, &ch.NarrowSVG}} {
			raw, err := sp.draw(labels, sp.series, size.w, size.h)
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
		if sp.total {
			ch.Table.Head = append(ch.Table.Head, "Total")
		}
		for j, b := range buckets {
			row := ui.ChartRow{Label: strings.Replace(b, "T", " ", 1)}
			sum := 0.0
			for _, sr := range sp.series {
				v := sr.Values[j]
				if math.IsNaN(v) {
					row.Cells = append(row.Cells, "—")
					continue
				}
				sum += v
				row.Cells = append(row.Cells, sp.cell(v))
			}
			if sp.total {
				row.Cells = append(row.Cells, sp.cell(sum))
			}
			ch.Table.Rows = append(ch.Table.Rows, row)
		}
		out = append(out, ch)
	}
	return out, nil
}

// groupSeries splits tokens and cost per bucket (rows grouped by bucket
// and key or model) into series, one a group, the groups with the most
// tokens first; past the palette's named colours the rest are folded into
// one "other" series. Both lists have the same series in the same order,
// so a group has one colour in both charts.
func groupSeries(rows []report.Row, index map[string]int, n int, what string, name func(string) string) (tokens, cost []chartSeries) {
	type groupUse struct {
		tokens, cost []int64
		sumT, sumC   int64
	}
	groups := map[string]*groupUse{}
	for _, r := range rows {
		i, ok := index[r.Values[0]]
		if !ok {
			continue
		}
		g := groups[r.Values[1]]
		if g == nil {
			g = &groupUse{tokens: make([]int64, n), cost: make([]int64, n)}
			groups[r.Values[1]] = g
		}
		g.tokens[i] += r.TotalTokens
		g.cost[i] += r.CostNanos
		g.sumT += r.TotalTokens
		g.sumC += r.CostNanos
	}
	order := make([]string, 0, len(groups))
	for k := range groups {
		order = append(order, k)
	}
	slices.SortFunc(order, func(a, b string) int {
		ga, gb := groups[a], groups[b]
		return cmp.Or(cmp.Compare(gb.sumT, ga.sumT), cmp.Compare(gb.sumC, ga.sumC), cmp.Compare(name(a), name(b)), cmp.Compare(a, b))
	})
	for i, k := range order {
		g := groups[k]
		if i >= otherSeries && len(order) > otherSeries+1 {
			if i == otherSeries {
				tokens = append(tokens, chartSeries{Name: fmt.Sprintf("%d other %ss", len(order)-otherSeries, what), Color: otherSeries,
					Values: make([]float64, n)})
				cost = append(cost, chartSeries{Name: tokens[len(tokens)-1].Name, Color: otherSeries, Values: make([]float64, n)})
			}
			for j := range n {
				tokens[otherSeries].Values[j] += float64(g.tokens[j])
				cost[otherSeries].Values[j] += float64(g.cost[j]) / 1e9
			}
			continue
		}
		t, c := chartSeries{Name: name(k), Color: i, Values: make([]float64, n)}, chartSeries{Name: name(k), Color: i, Values: make([]float64, n)}
		for j := range n {
			t.Values[j], c.Values[j] = float64(g.tokens[j]), float64(g.cost[j])/1e9
		}
		tokens, cost = append(tokens, t), append(cost, c)
	}
	return tokens, cost
}

// cacheSeries is each account's cache-hit rate per bucket (rows grouped
// by bucket and account), in percent, NaN where it had no input: the
// accounts with the most input tokens, and a note when some were left
// out.
func cacheSeries(rows []report.Row, index map[string]int, n int, accountName func(string) string) ([]chartSeries, string) {
	type accountUse struct {
		input, cached []int64
		sum           int64
	}
	accounts := map[string]*accountUse{}
	for _, r := range rows {
		i, ok := index[r.Values[0]]
		if !ok || r.Values[1] == "" || r.InputTokens == 0 {
			continue
		}
		a := accounts[r.Values[1]]
		if a == nil {
			a = &accountUse{input: make([]int64, n), cached: make([]int64, n)}
			accounts[r.Values[1]] = a
		}
		a.input[i] += r.InputTokens
		a.cached[i] += r.CachedInputTokens
		a.sum += r.InputTokens
	}
	accountOrder := make([]string, 0, len(accounts))
	for k := range accounts {
		accountOrder = append(accountOrder, k)
	}
	slices.SortFunc(accountOrder, func(a, b string) int {
		return cmp.Or(cmp.Compare(accounts[b].sum, accounts[a].sum), cmp.Compare(accountName(a), accountName(b)), cmp.Compare(a, b))
	})
	cacheNote := ""
	if len(accountOrder) > otherSeries {
		cacheNote = fmt.Sprintf("the %d accounts with the most input tokens; %d more in the CSV by day and account", otherSeries, len(accountOrder)-otherSeries)
		accountOrder = accountOrder[:otherSeries]
	}
	var cache []chartSeries
	for i, k := range accountOrder {
		a := accounts[k]
		sr := chartSeries{Name: accountName(k), Color: i, Values: make([]float64, n)}
		for j := range n {
			sr.Values[j] = math.NaN()
			if a.input[j] > 0 {
				sr.Values[j] = 100 * float64(a.cached[j]) / float64(a.input[j])
			}
		}
		cache = append(cache, sr)
	}
	return cache, cacheNote
}

// ttftSeries is the p50 and p95 time to first token per bucket (rows
// grouped by bucket), NaN where no request had output; none when no
// bucket had one.
func ttftSeries(rows []report.Row, index map[string]int, n int) []chartSeries {
	p50 := chartSeries{Name: "p50", Color: 0, Values: make([]float64, n)}
	p95 := chartSeries{Name: "p95", Color: 2, Values: make([]float64, n)}
	for j := range n {
		p50.Values[j], p95.Values[j] = math.NaN(), math.NaN()
	}
	sampled := false
	for _, r := range rows {
		if i, ok := index[r.Values[0]]; ok && r.TTFTP50MS != nil {
			p50.Values[i], p95.Values[i] = float64(*r.TTFTP50MS), float64(*r.TTFTP95MS)
			sampled = true
		}
	}
	if !sampled {
		return nil
	}
	return []chartSeries{p50, p95}
}

// drawable reports whether any series has a value to draw: a stacked
// chart of zeros, or lines of gaps only, would be an empty frame.
func drawable(ss []chartSeries) bool {
	for _, s := range ss {
		for _, v := range s.Values {
			if !math.IsNaN(v) && v != 0 {
				return true
			}
		}
	}
	return false
}

// The drawing canvases, in SVG user units: the page scales a chart to its
// width, the wide one on screens wider than a phone, the narrow one on
// phones (so its text is not scaled down to nothing).
const (
	chartWidth        = 720
	chartHeight       = 260
	narrowChartWidth  = 400
	narrowChartHeight = 260
	chartFontSize     = 9.0 // points: 12 px on the canvas
)

// chartTheme colours a chart in the console's palette: each series its
// palette colour, muted text, light axes and grid, no background.
func chartTheme(ss []chartSeries) charts.ColorPalette {
	colors := make([]charts.Color, len(ss))
	for i, s := range ss {
		colors[i] = charts.ColorFromHex(seriesColors[s.Color])
	}
	return charts.MakeTheme(charts.ThemeOption{
		BackgroundColor:    charts.ColorTransparent,
		TextColor:          charts.ColorFromHex("#59636e"),
		AxisStrokeColor:    charts.ColorFromHex("#d1d9e0"),
		AxisSplitLineColor: charts.ColorFromHex("#eaeef2"),
		SeriesColors:       colors,
	})
}

func chartPainter(width, height int) *charts.Painter {
	return charts.NewPainter(charts.PainterOptions{OutputFormat: charts.ChartOutputSVG, Width: width, Height: height})
}

var chartPadding = charts.NewBox(8, 12, 16, 4)

// stackedBars draws series as bars stacked per bucket, the value axis
// labelled by format.
func stackedBars(format charts.ValueFormatter) func([]string, []chartSeries, int, int) ([]byte, error) {
	return func(labels []string, ss []chartSeries, width, height int) ([]byte, error) {
		data := make([][]float64, len(ss))
		for i, s := range ss {
			data[i] = make([]float64, len(s.Values))
			for j, v := range s.Values {
				if !math.IsNaN(v) {
					data[i][j] = v
				}
			}
		}
		opt := charts.NewBarChartOptionWithData(data)
		opt.Theme = chartTheme(ss)
		opt.Padding = chartPadding
		opt.StackSeries = charts.Ptr(true)
		opt.Legend.Show = charts.Ptr(false)
		opt.CategoryAxis.Labels = labels
		opt.CategoryAxis.LabelFontStyle.FontSize = chartFontSize
		opt.ValueAxis[0].LabelFontStyle.FontSize = chartFontSize
		opt.ValueAxis[0].Min = charts.Ptr(0.0)
		opt.ValueFormatter = format
		p := chartPainter(width, height)
		if err := p.BarChart(opt); err != nil {
			return nil, err
		}
		return p.Bytes()
	}
}

// lineChart draws series as lines with gaps where a value is NaN, the
// value axis from lo to hi (hi < 0: as the data needs) labelled by format.
func lineChart(format charts.ValueFormatter, lo, hi float64) func([]string, []chartSeries, int, int) ([]byte, error) {
	return lineStyle{format: format, lo: lo, hi: hi}.draw
}

// lineStyle is how a line chart is drawn: the value axis from lo to hi
// (hi < 0: as the data needs; with whole, from 0 to a multiple of 4 at
// least the highest value, in whole steps, the lines without dots)
// labelled by format, and titled unit when set; xLabels, when set, is how
// many bucket labels the category axis shows (the library's choice when
// 0).
type lineStyle struct {
	format  charts.ValueFormatter
	lo, hi  float64
	whole   bool
	unit    string
	xLabels int
}

func (st lineStyle) draw(labels []string, ss []chartSeries, width, height int) ([]byte, error) {
	data := make([][]float64, len(ss))
	peak := 0.0
	for i, s := range ss {
		data[i] = make([]float64, len(s.Values))
		for j, v := range s.Values {
			data[i][j] = v
			if math.IsNaN(v) {
				data[i][j] = charts.GetNullValue()
			} else {
				peak = max(peak, v)
			}
		}
	}
	opt := charts.NewLineChartOptionWithData(data)
	opt.Theme = chartTheme(ss)
	opt.Padding = chartPadding
	opt.Legend.Show = charts.Ptr(false)
	opt.XAxis.Labels = labels
	opt.XAxis.LabelFontStyle.FontSize = chartFontSize
	if st.xLabels > 0 {
		opt.XAxis.LabelCount = st.xLabels
	}
	opt.YAxis[0].LabelFontStyle.FontSize = chartFontSize
	opt.YAxis[0].Min = charts.Ptr(st.lo)
	switch {
	case st.whole:
		opt.YAxis[0].Max = charts.Ptr(math.Max(4, 4*math.Ceil(peak/4)))
		opt.YAxis[0].LabelCount = 5
		opt.YAxis[0].PreferNiceIntervals = charts.Ptr(false)
	case st.hi >= 0:
		opt.YAxis[0].Max = charts.Ptr(st.hi)
	}
	if st.unit != "" {
		opt.YAxis[0].Title = st.unit
		opt.YAxis[0].TitleFontStyle.FontSize = chartFontSize
	}
	if st.whole {
		opt.Symbol = charts.Symbol{Shape: charts.SymbolNone}
	}
	opt.LineStrokeWidth = 2
	opt.ValueFormatter = st.format
	p := chartPainter(width, height)
	if err := p.LineChart(opt); err != nil {
		return nil, err
	}
	return p.Bytes()
}

// Axis label formats.
func axisCompact(v float64) string { return compact(v) }
func axisDollars(v float64) string {
	if v != 0 && math.Abs(v) < 1 {
		return "$" + trimFloat(v, 4)
	}
	return "$" + compact(v)
}
func axisPercent(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) + "%" }
func axisMillis(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + " s"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
}

// sanitizeSVG rewrites an SVG the charting library drew into markup safe
// to embed in a page: only drawing elements (svg, g, path, text, circle,
// rect, line, polyline, polygon) are kept, everything else is dropped with
// its content (script, style, foreignObject, links, images); attributes
// are kept only when they are geometry made of numbers and path commands,
// or paint (fill, stroke, their widths and opacities, font size, text
// anchor), and a style attribute's declarations become those presentation
// attributes, so the page's Content-Security-Policy (no inline styles) has
// nothing to refuse. Colours become #rrggbb. Text is escaped again, which
// matters: it is operator data (key and account names). The root svg keeps
// only its viewBox and gets role="img" and label as its accessible name.
func sanitizeSVG(raw []byte, label string) (string, error) {
	d := xml.NewDecoder(bytes.NewReader(raw))
	var b strings.Builder
	var open []string // the elements written and not yet closed
	root := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("sanitise svg: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			name := t.Name.Local
			isRoot := name == "svg" && len(open) == 0 && !root
			if !svgElements[name] || (name == "svg") != isRoot || (len(open) == 0 && !isRoot) ||
				(t.Name.Space != "" && t.Name.Space != svgNamespace) {
				if err := d.Skip(); err != nil {
					return "", fmt.Errorf("sanitise svg: %w", err)
				}
				continue
			}
			b.WriteString("<" + name)
			if isRoot {
				root = true
				b.WriteString(` xmlns="` + svgNamespace + `"`)
				for _, a := range t.Attr {
					if a.Name.Space == "" && a.Name.Local == "viewBox" && svgNumbers.MatchString(a.Value) {
						writeAttr(&b, "viewBox", strings.Join(strings.Fields(a.Value), " "))
					}
				}
				b.WriteString(` role="img"`)
				writeAttr(&b, "aria-label", label)
			} else {
				writeSVGAttrs(&b, t.Attr)
			}
			b.WriteString(">")
			open = append(open, name)
		case xml.EndElement:
			if len(open) == 0 {
				return "", errors.New("sanitise svg: unbalanced end tag")
			}
			b.WriteString("</" + open[len(open)-1] + ">")
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 && open[len(open)-1] == "text" {
				if err := xml.EscapeText(&b, t); err != nil {
					return "", fmt.Errorf("sanitise svg: %w", err)
				}
			}
		}
	}
	if !root || len(open) != 0 {
		return "", errors.New("sanitise svg: no complete svg element")
	}
	return b.String(), nil
}

const svgNamespace = "http://www.w3.org/2000/svg"

// svgElements are the elements a chart keeps.
var svgElements = map[string]bool{"svg": true, "g": true, "path": true, "text": true, "circle": true, "rect": true,
	"line": true, "polyline": true, "polygon": true}

// svgGeometry are the attributes kept when their value is geometry.
var svgGeometry = map[string]bool{"d": true, "x": true, "y": true, "x1": true, "y1": true, "x2": true, "y2": true,
	"cx": true, "cy": true, "r": true, "rx": true, "ry": true, "width": true, "height": true, "points": true,
	"transform": true, "stroke-dasharray": true}

// svgPaint are the presentation properties kept, from attributes or from a
// style attribute's declarations.
var svgPaint = map[string]bool{"fill": true, "stroke": true, "stroke-width": true, "fill-opacity": true,
	"stroke-opacity": true, "opacity": true, "font-size": true, "text-anchor": true, "stroke-linecap": true,
	"stroke-linejoin": true}

var (
	// svgNumbers is a list of numbers.
	svgNumbers = regexp.MustCompile(`^[-+0-9.eE, \t\r\n]*$`)
	// svgGeometryValue is numbers, path commands and transform functions.
	svgGeometryValue = regexp.MustCompile(`^(?:[-+0-9.eE, \t\r\n()MmLlHhVvCcSsQqTtAaZz]|rotate|translate|scale|matrix)*$`)
	// svgPaintValue is a hex colour, a keyword (none, white, round,
	// middle…) or a length.
	svgPaintValue = regexp.MustCompile(`^(?:#[0-9a-fA-F]{3,8}|[a-z]+|[0-9.]+(?:px)?)$`)
	svgRGB        = regexp.MustCompile(`^rgba?\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*,\s*(\d{1,3})\s*(?:,\s*([0-9.]+)\s*)?\)$`)
)

// writeSVGAttrs writes the attributes of a drawing element that
// sanitizeSVG keeps, each once, in the order first seen.
func writeSVGAttrs(b *strings.Builder, attrs []xml.Attr) {
	var order []string
	kept := map[string]string{}
	set := func(k, v string) {
		if _, ok := kept[k]; !ok {
			order = append(order, k)
		}
		kept[k] = v
	}
	for _, a := range attrs {
		if a.Name.Space != "" {
			continue
		}
		k, v := a.Name.Local, strings.TrimSpace(a.Value)
		switch {
		case k == "style":
			for _, decl := range strings.Split(v, ";") {
				if p, val, ok := strings.Cut(decl, ":"); ok {
					svgPaintAttr(strings.TrimSpace(p), strings.TrimSpace(val), set)
				}
			}
		case svgGeometry[k]:
			if svgGeometryValue.MatchString(v) {
				set(k, strings.Join(strings.Fields(v), " "))
			}
		case svgPaint[k]:
			svgPaintAttr(k, v, set)
		}
	}
	for _, k := range order {
		writeAttr(b, k, kept[k])
	}
}

// svgPaintAttr keeps one paint property if its value is plain: rgb() and
// rgba() colours become #rrggbb, with the alpha as the property's opacity.
func svgPaintAttr(k, v string, set func(k, v string)) {
	if !svgPaint[k] {
		return
	}
	if m := svgRGB.FindStringSubmatch(v); m != nil {
		var hex [3]uint8
		for i := range hex {
			n, _ := strconv.Atoi(m[i+1])
			hex[i] = uint8(min(n, 255))
		}
		set(k, fmt.Sprintf("#%02x%02x%02x", hex[0], hex[1], hex[2]))
		if a, err := strconv.ParseFloat(m[4], 64); err == nil && a < 1 && (k == "fill" || k == "stroke") {
			set(k+"-opacity", strconv.FormatFloat(max(a, 0), 'f', -1, 64))
		}
		return
	}
	if svgPaintValue.MatchString(v) {
		set(k, v)
	}
}

// writeAttr writes ` name="value"`, the value escaped.
func writeAttr(b *strings.Builder, name, value string) {
	b.WriteString(" " + name + `="`)
	_ = xml.EscapeText(b, []byte(value)) // a strings.Builder does not fail
	b.WriteString(`"`)
}

// budgetViews are the budgets of the live keys with limits (only the key
// named, when one is), as they stand now. A revoked key spends nothing
// more: its page still shows its limits.
func (s *Server) budgetViews(ctx context.Context, keys []store.ClientKey, only string, now time.Time, loc *time.Location) ([]ui.KeyBudget, error) {
	var out []ui.KeyBudget
	for _, k := range keys {
		if len(k.Limits) == 0 || !k.RevokedAt.IsZero() || (only != "" && k.ID != only) {
			continue
		}
		v, err := s.viewKeyUse(ctx, k)
		if err != nil {
			return nil, err
		}
		b := ui.KeyBudget{Name: k.Name, URL: keyURL(k.ID)}
		for _, l := range v.Limits {
			b.Limits = append(b.Limits, limitGauge(l, now, loc))
		}
		out = append(out, b)
	}
	return out, nil
}

// limitGauge shows one limit: a meter of what admission counts (used
// plus reserved), and the same in words.
func limitGauge(l LimitView, now time.Time, loc *time.Location) ui.LimitGauge {
	lim := budget.Limit{Metric: budget.Metric(l.Metric), Window: budget.Window(l.Window), Max: l.Max}
	amount := func(v float64) string {
		if lim.Metric == budget.CostUSD {
			return dollars(int64(math.Round(v * 1e9)))
		}
		return thousands(int64(math.Round(v)))
	}
	counted := l.Used + l.Reserved
	if lim.Metric == budget.Concurrent {
		counted = l.Used // in flight: Used and Reserved are the same requests
	}
	g := ui.LimitGauge{Name: lim.Name(), Max: fnum(l.Max), Value: fnum(min(counted, l.Max)), Low: fnum(0.7 * l.Max),
		High: fnum(0.9 * l.Max), Tone: "ok"}
	share := 1.0
	if l.Max > 0 {
		share = counted / l.Max
	}
	g.Percent = percentText(share)
	switch {
	case share >= 1:
		g.Tone = "bad"
	case share >= 0.7:
		g.Tone = "warn"
	}
	unit := map[budget.Metric]string{budget.Tokens: " tokens", budget.Requests: " requests"}[lim.Metric]
	if lim.Metric == budget.Concurrent {
		g.Text = fmt.Sprintf("%s of %s in flight (%s)", amount(l.Used), amount(l.Max), g.Percent)
	} else {
		g.Text = fmt.Sprintf("%s of %s%s used, %s in flight (%s)", amount(l.Used), amount(l.Max), unit, amount(l.Reserved), g.Percent)
	}
	if l.ResetsAt != nil {
		at := time.Unix(*l.ResetsAt, 0)
		g.Resets = "resets " + until(now, at) + ", " + at.In(loc).Format("2006-01-02 15:04 MST")
	}
	return g
}

// threadUsage sums one thread's whole request log: what the requests page
// filtered by the thread shows above its rows. The accounts that served
// it are listed in the order they first did.
func (s *Server) threadUsage(ctx context.Context, thread string, n names) (*ui.ThreadUsage, error) {
	loc := s.cfg.Location
	total := report.NewAggregator(nil, loc)
	byAccount := report.NewAggregator([]report.Group{report.GroupAccount}, loc)
	first := map[string]time.Time{}
	last := map[string]time.Time{}
	err := s.cfg.Store.EachUsageRow(ctx, store.UsageFilter{ThreadID: thread}, func(r store.UsageRow) error {
		total.Add(r)
		byAccount.Add(r)
		if _, ok := first[r.AccountID]; !ok {
			first[r.AccountID] = r.StartedAt
		}
		last[r.AccountID] = r.StartedAt
		return nil
	})
	if err != nil {
		return nil, err
	}
	t := total.Rows()[0]
	u := &ui.ThreadUsage{Thread: thread, Requests: thousands(t.Requests), Errors: thousands(t.Errors),
		Input: thousands(t.InputTokens), Cached: thousands(t.CachedInputTokens), Output: thousands(t.OutputTokens),
		Reasoning: thousands(t.ReasoningTokens), Total: thousands(t.TotalTokens), Cost: dollars(t.CostNanos),
		CacheRate: percentText(t.CacheHitRate()), TTFT: millisPair(t.TTFTP50MS, t.TTFTP95MS)}
	rows := byAccount.Rows()
	slices.SortFunc(rows, func(a, b report.Row) int { return first[a.Values[0]].Compare(first[b.Values[0]]) })
	for _, r := range rows {
		id := r.Values[0]
		a := ui.ThreadAccount{Name: n.accountName(id), Requests: thousands(r.Requests), Tokens: thousands(r.TotalTokens),
			CacheRate: percentText(r.CacheHitRate()), Span: stamp(first[id]) + " – " + stamp(last[id])}
		if id != "" {
			a.URL = "/admin/requests?" + url.Values{"thread": {thread}, "account": {id}}.Encode()
		}
		u.Accounts = append(u.Accounts, a)
	}
	return u, nil
}

// Number formats of the usage views.

// thousands writes n with thin separators: 1,234,567.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// compact writes a count in a few characters: 950, 12.3k, 4.5M.
func compact(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trimFloat(v/1e9, 1) + "G"
	case a >= 1e6:
		return trimFloat(v/1e6, 1) + "M"
	case a >= 1e3:
		return trimFloat(v/1e3, 1) + "k"
	}
	return trimFloat(v, 2)
}

func trimFloat(v float64, decimals int) string {
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// dollars writes billionths of a US dollar as dollars: cents from a
// dollar up, four decimals below (a single request often costs less than a
// cent).
func dollars(nanos int64) string {
	v := float64(nanos) / 1e9
	switch {
	case nanos == 0:
		return "$0"
	case math.Abs(v) >= 1:
		whole := int64(v)
		cents := int64(math.Round((v - float64(whole)) * 100))
		if cents == 100 {
			whole, cents = whole+1, 0
		}
		return fmt.Sprintf("$%s.%02d", thousands(whole), cents)
	}
	return "$" + strconv.FormatFloat(v, 'f', 4, 64)
}

// percentText writes a share (0 to 1) as a percentage with one decimal.
func percentText(share float64) string {
	return strconv.FormatFloat(100*share, 'f', 1, 64) + "%"
}

// millisText writes a percentile of milliseconds; "—" without samples.
func millisText(ms *int64) string {
	if ms == nil {
		return "—"
	}
	return span(time.Duration(*ms) * time.Millisecond)
}

// millisPair writes a p50 and a p95 as "p50 / p95", the unit said once
// when both share it: "16 / 40 ms", "300 ms / 1.2 s".
func millisPair(p50, p95 *int64) string {
	a, b := millisText(p50), millisText(p95)
	if i, j := strings.LastIndexByte(a, ' '), strings.LastIndexByte(b, ' '); i > 0 && j > 0 && a[i:] == b[j:] {
		return a[:i] + " / " + b
	}
	return a + " / " + b
}

// fnum writes a meter attribute.
func fnum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
