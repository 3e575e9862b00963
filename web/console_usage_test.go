package web

import (
	"context"
	"encoding/xml"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zone tests need Europe/Berlin's clock changes

	"github.com/go-analyze/charts"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/report"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// consoleUsageZone is the usage tests' time zone: not UTC, so days and
// reset times show they are read in the configured zone.
var consoleUsageZone = time.FixedZone("UTC+3", 3*60*60)

// consoleUsageNow is the usage tests' clock, for the store and the
// server alike: an afternoon, so every seeded request keeps its day.
var consoleUsageNow = time.Date(2026, 11, 18, 14, 30, 0, 0, consoleUsageZone)

// eachUsageStore runs f against each database, its clock at
// consoleUsageNow (rolling budget windows are read with it).
func eachUsageStore(t *testing.T, f func(t *testing.T, s *store.Store)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			f(t, storetest.Open(t, b.URL(t), store.Options{Now: func() time.Time { return consoleUsageNow }}))
		})
	}
}

// consoleUsageServer is a console server with the usage tests' zone and
// clock.
func consoleUsageServer(t *testing.T, s *store.Store) *Server {
	t.Helper()
	return New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: &fakeRelay{inflight: map[string]int{}},
		SessionKey: []byte("test session key"), Location: consoleUsageZone, Now: func() time.Time { return consoleUsageNow }})
}

// consoleUsageFixture is what seedConsoleUsage made.
type consoleUsageFixture struct {
	alpha, beta store.Account
	laptop, ci  store.ClientKey // laptop has limits, ci none
	now         time.Time
}

// seedConsoleUsage logs requests over the last three days (and one long
// before), across two keys, two accounts and two models. Thread th-1
// moves from alpha to beta; one request is refused.
func seedConsoleUsage(t *testing.T, s *store.Store) consoleUsageFixture {
	t.Helper()
	ctx := context.Background()
	f := consoleUsageFixture{now: consoleUsageNow}
	var err error
	f.alpha, err = s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "alpha", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	f.beta, err = s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "beta", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	f.laptop, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "laptop <dev> & co", Limits: []budget.Limit{
		{Metric: budget.Tokens, Window: budget.FiveHours, Max: 100000},
		{Metric: budget.CostUSD, Window: budget.Month, Max: 5},
		{Metric: budget.Concurrent, Max: 2},
	}})
	require.NoError(t, err)
	f.ci, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "ci"})
	require.NoError(t, err)
	for i, r := range []store.RequestRecord{
		{ClientKeyID: f.laptop.ID, AccountID: f.alpha.ID, ThreadID: "th-1", Model: "gpt-5.1-codex", ModelServed: "gpt-5.1-codex",
			StartedAt: f.now.Add(-50 * time.Hour), InputTokens: 1000, OutputTokens: 200, TotalTokens: 1200, CostNanos: 10_000_000,
			FirstOutput: 300 * time.Millisecond},
		{ClientKeyID: f.laptop.ID, AccountID: f.alpha.ID, ThreadID: "th-1", Model: "gpt-5.1-codex", ModelServed: "gpt-5.1-codex",
			StartedAt: f.now.Add(-26 * time.Hour), InputTokens: 2000, CachedTokens: 1500, OutputTokens: 100, ReasoningTokens: 50,
			TotalTokens: 2100, CostNanos: 6_000_000, FirstOutput: 200 * time.Millisecond},
		{ClientKeyID: f.ci.ID, AccountID: f.beta.ID, ThreadID: "th-2", Model: "gpt-5.1-codex-mini", ModelServed: "gpt-5.1-codex-mini",
			StartedAt: f.now.Add(-25 * time.Hour), InputTokens: 500, OutputTokens: 50, TotalTokens: 550, CostNanos: 1_000_000,
			FirstOutput: 900 * time.Millisecond},
		{ClientKeyID: f.laptop.ID, AccountID: f.beta.ID, ThreadID: "th-1", Model: "gpt-5.1-codex", ModelServed: "gpt-5.1-codex",
			StartedAt: f.now.Add(-time.Hour), InputTokens: 3000, OutputTokens: 100, TotalTokens: 3100, CostNanos: 20_000_000,
			FirstOutput: 1200 * time.Millisecond},
		{ClientKeyID: f.ci.ID, AccountID: f.alpha.ID, ThreadID: "th-2", Model: "gpt-5.1-codex-mini", Status: 429, ErrorCode: "rate_limit",
			StartedAt: f.now.Add(-30 * time.Minute)},
		// Long before every window the page offers by default.
		{ClientKeyID: f.laptop.ID, AccountID: f.alpha.ID, ThreadID: "th-old", Model: "gpt-5.1-codex", StartedAt: f.now.Add(-40 * 24 * time.Hour),
			InputTokens: 99999, TotalTokens: 99999, CostNanos: 9_000_000_000},
	} {
		r.ID = "req_u" + strconvItoa(i)
		r.Transport, r.Path = "http", "/v1/responses"
		if r.Status == 0 {
			r.Status, r.Charged = 200, true
		}
		require.NoError(t, s.RecordRequest(ctx, r, nil))
	}
	return f
}

// figures splits a page into its chart figures, by data-chart.
func figures(t *testing.T, page string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)<figure class="usage-chart"[^>]*data-chart="([a-z]+)">(.*?)</figure>`).FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// card matches a headline number of a page: its label, value and note.
func card(label, value, note string) string {
	return `<span class="card-label">` + regexp.QuoteMeta(label) + `</span>\s*<span class="card-value">` + regexp.QuoteMeta(value) +
		`</span>\s*<span class="card-note">` + regexp.QuoteMeta(note) + `</span>`
}

// The Usage page: totals, four charts each with its table, the budgets of
// the keys with limits, and CSV links for its window and filters.
func TestConsoleUsagePage(t *testing.T) {
	eachUsageStore(t, func(t *testing.T, s *store.Store) {
		f := seedConsoleUsage(t, s)
		srv := consoleUsageServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rec := b.get("/admin/usage")
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		page := body(rec)
		assert.Contains(t, page, `<a href="/admin/usage" aria-current="page">Usage</a>`, "the navigation has the page")
		today := f.now.In(consoleUsageZone)
		assert.Contains(t, page, `name="from" value="`+today.AddDate(0, 0, -6).Format(time.DateOnly)+`"`, "the last 7 days by default")
		assert.Contains(t, page, `name="to" value="`+today.Format(time.DateOnly)+`"`)
		assert.Contains(t, page, "(7 days), by the day (UTC+3)")

		// Totals: the window's five requests, not the old one.
		for _, c := range [][3]string{
			{"Requests", "5", "in the window"},
			{"Tokens", "7k", "in 6.5k (cached 1.5k) · out 450 (reasoning 50)"},
			{"Cost", "$0.0370", "US dollars, as priced"},
			{"Cache-hit rate", "23.1%", "of input tokens"},
			{"Time to first token", "300 ms / 1.2 s", "p50 / p95"},
			{"Errors", "1", "20.0% of requests"},
		} {
			assert.Regexp(t, card(c[0], c[1], c[2]), page)
		}

		figs := figures(t, page)
		require.Len(t, figs, 4, "tokens, cost, cache-hit rate and time to first token")
		for _, id := range []string{"tokens", "cost", "cache", "ttft"} {
			fig := figs[id]
			require.NotEmpty(t, fig, id)
			assert.Contains(t, fig, `<div class="chart-svg wide"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 720 260" role="img" aria-label="`, id)
			assert.Contains(t, fig, `<div class="chart-svg narrow"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 400 260" role="img" aria-label="`,
				"%s: drawn again for phones", id)
			assert.NotContains(t, fig, "style=", "%s: no inline style for the CSP to refuse", id)
			assert.Contains(t, fig, "<figcaption>", id)
			assert.Contains(t, fig, `<th scope="col">Day</th>`, "%s: the numbers as a table", id)
			assert.Equal(t, 7, strings.Count(fig, `<th scope="row">`), "%s: a row a day", id)
		}
		// Series are drawn in their legend's colour.
		assert.Contains(t, figs["tokens"], `fill="#0969da"`, "the key with the most tokens, drawn")
		assert.Contains(t, figs["tokens"], `fill="#1a7f37"`, "the second key, drawn")
		assert.Contains(t, figs["tokens"], `<span class="swatch series-0" aria-hidden="true"></span>laptop &lt;dev&gt; &amp; co`)
		assert.Contains(t, figs["tokens"], `<span class="swatch series-1" aria-hidden="true"></span>ci`)
		assert.Contains(t, figs["tokens"], `<th scope="col" class="num">laptop &lt;dev&gt; &amp; co</th>`)
		assert.Contains(t, figs["tokens"], `<th scope="row">`+today.Format(time.DateOnly)+`</th><td class="num">3,100</td><td class="num">0</td><td class="num">3,100</td>`)
		assert.Contains(t, figs["cost"], `<td class="num">$0.0200</td>`)
		assert.Contains(t, figs["cache"], `stroke="#0969da"`, "alpha's cache-hit line")
		assert.Contains(t, figs["cache"], `<td class="num">75.0%</td>`, "alpha's day with a cache hit")
		assert.Contains(t, figs["cache"], `<td class="num">—</td>`, "a day without input is a gap")
		assert.Contains(t, figs["ttft"], `<th scope="col" class="num">p50</th><th scope="col" class="num">p95</th>`)

		// Budgets: laptop's limits, as they stand.
		assert.Contains(t, page, `<h3><a href="/admin/keys/`+f.laptop.ID+`">laptop &lt;dev&gt; &amp; co</a></h3>`)
		assert.Contains(t, page, `<meter min="0" max="100000" value="3100" low="70000" high="90000" optimum="0"`)
		assert.Contains(t, page, "3,100 of 100,000 tokens used, 0 in flight (3.1%)")
		assert.Contains(t, page, "$0.0360 of $5.00 used, $0 in flight (0.7%)", "the month's use of the key")
		assert.Contains(t, page, "0 of 2 in flight (0.0%)")
		assert.Contains(t, page, "resets in 12d 9h, 2026-12-01 00:00 UTC+3", "the month resets at its end in the configured zone")
		assert.NotContains(t, page, `<h3><a href="/admin/keys/`+f.ci.ID+`">`, "a key without limits has no budget")

		// The CSV links carry the window, exactly.
		from := today.AddDate(0, 0, -6)
		from = time.Date(from.Year(), from.Month(), from.Day(), 0, 0, 0, 0, consoleUsageZone)
		csv := "/admin/usage.csv?" + url.Values{"from": {from.Format(time.RFC3339)}, "to": {from.AddDate(0, 0, 7).Format(time.RFC3339)},
			"group_by": {"day,key"}}.Encode()
		assert.Contains(t, page, `<a class="download-csv" href="`+html.EscapeString(csv)+`" download>Download CSV</a>`)
		assert.Contains(t, page, `group_by=day%2Cmodel`)

		// By model, the 24 hours by the hour, one key only.
		page = body(b.get("/admin/usage?by=model&range=24h&key=" + f.laptop.ID))
		assert.Contains(t, page, "by the hour")
		assert.Contains(t, page, `<a href="/admin/usage?by=model&amp;key=`+f.laptop.ID+`&amp;range=24h" aria-current="true">24 hours</a>`)
		figs = figures(t, page)
		require.Len(t, figs, 4)
		assert.Contains(t, figs["tokens"], "Tokens per hour by model")
		assert.Contains(t, figs["tokens"], `<span class="swatch series-0" aria-hidden="true"></span>gpt-5.1-codex</span>`)
		assert.NotContains(t, figs["tokens"], "gpt-5.1-codex-mini", "the ci key's model is filtered out")
		assert.Equal(t, 24, strings.Count(figs["tokens"], `<th scope="row">`), "a row an hour")
		assert.Regexp(t, card("Requests", "1", "in the window"), page, "the key's one request of the last 24 hours")

		// Dates: the to date is included; an empty window says so.
		page = body(b.get("/admin/usage?from=" + today.Format(time.DateOnly) + "&to=" + today.Format(time.DateOnly)))
		assert.Contains(t, page, "by the hour", "one day is charted by the hour")
		assert.Regexp(t, card("Requests", "2", "in the window"), page, "today's two requests")
		page = body(b.get("/admin/usage?from=2001-01-01&to=2001-01-31"))
		assert.Contains(t, page, `id="no-usage"`)
		assert.Empty(t, figures(t, page))
		assert.Contains(t, page, "(31 days)")

		for _, bad := range []struct{ query, msg string }{
			{"by=thread", "by: must be key or model"},
			{"range=1y", "range: must be 24h, 7d or 30d"},
			{"from=2026-02-10&to=2026-02-01", "to: must be on or after from (2026-02-10)"},
			{"from=yesterday", "from: must be a date such as 2026-11-30"},
			{"from=2020-01-01&to=2026-01-01", "from: the page shows at most 366 days at once"},
		} {
			rec := b.get("/admin/usage?" + bad.query)
			assert.Equal(t, http.StatusBadRequest, rec.Code, bad.query)
			assert.Contains(t, body(rec), bad.msg, bad.query)
			assert.Contains(t, rec.Header().Get("Content-Type"), "text/html", bad.query)
		}
	})
}

// /admin/usage.csv is GET /api/v1/usage's CSV for the console's session:
// the same bytes, day,key rows unless the link asks for others.
func TestConsoleUsageCSV(t *testing.T) {
	eachUsageStore(t, func(t *testing.T, s *store.Store) {
		f := seedConsoleUsage(t, s)
		srv := consoleUsageServer(t, s)

		anon := newBrowser(t, srv)
		rec := anon.get("/admin/usage.csv")
		assert.Equal(t, http.StatusSeeOther, rec.Code, "a console route: no session, no report")
		assert.Contains(t, rec.Header().Get("Location"), "/admin/login")

		b := newBrowser(t, srv)
		b.login()
		from := f.now.Add(-7 * 24 * time.Hour).UTC().Truncate(time.Second)
		to := f.now.Add(time.Hour).UTC().Truncate(time.Second)
		window := url.Values{"from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
		rec = b.get("/admin/usage.csv?" + window.Encode())
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		assert.Equal(t, "text/csv; charset=utf-8", rec.Header().Get("Content-Type"))
		assert.Regexp(t, `^attachment; filename="usage-[0-9T-]+-[0-9T-]+\.csv"$`, rec.Header().Get("Content-Disposition"))
		lines := strings.Split(strings.TrimSpace(body(rec)), "\n")
		assert.Equal(t, strings.Join(report.Header([]report.Group{report.GroupDay, report.GroupKey}), ","), lines[0], "day,key by default")
		assert.Equal(t, "day,key_id,requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens,cost_usd,unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors", lines[0])
		assert.Len(t, lines, 1+5, "a row per day and key with requests")

		for _, groupBy := range []string{"day,key", "model", "account,thread"} {
			q := url.Values{"from": window["from"], "to": window["to"], "group_by": {groupBy}, "key": {f.laptop.ID}}
			console := b.get("/admin/usage.csv?" + q.Encode())
			require.Equal(t, http.StatusOK, console.Code, body(console))
			q.Set("format", "csv")
			req := httptest.NewRequest(http.MethodGet, "/api/v1/usage?"+q.Encode(), nil)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			api := httptest.NewRecorder()
			srv.ServeHTTP(api, req)
			require.Equal(t, http.StatusOK, api.Code, api.Body.String())
			assert.Equal(t, api.Body.String(), body(console), "%s: the API's CSV, byte for byte", groupBy)
			assert.Equal(t, api.Header().Get("Content-Disposition"), console.Header().Get("Content-Disposition"))
		}
		rec = b.get("/admin/usage.csv?group_by=model&format=json")
		assert.Equal(t, "text/csv; charset=utf-8", rec.Header().Get("Content-Type"), "always CSV")
		assert.True(t, strings.HasPrefix(body(rec), "model,requests,"), body(rec))

		rec = b.get("/admin/usage.csv?group_by=colour")
		assert.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, body(rec), "group_by: unknown group")
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/html", "a console error is a page")
	})
}

// A key's page shows its limits with their use and edits its limits and
// policy through the API's validation: a refused form is shown again as
// typed with the API's own message, and nothing is saved.
func TestConsoleKeyPage(t *testing.T) {
	eachUsageStore(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedConsoleUsage(t, s)
		srv := consoleUsageServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		list := body(b.get("/admin/keys"))
		assert.Contains(t, list, `<a href="/admin/keys/`+f.laptop.ID+`" class="key-link"><strong>laptop &lt;dev&gt; &amp; co</strong></a>`)
		assert.Contains(t, list, "tokens/5h 100,000, cost_usd/month $5, concurrent 2")

		path := "/admin/keys/" + f.laptop.ID
		rec := b.get(path)
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		page := body(rec)
		assert.Contains(t, page, "<title>Client key laptop &lt;dev&gt; &amp; co · Codex Relay</title>")
		assert.Contains(t, page, "all accounts")
		assert.Contains(t, page, "3,100 of 100,000 tokens used, 0 in flight (3.1%)")
		assert.Contains(t, page, `<span class="gauge-name">tokens/5h</span>`)
		assert.Contains(t, page, "Calendar windows and reset times are in UTC+3.")
		assert.Contains(t, page, "resets in 4h 00m, 2026-11-18 18:30 UTC+3", "the 5h window frees when its one request leaves it")
		assert.Contains(t, page, "\ntokens/5h=100000\ncost_usd/month=5\nconcurrent=2\n</textarea>", "the form holds the limits")
		assert.Contains(t, page, `<option value="" selected>no cap</option>`)
		assert.Contains(t, page, `<option value="allow" selected>allow</option>`)

		// A refused form: the API's message for the same limits, the form as typed.
		typed := "tokens/5h=100000\n# a comment\ntokens/year=5\n"
		rec = b.post(path, url.Values{"limits": {typed}, "model_aliases": {"fast=gpt-5.1-codex-mini"}, "max_reasoning_effort": {"high"},
			"priority_tier": {"refuse"}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		page = body(rec)
		_, apiAnswer, _ := call(t, srv, http.MethodPatch, "/api/v1/keys/"+f.laptop.ID, testAdminToken, map[string]any{
			"limits": []map[string]any{{"metric": "tokens", "window": "5h", "max": 100000}, {"metric": "tokens", "window": "year", "max": 5}}})
		apiMsg := apiAnswer["error"].(map[string]any)["message"].(string)
		assert.Equal(t, "limits: limit 2: window must be one of minute, 5h, day, week, month for tokens", apiMsg)
		assert.Contains(t, page, "Not saved: "+html.EscapeString(apiMsg), "the console's message is the API's")
		assert.Contains(t, page, ">\n"+html.EscapeString(typed)+"</textarea>", "the limits as typed")
		assert.Contains(t, page, ">\nfast=gpt-5.1-codex-mini</textarea>", "the aliases as typed")
		assert.Contains(t, page, `<option value="high" selected>high</option>`)
		assert.Contains(t, page, `<option value="refuse" selected>refuse</option>`)

		for _, bad := range []struct {
			form url.Values
			api  map[string]any // the same change through the API; nil: a console-only syntax error
			msg  string
		}{
			{url.Values{"limits": {"tokens/5h 100"}}, nil, "limits: line 1: write metric/window=max"},
			{url.Values{"limits": {"\ntokens/5h=lots"}}, nil, `limits: line 2: the max &#34;lots&#34; is not a number`},
			{url.Values{"limits": {"concurrent/day=2"}}, map[string]any{"limits": []map[string]any{{"metric": "concurrent", "window": "day", "max": 2}}}, ""},
			{url.Values{"limits": {"tokens/day=1.5"}}, map[string]any{"limits": []map[string]any{{"metric": "tokens", "window": "day", "max": 1.5}}}, ""},
			{url.Values{"model_aliases": {"fast"}}, nil, "model_aliases: line 1: write alias=model"},
			{url.Values{"model_aliases": {"a=b\na=c"}}, nil, "model_aliases: line 2: alias &#34;a&#34; is given twice"},
			{url.Values{"model_aliases": {"x="}}, map[string]any{"model_aliases": map[string]string{"x": ""}}, ""},
			{url.Values{"max_reasoning_effort": {"extreme"}}, map[string]any{"max_reasoning_effort": "extreme"}, ""},
			{url.Values{"priority_tier": {"sometimes"}}, map[string]any{"priority_tier": "sometimes"}, ""},
		} {
			want := bad.msg
			if bad.api != nil {
				code, answer, raw := call(t, srv, http.MethodPatch, "/api/v1/keys/"+f.laptop.ID, testAdminToken, bad.api)
				require.Equal(t, http.StatusBadRequest, code, raw)
				want = html.EscapeString(answer["error"].(map[string]any)["message"].(string))
			}
			for _, k := range []string{"limits", "model_aliases", "max_reasoning_effort", "priority_tier"} {
				if _, ok := bad.form[k]; !ok {
					bad.form.Set(k, map[string]string{"limits": "tokens/5h=100000", "priority_tier": "allow"}[k])
				}
			}
			rec := b.post(path, bad.form)
			assert.Equal(t, http.StatusBadRequest, rec.Code, bad.form)
			assert.Contains(t, body(rec), "Not saved: "+want, bad.form)
		}
		k, err := s.ClientKey(ctx, f.laptop.ID)
		require.NoError(t, err)
		assert.Equal(t, f.laptop.Limits, k.Limits, "nothing refused was saved")

		// Without the CSRF token: refused, nothing saved.
		rec = b.post(path, url.Values{"_csrf": {""}, "limits": {""}})
		assert.Equal(t, http.StatusForbidden, rec.Code)
		k, err = s.ClientKey(ctx, f.laptop.ID)
		require.NoError(t, err)
		assert.Len(t, k.Limits, 3)

		// Saved: limits and policy replaced, audited, shown.
		rec = b.post(path, url.Values{"limits": {"requests/minute=60\r\n\r\ncost_usd/day=2.5\r\n"}, "model_aliases": {"fast = gpt-5.1-codex-mini\n"},
			"max_reasoning_effort": {"medium"}, "priority_tier": {"downgrade"}})
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		assert.Equal(t, path, rec.Header().Get("Location"))
		k, err = s.ClientKey(ctx, f.laptop.ID)
		require.NoError(t, err)
		assert.Equal(t, []budget.Limit{{Metric: budget.Requests, Window: budget.Minute, Max: 60}, {Metric: budget.CostUSD, Window: budget.Day, Max: 2.5}}, k.Limits)
		assert.Equal(t, store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.1-codex-mini"}, MaxReasoningEffort: "medium", PriorityTier: "downgrade"}, k.Policy)
		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "key.update"})
		require.NoError(t, err)
		require.Len(t, entries, 1)
		assert.Equal(t, "key:"+f.laptop.ID, entries[0].Target)
		for _, want := range []string{`→ "requests/minute=60,cost_usd/day=2.5"`, `model_aliases (none) → "fast=gpt-5.1-codex-mini"`,
			`max_reasoning_effort (none) → "medium"`, `priority_tier (none) → "downgrade"`} {
			assert.Contains(t, entries[0].Detail, want, "the audit says what changed, before and after")
		}
		page = body(b.get(path))
		assert.Contains(t, page, "Saved the limits and policy of laptop &lt;dev&gt; &amp; co")
		assert.Contains(t, page, "\nrequests/minute=60\ncost_usd/day=2.5\n</textarea>")
		assert.Contains(t, page, `<code class="alias">fast → gpt-5.1-codex-mini</code>`)
		assert.Contains(t, page, "0 of 60 requests used, 0 in flight (0.0%)", "no request in the last minute")

		// No limits at all: unlimited.
		rec = b.post(path, url.Values{"limits": {""}, "priority_tier": {"allow"}})
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		k, err = s.ClientKey(ctx, f.laptop.ID)
		require.NoError(t, err)
		assert.Empty(t, k.Limits)
		assert.Contains(t, body(b.get(path)), "No limits: the key is unlimited.")

		// A revoked key is shown, not edited.
		_, err = s.RevokeClientKey(ctx, f.ci.ID)
		require.NoError(t, err)
		page = body(b.get("/admin/keys/" + f.ci.ID))
		assert.Contains(t, page, "A revoked key cannot be changed.")
		assert.NotContains(t, page, `name="limits"`)
		rec = b.post("/admin/keys/"+f.ci.ID, url.Values{"limits": {"concurrent=1"}, "priority_tier": {"allow"}})
		assert.Equal(t, http.StatusConflict, rec.Code)
		assert.Contains(t, body(rec), "a revoked key cannot be changed")

		assert.Equal(t, http.StatusNotFound, b.get("/admin/keys/key_nope").Code)
		assert.Equal(t, http.StatusNotFound, b.post("/admin/keys/key_nope", url.Values{"limits": {""}}).Code)
	})
}

// The create-key form takes limits, one a line, validated as the API
// validates them.
func TestConsoleCreateKeyWithLimits(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()
		b.get("/admin/keys")

		typed := "tokens/day=1000\nrequests/fortnight=3\n"
		rec := b.post("/admin/keys", url.Values{"name": {"limited"}, "limits": {typed}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		page := body(rec)
		assert.Contains(t, page, "limits: limit 2: window must be one of minute, 5h, day, week, month for requests")
		assert.Contains(t, page, ">\n"+html.EscapeString(typed)+"</textarea>", "the limits as typed")
		assert.Contains(t, page, `value="limited"`)
		keys, err := s.ClientKeys(ctx)
		require.NoError(t, err)
		assert.Empty(t, keys, "nothing created")

		rec = b.post("/admin/keys", url.Values{"name": {"limited"}, "limits": {"tokens/day=1000\nconcurrent=1"}})
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		assert.Contains(t, body(rec), "Copy it now")
		keys, err = s.ClientKeys(ctx)
		require.NoError(t, err)
		require.Len(t, keys, 1)
		assert.Equal(t, []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 1000}, {Metric: budget.Concurrent, Max: 1}}, keys[0].Limits)
	})
}

// A cost_usd limit over a model the price table does not price warns when
// the key is created and on the key's page, with the model and what the
// limit does about it.
func TestConsoleCostLimitWarning(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()
		b.get("/admin/keys")
		const warning = "the price table does not price gpt-5.5-codex: the cost_usd limit counts its requests at gpt-5.5&#39;s prices"
		rec := b.post("/admin/keys", url.Values{"name": {"capped"}, "models": {"gpt-5.5-codex"}, "limits": {"cost_usd/day=1"}})
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		assert.Contains(t, body(rec), `class="flash flash-warn"`)
		assert.Contains(t, body(rec), warning)
		keys, err := s.ClientKeys(ctx)
		require.NoError(t, err)
		require.Len(t, keys, 1)
		page := body(b.get("/admin/keys/" + keys[0].ID))
		assert.Contains(t, page, warning)

		rec = b.post("/admin/keys", url.Values{"name": {"priced"}, "models": {"gpt-5.4"}, "limits": {"cost_usd/day=1"}})
		require.Equal(t, http.StatusOK, rec.Code, body(rec))
		assert.NotContains(t, body(rec), "flash-warn", "a priced model: no warning")
	})
}

// The requests page filtered by a thread sums the thread: tokens, cost,
// cache-hit rate, time to first token, and the accounts that served it in
// order. The bindings page links a thread to it.
func TestConsoleThreadUsage(t *testing.T) {
	eachUsageStore(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedConsoleUsage(t, s)
		require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "v1:st:s1:th-1", SessionID: "s1", ThreadID: "th-1", AccountID: f.beta.ID,
			Source: "admission", TTL: time.Hour}))
		srv := consoleUsageServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		assert.Contains(t, body(b.get("/admin/bindings")), `<a href="/admin/requests?thread=th-1" class="thread-usage">requests and usage</a>`)

		page := body(b.get("/admin/requests?thread=th-1"))
		assert.Contains(t, page, "Usage of thread")
		for _, c := range [][3]string{
			{"Requests", "3", "0 errors"},
			{"Tokens", "6,400", "in 6,000 (cached 1,500) · out 400 (reasoning 50)"},
			{"Cost", "$0.0360", "US dollars, as priced"},
			{"Cache-hit rate", "25.0%", "of input tokens"},
			{"Time to first token", "300 ms / 1.2 s", "p50 / p95"},
		} {
			assert.Regexp(t, card(c[0], c[1], c[2]), page)
		}
		assert.Contains(t, page, "Prompt caches are per account: a falling cache-hit rate means the thread changed account")
		alpha := strings.Index(page, `<a href="/admin/requests?account=`+f.alpha.ID+`&amp;thread=th-1">alpha</a>`)
		beta := strings.Index(page, `<a href="/admin/requests?account=`+f.beta.ID+`&amp;thread=th-1">beta</a>`)
		require.Positive(t, alpha, "alpha served the thread")
		require.Positive(t, beta, "beta served the thread")
		assert.Less(t, alpha, beta, "alpha first, then beta")
		assert.Contains(t, page, `<td class="num" data-label="Cache hits">50.0%</td>`, "alpha's rate")
		assert.Contains(t, page, `<td class="num" data-label="Cache hits">0.0%</td>`, "beta's rate: the cache stayed behind")

		assert.NotContains(t, body(b.get("/admin/requests")), "Usage of thread", "only for one thread")
	})
}

// The charting library escapes text, and sanitizeSVG keeps only drawing
// markup whatever it is given: no script, no event handler, no link, no
// inline style, text escaped.
func TestSanitizeSVG(t *testing.T) {
	t.Run("library output with hostile labels", func(t *testing.T) {
		opt := charts.NewBarChartOptionWithData([][]float64{{1, 2}, {3, 4}})
		opt.CategoryAxis.Labels = []string{`<script>alert(1)</script>`, `a & b "c"`}
		opt.Legend.SeriesNames = []string{`</text><script>x</script>`, `k&m`}
		p := chartPainter(chartWidth, chartHeight)
		require.NoError(t, p.BarChart(opt))
		raw, err := p.Bytes()
		require.NoError(t, err)
		assert.Contains(t, string(raw), "&lt;script&gt;", "the library escapes < in text")
		assert.Contains(t, string(raw), "a &amp; b", "and &")
		out, err := sanitizeSVG(raw, `chart <"title">`)
		require.NoError(t, err)
		assert.NotContains(t, out, "<script")
		assert.NotContains(t, out, "style=")
		assert.Contains(t, out, "&lt;script&gt;alert(1)&lt;/script&gt;")
		assert.Contains(t, out, "a &amp; b &#34;c&#34;")
		assert.Contains(t, out, "&lt;/text&gt;&lt;script&gt;x&lt;/script&gt;")
		assert.Contains(t, out, `aria-label="chart &lt;&#34;title&#34;&gt;"`)
		assert.Regexp(t, `fill="#[0-9a-f]{6}"`, out, "colours from style declarations, as attributes")
		requireWellFormed(t, out)
	})

	for _, c := range []struct {
		name, in  string
		want, not []string
	}{
		{"script and handlers", `<svg viewBox="0 0 10 10" onload="x()"><script>alert(1)</script><path d="M 0 0 L 1 1" onclick="x()" style="fill:rgb(1,2,3);stroke:rgba(255,0,0,0.5)"/></svg>`,
			[]string{`<path d="M 0 0 L 1 1" fill="#010203" stroke="#ff0000" stroke-opacity="0.5"></path>`}, []string{"script", "onload", "onclick", "alert"}},
		{"foreign content and links", `<svg><foreignObject><div>hi</div></foreignObject><a href="javascript:x()"><text>t</text></a><image href="http://x/y.png"/><text x="1">ok &amp; &lt;b&gt;</text></svg>`,
			[]string{`<text x="1">ok &amp; &lt;b&gt;</text>`}, []string{"foreignObject", "div", "javascript", "image", ">t<"}},
		{"styles and urls", `<svg><style>*{}</style><path d="M0 0" fill="url(#x)" style="fill:url(javascript:x);stroke-width:2;behavior:x"/></svg>`,
			[]string{`<path d="M0 0" stroke-width="2"></path>`}, []string{"url", "<style", "behavior"}},
		{"geometry that is not", `<svg viewBox="0 0 10 10&quot; onload=&quot;x"><path d="M0 0 url(x)" transform="expression(x)" x="1"/></svg>`,
			[]string{`<svg xmlns="http://www.w3.org/2000/svg" role="img"`, `<path x="1"></path>`}, []string{"onload", "url", "expression"}},
		{"nested svg and namespaces", `<svg xmlns:x="urn:x"><svg><text>inner</text></svg><x:text>ns</x:text><g><text>kept</text></g></svg>`,
			[]string{"<g><text>kept</text></g>"}, []string{"inner", "ns<"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := sanitizeSVG([]byte(c.in), "label")
			require.NoError(t, err)
			for _, w := range c.want {
				assert.Contains(t, out, w)
			}
			for _, n := range c.not {
				assert.NotContains(t, out, n)
			}
			requireWellFormed(t, out)
		})
	}
	for _, bad := range []string{"", "<svg>", "<div><p>x</p></div>", "<svg><path></svg>"} {
		_, err := sanitizeSVG([]byte(bad), "label")
		assert.Error(t, err, "%q", bad)
	}
}

func requireWellFormed(t testing.TB, s string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err, s)
	}
}

func FuzzSanitizeSVG(f *testing.F) {
	f.Add(`<svg viewBox="0 0 1 1"><path d="M0 0" style="fill:red"/><text>a&amp;b</text></svg>`)
	f.Add(`<svg><script>x</script><g onload="y"><text>&lt;i&gt;</text></g></svg>`)
	f.Fuzz(func(t *testing.T, in string) {
		out, err := sanitizeSVG([]byte(in), "x")
		if err != nil {
			return
		}
		requireWellFormed(t, out)
		d := xml.NewDecoder(strings.NewReader(out))
		for {
			tok, err := d.Token()
			if errors.Is(err, io.EOF) {
				return
			}
			require.NoError(t, err)
			el, ok := tok.(xml.StartElement)
			if !ok {
				continue
			}
			require.True(t, svgElements[el.Name.Local], "%q kept element %s: %s", in, el.Name.Local, out)
			for _, a := range el.Attr {
				k := a.Name.Local
				if a.Name.Space == "xmlns" || k == "xmlns" {
					k = "xmlns"
				}
				require.True(t, svgGeometry[k] || svgPaint[k] || k == "xmlns" || k == "viewBox" || k == "role" || k == "aria-label",
					"%q kept attribute %s: %s", in, k, out)
				v := strings.ToLower(a.Value)
				for _, n := range []string{"url(", "javascript:", "expression("} {
					require.NotContains(t, v, n, "%q kept %s=%q", in, k, a.Value)
				}
			}
		}
	})
}

// The legend swatches in console.css are the charts' palette, in order.
func TestChartPaletteMatchesStylesheet(t *testing.T) {
	css, err := os.ReadFile("ui/static/console.css")
	require.NoError(t, err)
	for i, c := range seriesColors {
		assert.Regexp(t, `\.swatch\.series-`+strconvItoa(i)+` \{ background: `+c+`; \}`, string(css), "series %d", i)
	}
	assert.NotContains(t, string(css), ".swatch.series-"+strconvItoa(len(seriesColors))+" ", "no swatch beyond the palette")
}

// The page's windows: presets end with today (or this hour) in the
// configured zone; dates are whole days, to included; a day across a
// clock change has its 23 or 25 hours.
func TestUsagePageWindows(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	now := time.Date(2026, 3, 29, 15, 20, 0, 0, berlin) // the day clocks go forward
	for _, c := range []struct {
		query      string
		from, to   time.Time
		hourly     bool
		buckets    int
		firstLabel string
	}{
		{"", time.Date(2026, 3, 23, 0, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), false, 7, "2026-03-23"},
		{"range=30d", time.Date(2026, 2, 28, 0, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), false, 30, "2026-02-28"},
		{"range=24h", time.Date(2026, 3, 28, 15, 0, 0, 0, berlin), time.Date(2026, 3, 29, 16, 0, 0, 0, berlin), true, 24, "2026-03-28T15:00"},
		{"from=2026-03-29&to=2026-03-29", time.Date(2026, 3, 29, 0, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), true, 23, "2026-03-29T00:00"},
		{"from=2026-10-25&to=2026-10-25", time.Date(2026, 10, 25, 0, 0, 0, 0, berlin), time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), true, 24, "2026-10-25T00:00"},
		{"to=2026-01-10", time.Date(2026, 1, 4, 0, 0, 0, 0, berlin), time.Date(2026, 1, 11, 0, 0, 0, 0, berlin), false, 7, "2026-01-04"},
		{"from=2026-01-01&to=2026-01-02&range=30d", time.Date(2026, 1, 1, 0, 0, 0, 0, berlin), time.Date(2026, 1, 3, 0, 0, 0, 0, berlin), true, 48, "2026-01-01T00:00"},
	} {
		t.Run(c.query, func(t *testing.T) {
			e := New(Config{}).echo
			ctx := e.NewContext(httptest.NewRequest(http.MethodGet, "/admin/usage?"+c.query, nil), httptest.NewRecorder())
			q, err := parseUsagePageQuery(ctx, now, berlin)
			require.NoError(t, err)
			assert.True(t, q.From.Equal(c.from), "from %s, want %s", q.From, c.from)
			assert.True(t, q.To.Equal(c.to), "to %s, want %s", q.To, c.to)
			assert.Equal(t, c.hourly, q.hourly())
			g := report.GroupDay
			if q.hourly() {
				g = report.GroupHour
			}
			buckets := usageBuckets(q.From, q.To, g, berlin)
			assert.Len(t, buckets, c.buckets, "%v", buckets)
			assert.Equal(t, c.firstLabel, buckets[0])
		})
	}
}

// Limits and aliases written one a line read back as they were written.
func FuzzParseLimitLines(f *testing.F) {
	f.Add("tokens/5h=2000000\nconcurrent=2\n# note\n\ncost_usd/month=50.5")
	f.Add("requests/minute = 60")
	f.Fuzz(func(t *testing.T, text string) {
		forms, err := ParseLimitLines(text)
		if err != nil {
			return
		}
		ls, err := keyLimits(forms)
		if err != nil {
			return
		}
		again, err := ParseLimitLines(formatLimitLines(ls))
		require.NoError(t, err)
		back, err := keyLimits(again)
		require.NoError(t, err)
		assert.Equal(t, ls, back)
	})
}

// Past the palette's named colours, the groups with the fewest tokens are
// folded into one "other" series, in grey, their sum kept; tokens and cost
// keep the same series in the same order.
func TestGroupSeriesFoldsOthers(t *testing.T) {
	index := map[string]int{"2026-11-17": 0, "2026-11-18": 1}
	var rows []report.Row
	for i := range 10 {
		rows = append(rows, report.Row{Values: []string{"2026-11-18", "k" + strconvItoa(i)}, TotalTokens: int64(1000 - 10*i), CostNanos: int64(i)})
	}
	rows = append(rows, report.Row{Values: []string{"2026-11-17", "k9"}, TotalTokens: 5})
	tokens, cost := groupSeries(rows, index, 2, "key", func(v string) string { return "name " + v })
	require.Len(t, tokens, len(seriesColors))
	require.Len(t, cost, len(seriesColors))
	for i := range otherSeries {
		assert.Equal(t, "name k"+strconvItoa(i), tokens[i].Name, "most tokens first")
		assert.Equal(t, i, tokens[i].Color)
		assert.Equal(t, tokens[i].Name, cost[i].Name)
	}
	other := tokens[otherSeries]
	assert.Equal(t, "3 other keys", other.Name)
	assert.Equal(t, otherSeries, other.Color)
	assert.Equal(t, []float64{5, 930 + 920 + 910}, other.Values, "k7, k8 and k9 summed, day by day")
	assert.InDelta(t, (7+8+9)/1e9, cost[otherSeries].Values[1], 1e-15)

	// Exactly one group more than the named colours: no "other" of one.
	tokens, _ = groupSeries(rows[:len(seriesColors)], index, 2, "key", func(v string) string { return v })
	assert.Equal(t, "k7", tokens[otherSeries].Name)
}

func TestMillisPair(t *testing.T) {
	ms := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		p50, p95 *int64
		want     string
	}{
		{ms(16), ms(40), "16 / 40 ms"},
		{ms(300), ms(1200), "300 ms / 1.2 s"},
		{ms(1200), ms(4500), "1.2 / 4.5 s"},
		{nil, nil, "— / —"},
	} {
		assert.Equal(t, c.want, millisPair(c.p50, c.p95))
	}
}

// A window with requests but no cost says why, and the cost card counts
// what was not priced by an entry of its own.
func TestUsageCostExplained(t *testing.T) {
	for _, c := range []struct {
		name              string
		row               report.Row
		empty, note, tone string
	}{
		{"no usage reported", report.Row{Requests: 3}, "reported token usage, so none has a cost", "US dollars, as priced", ""},
		{"unpriced, no fallback", report.Row{Requests: 3, TotalTokens: 900, UnpricedRequests: 3},
			"no fallback model to price them at", "3 unpriced: the price table has no entry for their model", "warn"},
		{"free in the table", report.Row{Requests: 3, TotalTokens: 900}, "at prices of $0", "US dollars, as priced", ""},
		{"some at the fallback", report.Row{Requests: 3, TotalTokens: 900, CostNanos: 5_000, UnpricedRequests: 1},
			"", "1 unpriced: the price table has no entry for their model", "warn"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.empty != "" {
				assert.Contains(t, costEmpty(c.row), c.empty)
			}
			card := costCard(c.row)
			assert.Contains(t, card.Note, c.note)
			assert.Equal(t, c.tone, card.Tone)
		})
	}
}

// The Usage page of a window whose requests used tokens the price table
// (saved with no fallback) could not price says so where the cost chart
// would be, and the cost card counts them.
func TestConsoleUsageUnpricedWindow(t *testing.T) {
	eachUsageStore(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		_, err := s.SavePriceTable(ctx, pricing.Table{Entries: []pricing.Entry{{Model: "gpt-5.4", Tier: pricing.TierDefault, Input: 1}}}, "api")
		require.NoError(t, err)
		for i := range 2 {
			require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ID: "req_x" + strconvItoa(i), Transport: "http", Path: "/v1/responses",
				Status: 200, Charged: true, Model: "my-model", StartedAt: consoleUsageNow.Add(-time.Hour), InputTokens: 100, TotalTokens: 100,
				Unpriced: true}, nil))
		}
		srv := consoleUsageServer(t, s)
		b := newBrowser(t, srv)
		b.login()
		page := body(b.get("/admin/usage"))
		assert.Regexp(t, card("Cost", "$0", "2 unpriced: the price table has no entry for their model (Settings → Prices)"), page)
		assert.Contains(t, figures(t, page)["cost"], "no fallback model to price them at")
		assert.NotContains(t, page, "Nothing was priced in this window.")
	})
}
