// Package report turns request log rows into usage reports: totals of
// requests, tokens, cost, cache hits, time to first token and errors,
// grouped by client key, account, model, thread, day or hour.
//
// It is pure: rows come in (from store.Store.EachUsageRow), report rows
// go out, rendered as the admin API's JSON or as CSV. Tokens and cost stay
// int64 (cost in billionths of a US dollar) until they are written, so sums
// are exact however many rows go in.
package report

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// Group is a dimension a report is grouped by.
type Group string

// The dimensions. A request's model is the one the upstream served, or the
// one the client asked for when no upstream answered. Days and hours are
// calendar days and hours in the report's time zone.
const (
	GroupKey     Group = "key"
	GroupAccount Group = "account"
	GroupModel   Group = "model"
	GroupThread  Group = "thread"
	GroupDay     Group = "day"
	GroupHour    Group = "hour"
)

// allGroups lists the dimensions, in the order messages name them.
var allGroups = []Group{GroupKey, GroupAccount, GroupModel, GroupThread, GroupDay, GroupHour}

// maxGroups is how many group columns a report can have: each dimension
// at most once.
const maxGroups = 6

// Column is the name of the group's column in JSON and CSV.
func (g Group) Column() string {
	switch g {
	case GroupKey:
		return "key_id"
	case GroupAccount:
		return "account_id"
	}
	return string(g)
}

// value is r's value of the group; day and hour are read in loc.
func (g Group) value(r store.UsageRow, loc *time.Location) string {
	switch g {
	case GroupKey:
		return r.KeyID
	case GroupAccount:
		return r.AccountID
	case GroupModel:
		return cmp.Or(r.ModelServed, r.Model)
	case GroupThread:
		return r.ThreadID
	case GroupDay:
		return r.StartedAt.In(loc).Format(DayLayout)
	case GroupHour:
		return r.StartedAt.In(loc).Format(HourLayout)
	}
	return ""
}

// The layouts of the day and hour columns. Both sort as text in time
// order. In the hour a clock change repeats (autumn), the two hours share
// one label and so one row.
const (
	DayLayout  = "2006-01-02"
	HourLayout = "2006-01-02T15:00"
)

// ParseGroups reads a comma-separated list of dimensions, such as
// "key,model", in the order given, which is the order of the report's
// group columns. An empty string means no grouping: one row of totals.
// Unknown, empty and repeated names are refused.
func ParseGroups(s string) ([]Group, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]Group, 0, len(parts))
	for _, p := range parts {
		g := Group(strings.TrimSpace(p))
		switch {
		case g == "":
			return nil, errors.New("empty name in the list")
		case !slices.Contains(allGroups, g):
			return nil, fmt.Errorf("unknown group %q (want key, account, model, thread, day or hour)", string(g))
		case slices.Contains(out, g):
			return nil, fmt.Errorf("%q is given twice", string(g))
		}
		out = append(out, g)
	}
	return out, nil
}

// Row is one line of a report: the totals of the requests that share its
// group values.
type Row struct {
	// Groups are the report's group columns, in the order asked; Values[i]
	// is this row's value of Groups[i]. Both are empty for a totals row.
	Groups []Group
	Values []string

	Requests          int64
	InputTokens       int64
	CachedInputTokens int64
	OutputTokens      int64
	ReasoningTokens   int64
	TotalTokens       int64
	CostNanos         int64 // billionths of a US dollar
	// UnpricedRequests counts the requests whose model the price table did
	// not price: their cost is the fallback model's price, or 0 without one.
	UnpricedRequests int64
	// TTFTP50MS and TTFTP95MS are the nearest-rank percentiles of the time
	// to the first output token, over the requests that had one; nil when
	// none did.
	TTFTP50MS *int64
	TTFTP95MS *int64
	// Errors counts the requests with an error code or a status of 400 or
	// more; ErrorsByClass splits them by error code (ErrorClass).
	Errors        int64
	ErrorsByClass map[string]int64
}

// CacheHitRate is the share of input tokens that were cached, 0 without
// input.
func (r Row) CacheHitRate() float64 {
	if r.InputTokens == 0 {
		return 0
	}
	return float64(r.CachedInputTokens) / float64(r.InputTokens)
}

// Value is the row's value of group g, and whether the row has that
// column.
func (r Row) Value(g Group) (string, bool) {
	i := slices.Index(r.Groups, g)
	if i < 0 || i >= len(r.Values) {
		return "", false
	}
	return r.Values[i], true
}

// MarshalJSON writes the row as the admin API answers it: the group
// columns asked for (and no others) first, then requests, input_tokens,
// cached_input_tokens, output_tokens, reasoning_tokens, total_tokens,
// cost_usd (a number, exact to the nano-dollar, never in exponent
// notation), unpriced_requests, cache_hit_rate, ttft_p50_ms, ttft_p95_ms (null without
// samples), errors and errors_by_class (an object, {} without errors).
func (r Row) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, g := range r.Groups {
		v := ""
		if i < len(r.Values) {
			v = r.Values[i]
		}
		s, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%q:%s,", g.Column(), s)
	}
	fmt.Fprintf(&b, `"requests":%d,"input_tokens":%d,"cached_input_tokens":%d,"output_tokens":%d,`+
		`"reasoning_tokens":%d,"total_tokens":%d,"cost_usd":%s,"unpriced_requests":%d,"cache_hit_rate":%s,"ttft_p50_ms":%s,`+
		`"ttft_p95_ms":%s,"errors":%d,"errors_by_class":`,
		r.Requests, r.InputTokens, r.CachedInputTokens, r.OutputTokens, r.ReasoningTokens, r.TotalTokens,
		FormatUSD(r.CostNanos), r.UnpricedRequests, formatRate(r.CacheHitRate()), jsonMillis(r.TTFTP50MS), jsonMillis(r.TTFTP95MS), r.Errors)
	byClass := r.ErrorsByClass
	if byClass == nil {
		byClass = map[string]int64{}
	}
	classes, err := json.Marshal(byClass) // keys sorted
	if err != nil {
		return nil, err
	}
	b.Write(classes)
	b.WriteByte('}')
	return b.Bytes(), nil
}

func jsonMillis(p *int64) string {
	if p == nil {
		return "null"
	}
	return strconv.FormatInt(*p, 10)
}

// formatRate writes a ratio in plain decimal notation, never with an
// exponent (JSON and CSV readers alike take it).
func formatRate(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// FormatUSD writes an amount of billionths of a US dollar as dollars in
// plain decimal notation, exactly: up to 9 decimals, trailing zeros
// dropped ("1.5", "0.000000001", "0").
func FormatUSD(nanos int64) string {
	neg := nanos < 0
	u := uint64(nanos)
	if neg {
		u = -u
	}
	s := strconv.FormatUint(u/1e9, 10)
	if frac := u % 1e9; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%09d", frac), "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// ParseUSD reads an amount of US dollars in plain decimal notation (as
// FormatUSD writes it) into billionths of a dollar, exactly. More than 9
// decimals, an exponent or an amount beyond int64 is refused.
func ParseUSD(s string) (int64, error) {
	bad := fmt.Errorf("not an amount of dollars: %q", s)
	t := s
	neg := strings.HasPrefix(t, "-")
	if neg {
		t = t[1:]
	}
	whole, frac, dot := strings.Cut(t, ".")
	if !digits(whole) || len(frac) > 9 || (dot && !digits(frac)) {
		return 0, bad
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, bad
	}
	var f int64
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	if w > (math.MaxInt64-f)/1e9 {
		return 0, bad
	}
	n := w*1e9 + f
	if neg {
		n = -n
	}
	return n, nil
}

func digits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// IsError reports whether a request counts as an error in a report: it
// has an error code, or a status of 400 or more (499 included: the client
// went away).
func IsError(r store.UsageRow) bool { return r.ErrorCode != "" || r.Status >= 400 }

// ErrorClass is the class an error request is counted under in
// errors_by_class: its error code, or "http_<status>" when it has none (a
// status of 400 or more without a code), so the classes add up to the
// errors.
func ErrorClass(r store.UsageRow) string {
	if r.ErrorCode != "" {
		return r.ErrorCode
	}
	return "http_" + strconv.Itoa(r.Status)
}

// Percentile is the nearest-rank percentile p (1 to 100) of sorted, an
// ascending list: the smallest value at least p percent of the values are
// less than or equal to, always one of the values (no interpolation). The
// rank is ceil(p/100 * n), computed in integers. ok is false for an empty
// list.
func Percentile(sorted []int64, p int) (v int64, ok bool) {
	n := len(sorted)
	if n == 0 {
		return 0, false
	}
	rank := (p*n + 99) / 100
	rank = min(max(rank, 1), n)
	return sorted[rank-1], true
}

// groupKey identifies a row of a report: its values of the group columns.
type groupKey [maxGroups]string

// bucket is a row being summed, with its time-to-first-token samples.
type bucket struct {
	row  Row
	ttft []int64
}

// Aggregator sums request log rows into report rows, one row at a time,
// so a report never holds more than its rows and one time sample per
// request that had output. It is not safe for concurrent use.
type Aggregator struct {
	groups  []Group        // static after construction
	loc     *time.Location // static after construction
	buckets map[groupKey]*bucket
}

// NewAggregator starts a report grouped by groups (none: one totals row)
// with days and hours in loc (nil: UTC). groups should come from
// ParseGroups; more than six panics.
func NewAggregator(groups []Group, loc *time.Location) *Aggregator {
	if len(groups) > maxGroups {
		panic("report: more group columns than dimensions")
	}
	if loc == nil {
		loc = time.UTC
	}
	return &Aggregator{groups: slices.Clone(groups), loc: loc, buckets: map[groupKey]*bucket{}}
}

// Add folds one request log row into its report row.
func (a *Aggregator) Add(r store.UsageRow) {
	var k groupKey
	for i, g := range a.groups {
		k[i] = g.value(r, a.loc)
	}
	b := a.buckets[k]
	if b == nil {
		b = &bucket{row: Row{Groups: a.groups, Values: slices.Clone(k[:len(a.groups)]), ErrorsByClass: map[string]int64{}}}
		a.buckets[k] = b
	}
	row := &b.row
	row.Requests++
	row.InputTokens += r.InputTokens
	row.CachedInputTokens += r.CachedTokens
	row.OutputTokens += r.OutputTokens
	row.ReasoningTokens += r.ReasoningTokens
	row.TotalTokens += r.TotalTokens
	row.CostNanos += r.CostNanos
	if r.Unpriced {
		row.UnpricedRequests++
	}
	if IsError(r) {
		row.Errors++
		row.ErrorsByClass[ErrorClass(r)]++
	}
	if r.FirstOutputMS != nil {
		b.ttft = append(b.ttft, *r.FirstOutputMS)
	}
}

// Rows returns the report: its rows ordered by their group values,
// column by column in the order asked, as text (days and hours sort in
// time order). Without groups it is one totals row, also when no request
// was added.
func (a *Aggregator) Rows() []Row {
	if len(a.groups) == 0 && len(a.buckets) == 0 {
		return []Row{{Groups: a.groups, Values: []string{}, ErrorsByClass: map[string]int64{}}}
	}
	out := make([]Row, 0, len(a.buckets))
	for _, b := range a.buckets {
		row := b.row
		if len(b.ttft) > 0 {
			sorted := slices.Clone(b.ttft)
			slices.Sort(sorted)
			p50, _ := Percentile(sorted, 50)
			p95, _ := Percentile(sorted, 95)
			row.TTFTP50MS, row.TTFTP95MS = &p50, &p95
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(x, y Row) int { return slices.Compare(x.Values, y.Values) })
	return out
}

// Aggregate is the report of rows grouped by groups, with days and hours
// in loc; see Aggregator.
func Aggregate(rows iter.Seq[store.UsageRow], groups []Group, loc *time.Location) []Row {
	a := NewAggregator(groups, loc)
	for r := range rows {
		a.Add(r)
	}
	return a.Rows()
}

// MetricColumns are the CSV columns after the group columns.
var MetricColumns = []string{"requests", "input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens",
	"total_tokens", "cost_usd", "unpriced_requests", "cache_hit_rate", "ttft_p50_ms", "ttft_p95_ms", "errors"}

// Header is a report's CSV header: the group columns in the order asked,
// then MetricColumns.
func Header(groups []Group) []string {
	h := make([]string, 0, len(groups)+len(MetricColumns))
	for _, g := range groups {
		h = append(h, g.Column())
	}
	return append(h, MetricColumns...)
}

// WriteCSV writes a report as CSV (RFC 4180 quoting, \n line ends): the
// Header line, then one line per row. Cost is written as FormatUSD does; a
// missing percentile is an empty cell. Group values are user-controlled
// (thread ids, model names) and pass through SafeCell, so a spreadsheet
// runs none of them as a formula (CSV injection), whatever separator its
// locale reads CSV with.
func WriteCSV(w io.Writer, groups []Group, rows []Row) error {
	bw := bufio.NewWriter(w)
	rec := Header(groups)
	writeRecord(bw, rec)
	for _, r := range rows {
		rec = rec[:0]
		for _, g := range groups {
			v, _ := r.Value(g)
			rec = append(rec, SafeCell(v))
		}
		rec = append(rec, itoa(r.Requests), itoa(r.InputTokens), itoa(r.CachedInputTokens), itoa(r.OutputTokens),
			itoa(r.ReasoningTokens), itoa(r.TotalTokens), FormatUSD(r.CostNanos), itoa(r.UnpricedRequests), formatRate(r.CacheHitRate()),
			csvMillis(r.TTFTP50MS), csvMillis(r.TTFTP95MS), itoa(r.Errors))
		writeRecord(bw, rec)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}

// csvSeparators are the characters a spreadsheet may split a CSV line at,
// by locale (the comma; the semicolon where the comma is the decimal mark)
// or by its import defaults (tab, pipe).
const csvSeparators = ",;\t|"

// writeRecord writes one CSV line. A field is quoted (its quotes doubled)
// when it holds a separator of any locale (csvSeparators), a quote or a
// line break, or starts with a space: quoted, no spreadsheet splits it.
func writeRecord(w *bufio.Writer, rec []string) {
	for i, f := range rec {
		if i > 0 {
			w.WriteByte(',')
		}
		if f == "" || !strings.ContainsAny(f, csvSeparators+"\"\r\n") && f[0] != ' ' {
			w.WriteString(f)
			continue
		}
		w.WriteByte('"')
		w.WriteString(strings.ReplaceAll(f, `"`, `""`))
		w.WriteByte('"')
	}
	w.WriteByte('\n')
}

// SafeCell defuses a spreadsheet formula: a cell starting with = + - @, a
// tab, a carriage return, or a separator some locale splits at (; |) gets
// a leading single quote. WriteCSV also quotes a cell holding a separator
// anywhere, so no part of it starts a cell of its own.
func SafeCell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r;|", rune(s[0])) {
		return "'" + s
	}
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func csvMillis(p *int64) string {
	if p == nil {
		return ""
	}
	return strconv.FormatInt(*p, 10)
}
