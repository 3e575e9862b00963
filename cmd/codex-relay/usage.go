package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/codexrelay/codex-relay/internal/report"
)

const usagePurpose = `Report usage from the request log through the admin API (GET /api/v1/usage):
requests, tokens, cost, cache hits, time to first output token and errors over
a window, by default the last 30 days, grouped by -group-by (key, account,
model, thread, day, hour; several with commas). Days and hours are in the
relay's time zone (CODEX_RELAY_TIMEZONE of the server). -from and -to take an
RFC 3339 time, a date (YYYY-MM-DD, midnight in that zone) or unix seconds;
-from is inclusive, -to exclusive.`

// usageFlags are the filters and grouping of a usage report, as the API
// names them.
type usageFlags struct {
	groupBy, from, to, key, account, model, thread string
}

func (f usageFlags) query() url.Values {
	q := url.Values{}
	for name, v := range map[string]string{"group_by": f.groupBy, "from": f.from, "to": f.to, "key": f.key,
		"account": f.account, "model": f.model, "thread": f.thread} {
		if v = strings.TrimSpace(v); v != "" {
			q.Set(name, v)
		}
	}
	return q
}

func runUsage(ctx context.Context, c cli, args []string) error {
	const name = "usage"
	var af apiFlags
	var uf usageFlags
	var asCSV, asJSON bool
	fs := newVerbFlagSet(c, name, "", usagePurpose, "")
	af.register(fs, c)
	fs.StringVar(&uf.groupBy, "group-by", "", "group by these, comma-separated: key, account, model, thread, day, hour (default: totals only)")
	fs.StringVar(&uf.from, "from", "", "start, inclusive (default: 30 days ago)")
	fs.StringVar(&uf.to, "to", "", "end, exclusive (default: a minute from now)")
	fs.StringVar(&uf.key, "key", "", "only requests of this client key (id or name)")
	fs.StringVar(&uf.account, "account", "", "only requests served by this account (id or label; the id of one since removed)")
	fs.StringVar(&uf.model, "model", "", "only requests of this model (served or asked for)")
	fs.StringVar(&uf.thread, "thread", "", "only requests of this thread id")
	fs.BoolVar(&asCSV, "csv", false, "print the API's CSV instead of a table")
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	api, err := parseVerb(c, fs, &af, name, args)
	if err != nil {
		return err
	}
	if asCSV && asJSON {
		return fmt.Errorf("%s: give -csv or -json, not both", name)
	}
	groups, err := report.ParseGroups(uf.groupBy)
	if err != nil {
		return fmt.Errorf("%s: -group-by: %w", name, err)
	}
	if uf.key, err = api.resolveOne(ctx, keyRef, mayBeGone, uf.key); err != nil {
		return fmt.Errorf("%s: -key: %w", name, err)
	}
	if uf.account, err = api.resolveOne(ctx, accountRef, mayBeGone, uf.account); err != nil {
		return fmt.Errorf("%s: -account: %w", name, err)
	}
	q := uf.query()
	if asCSV {
		q.Set("format", "csv")
		return api.copyCSV(ctx, "/usage?"+q.Encode(), c.stdout)
	}
	var raw json.RawMessage
	if err := api.do(ctx, http.MethodGet, "/usage?"+q.Encode(), nil, &raw); err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	rows, err := decodeUsage(raw, groups)
	if err != nil {
		return err
	}
	if len(groups) == 0 {
		return printUsage(c.stdout, nil, rows, nil)
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, "No requests in the window.")
		return nil
	}
	// The totals line's percentiles cannot be had from the groups' own: ask
	// for the totals too.
	q.Del("group_by")
	raw = nil
	if err := api.do(ctx, http.MethodGet, "/usage?"+q.Encode(), nil, &raw); err != nil {
		return err
	}
	totals, err := decodeUsage(raw, nil)
	if err != nil {
		return err
	}
	if len(totals) != 1 {
		return errors.New("usage: unexpected answer: no totals row")
	}
	return printUsage(c.stdout, groups, rows, &totals[0])
}

// usageLine is one row of the API's usage report, cost in billionths of a
// dollar.
type usageLine struct {
	Values            []string // the group columns' values, in the order asked
	Requests          int64
	InputTokens       int64
	CachedInputTokens int64
	OutputTokens      int64
	ReasoningTokens   int64
	TotalTokens       int64
	CostNanos         int64
	TTFTP50MS         *int64
	TTFTP95MS         *int64
	Errors            int64
}

// decodeUsage reads the rows of a JSON usage answer. Cost is read as text
// into nano-dollars, so sums stay exact.
func decodeUsage(raw []byte, groups []report.Group) ([]usageLine, error) {
	var answer struct {
		Rows []json.RawMessage `json:"rows"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return nil, fmt.Errorf("usage: unexpected answer: %w", err)
	}
	out := make([]usageLine, 0, len(answer.Rows))
	for _, r := range answer.Rows {
		var m struct {
			Requests          int64       `json:"requests"`
			InputTokens       int64       `json:"input_tokens"`
			CachedInputTokens int64       `json:"cached_input_tokens"`
			OutputTokens      int64       `json:"output_tokens"`
			ReasoningTokens   int64       `json:"reasoning_tokens"`
			TotalTokens       int64       `json:"total_tokens"`
			CostUSD           json.Number `json:"cost_usd"`
			TTFTP50MS         *int64      `json:"ttft_p50_ms"`
			TTFTP95MS         *int64      `json:"ttft_p95_ms"`
			Errors            int64       `json:"errors"`
		}
		var cols map[string]any
		if err := json.Unmarshal(r, &m); err != nil {
			return nil, fmt.Errorf("usage: unexpected answer: %w", err)
		}
		if err := json.Unmarshal(r, &cols); err != nil {
			return nil, fmt.Errorf("usage: unexpected answer: %w", err)
		}
		cost, err := report.ParseUSD(m.CostUSD.String())
		if err != nil {
			return nil, fmt.Errorf("usage: unexpected answer: cost_usd: %w", err)
		}
		l := usageLine{Requests: m.Requests, InputTokens: m.InputTokens, CachedInputTokens: m.CachedInputTokens,
			OutputTokens: m.OutputTokens, ReasoningTokens: m.ReasoningTokens, TotalTokens: m.TotalTokens, CostNanos: cost,
			TTFTP50MS: m.TTFTP50MS, TTFTP95MS: m.TTFTP95MS, Errors: m.Errors}
		for _, g := range groups {
			v, _ := cols[g.Column()].(string)
			l.Values = append(l.Values, v)
		}
		out = append(out, l)
	}
	return out, nil
}

// usageHeaders are the table's titles of the group columns.
var usageHeaders = map[report.Group]string{report.GroupKey: "KEY", report.GroupAccount: "ACCOUNT",
	report.GroupModel: "MODEL", report.GroupThread: "THREAD", report.GroupDay: "DAY", report.GroupHour: "HOUR"}

// printUsage writes the report as an aligned table: the group columns,
// then the metrics; with groups, a TOTAL line whose sums are the rows' own
// and whose percentiles are the API's totals row's.
func printUsage(w io.Writer, groups []report.Group, rows []usageLine, totals *usageLine) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var head []string
	for _, g := range groups {
		head = append(head, usageHeaders[g])
	}
	head = append(head, "REQUESTS", "INPUT", "CACHED", "OUTPUT", "REASONING", "TOTAL", "COST USD", "CACHE HIT",
		"TTFT P50", "TTFT P95", "ERRORS")
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	var sum usageLine
	for _, r := range rows {
		cells := make([]string, 0, len(groups))
		for _, v := range r.Values {
			cells = append(cells, dash(printable(v)))
		}
		fmt.Fprintln(tw, strings.Join(append(cells, usageCells(r)...), "\t"))
		sum.Requests += r.Requests
		sum.InputTokens += r.InputTokens
		sum.CachedInputTokens += r.CachedInputTokens
		sum.OutputTokens += r.OutputTokens
		sum.ReasoningTokens += r.ReasoningTokens
		sum.TotalTokens += r.TotalTokens
		sum.CostNanos += r.CostNanos
		sum.Errors += r.Errors
	}
	if totals != nil {
		sum.TTFTP50MS, sum.TTFTP95MS = totals.TTFTP50MS, totals.TTFTP95MS
		cells := make([]string, len(groups))
		cells[0] = "TOTAL"
		fmt.Fprintln(tw, strings.Join(append(cells, usageCells(sum)...), "\t"))
	}
	return tw.Flush()
}

func usageCells(r usageLine) []string {
	hit := "-"
	if r.InputTokens > 0 {
		hit = fmt.Sprintf("%.1f%%", 100*float64(r.CachedInputTokens)/float64(r.InputTokens))
	}
	return []string{fmt.Sprint(r.Requests), fmt.Sprint(r.InputTokens), fmt.Sprint(r.CachedInputTokens),
		fmt.Sprint(r.OutputTokens), fmt.Sprint(r.ReasoningTokens), fmt.Sprint(r.TotalTokens), usd4(r.CostNanos), hit,
		millis(r.TTFTP50MS), millis(r.TTFTP95MS), fmt.Sprint(r.Errors)}
}

// usd4 writes nano-dollars as dollars with 4 decimals, rounded half away
// from zero, in integers.
func usd4(nanos int64) string {
	sign := ""
	if nanos < 0 {
		sign, nanos = "-", -nanos
	}
	units := (nanos + 50_000) / 100_000 // ten-thousandths of a dollar
	return fmt.Sprintf("%s%d.%04d", sign, units/10_000, units%10_000)
}

func millis(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%dms", *p)
}

// printable replaces control characters, which would break the table's
// alignment or drive the terminal, in a value that came from clients
// (thread ids, model names).
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// copyCSV copies the CSV answer of GET /api/v1{path} (which asks for it
// with format=csv) to w as it arrives.
func (a *apiClient) copyCSV(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/api/v1"+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the relay at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return answerError(resp.StatusCode, raw)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/csv") {
		return fmt.Errorf("GET %s: unexpected answer of type %q", path, ct)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}
