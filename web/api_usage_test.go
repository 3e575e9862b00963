package web

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// usageNow is the clock of the usage tests' server.
var usageNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func newUsageServer(t *testing.T, s *store.Store, loc *time.Location) *Server {
	return New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Location: loc,
		Now: func() time.Time { return usageNow }})
}

// getUsage sends GET /api/v1/usage?query with the admin token and extra
// headers (name, value pairs).
func getUsage(t *testing.T, h http.Handler, query string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/api/v1/usage?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// usageRows decodes a JSON answer's rows, requiring a 200.
func usageRows(t *testing.T, rec *httptest.ResponseRecorder) []map[string]any {
	t.Helper()
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json"), rec.Header().Get("Content-Type"))
	var out struct {
		Rows []map[string]any `json:"rows"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
	require.NotNil(t, out.Rows, "rows is a list, never null: %s", rec.Body.String())
	return out.Rows
}

// column lists one column of rows.
func column(rows []map[string]any, name string) []any {
	out := make([]any, len(rows))
	for i, r := range rows {
		out[i] = r[name]
	}
	return out
}

// seedUsage logs a few requests around usageNow: two keys, two accounts,
// a model asked under an alias, one refused request, one outside the
// default window.
func seedUsage(t *testing.T, s *store.Store) {
	t.Helper()
	ctx := context.Background()
	day1 := time.Date(2026, 11, 30, 20, 0, 0, 0, time.UTC) // 2026-12-01 01:30 in Kolkata
	day2 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, r := range []store.RequestRecord{
		{ClientKeyID: "key_a", AccountID: "acc_1", ThreadID: "t1", Model: "alias", ModelServed: "gpt-5.5", Status: 200,
			StartedAt: day1, InputTokens: 1000, CachedTokens: 250, OutputTokens: 100, ReasoningTokens: 40, TotalTokens: 1100,
			CostNanos: 1_500_000_000, Charged: true, FirstOutput: 300 * time.Millisecond},
		{ClientKeyID: "key_a", AccountID: "acc_2", ThreadID: "t2", Model: "gpt-5.4", ModelServed: "gpt-5.4", Status: 200,
			StartedAt: day2, InputTokens: 500, OutputTokens: 50, TotalTokens: 550, CostNanos: 250_000_001, Charged: true,
			FirstOutput: 100 * time.Millisecond},
		{ClientKeyID: "key_b", AccountID: "acc_1", ThreadID: "=cmd|' /C calc'!A0", Model: "gpt-5.5", ModelServed: "gpt-5.5",
			Status: 200, StartedAt: day2.Add(time.Hour), InputTokens: 200, CachedTokens: 200, OutputTokens: 20,
			TotalTokens: 220, CostNanos: 1, Charged: true, Unpriced: true, FirstOutput: 200 * time.Millisecond},
		{ClientKeyID: "key_b", ThreadID: "t3", Model: "gpt-5.4", Status: 429, ErrorCode: "usage_limit_reached",
			StartedAt: day2.Add(2 * time.Hour)},
		// Older than the default 30 days.
		{ClientKeyID: "key_a", AccountID: "acc_1", ThreadID: "t_old", Model: "gpt-5.5", Status: 200,
			StartedAt: usageNow.Add(-31 * 24 * time.Hour), InputTokens: 7, TotalTokens: 7},
	} {
		r.Transport, r.Path = "http", "/v1/responses"
		require.NoError(t, s.RecordRequest(ctx, r, nil))
	}
}

func TestUsageAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		seedUsage(t, s)
		srv := newUsageServer(t, s, time.UTC)

		t.Run("totals", func(t *testing.T) {
			rec := getUsage(t, srv, "")
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.JSONEq(t, `{"rows":[{"requests":4,"input_tokens":1700,"cached_input_tokens":450,"output_tokens":170,
				"reasoning_tokens":40,"total_tokens":1870,"cost_usd":1.750000002,"unpriced_requests":1,"cache_hit_rate":0.2647058823529412,
				"ttft_p50_ms":200,"ttft_p95_ms":300,"errors":1,"errors_by_class":{"usage_limit_reached":1}}]}`, rec.Body.String())
		})

		t.Run("by key, exact shape", func(t *testing.T) {
			rec := getUsage(t, srv, "group_by=key")
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.JSONEq(t, `{"rows":[
				{"key_id":"key_a","requests":2,"input_tokens":1500,"cached_input_tokens":250,"output_tokens":150,
				 "reasoning_tokens":40,"total_tokens":1650,"cost_usd":1.750000001,"unpriced_requests":0,"cache_hit_rate":0.16666666666666666,
				 "ttft_p50_ms":100,"ttft_p95_ms":300,"errors":0,"errors_by_class":{}},
				{"key_id":"key_b","requests":2,"input_tokens":200,"cached_input_tokens":200,"output_tokens":20,
				 "reasoning_tokens":0,"total_tokens":220,"cost_usd":0.000000001,"unpriced_requests":1,"cache_hit_rate":1,
				 "ttft_p50_ms":200,"ttft_p95_ms":200,"errors":1,"errors_by_class":{"usage_limit_reached":1}}]}`, rec.Body.String())
		})

		for _, tc := range []struct {
			query   string
			columns []string
			want    [][]any // per column, its values down the rows
		}{
			{"group_by=account", []string{"account_id"}, [][]any{{"", "acc_1", "acc_2"}}},
			{"group_by=model", []string{"model"}, [][]any{{"gpt-5.4", "gpt-5.5"}}},
			{"group_by=thread", []string{"thread"}, [][]any{{"=cmd|' /C calc'!A0", "t1", "t2", "t3"}}},
			{"group_by=day", []string{"day"}, [][]any{{"2026-11-30", "2026-12-01"}}},
			{"group_by=hour", []string{"hour"}, [][]any{{"2026-11-30T20:00", "2026-12-01T10:00", "2026-12-01T11:00", "2026-12-01T12:00"}}},
			{"group_by=key,model", []string{"key_id", "model"}, [][]any{{"key_a", "key_a", "key_b", "key_b"}, {"gpt-5.4", "gpt-5.5", "gpt-5.4", "gpt-5.5"}}},
			{"group_by=model,key", []string{"model", "key_id"}, [][]any{{"gpt-5.4", "gpt-5.4", "gpt-5.5", "gpt-5.5"}, {"key_a", "key_b", "key_a", "key_b"}}},
			{"group_by=day,account", []string{"day", "account_id"}, [][]any{{"2026-11-30", "2026-12-01", "2026-12-01", "2026-12-01"}, {"acc_1", "", "acc_1", "acc_2"}}},
		} {
			t.Run(tc.query, func(t *testing.T) {
				rows := usageRows(t, getUsage(t, srv, tc.query))
				for i, col := range tc.columns {
					assert.Equal(t, tc.want[i], column(rows, col), col)
				}
				for _, r := range rows {
					assert.Len(t, r, len(tc.columns)+13, "only the group columns asked for: %v", r)
				}
			})
		}

		for _, tc := range []struct {
			query    string
			requests float64
		}{
			{"key=key_b", 2},
			{"account=acc_1", 2},
			{"model=gpt-5.5", 2},
			{"model=alias", 1},
			{"thread=t2", 1},
			{"key=key_a&account=acc_2", 1},
			{"key=key_none", 0},
			{"from=2026-12-01", 3},
			{"from=2026-12-01T10:00:00Z&to=2026-12-01T11:00:00Z", 1},
			{"to=2026-12-01T10:00:00Z", 1},
			{"from=2026-12-01T15:30:00%2B05:30", 3}, // 10:00 UTC: from is inclusive
			{"from=2026-12-01T15:30:00+05:30", 3},   // the + arrived as a space
			{"from=" + strconv.FormatInt(time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC).Unix(), 10), 2},
			{"from=2026-10-01", 5},               // the old request too
			{"from=2026-10-01&to=2026-11-30", 1}, // to is exclusive (midnight)
		} {
			t.Run(tc.query, func(t *testing.T) {
				rows := usageRows(t, getUsage(t, srv, tc.query))
				require.Len(t, rows, 1, "totals")
				assert.Equal(t, tc.requests, rows[0]["requests"])
			})
		}
	})
}

// Days and hours are the configured zone's, and so are the dates of from
// and to.
func TestUsageAPITimeZone(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	seedUsage(t, s)
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	srv := newUsageServer(t, s, kolkata)
	rows := usageRows(t, getUsage(t, srv, "group_by=day"))
	assert.Equal(t, []any{"2026-12-01"}, column(rows, "day"), "20:00 UTC is 01:30 the next day in Kolkata")
	rows = usageRows(t, getUsage(t, srv, "group_by=hour"))
	assert.Equal(t, []any{"2026-12-01T01:00", "2026-12-01T15:00", "2026-12-01T16:00", "2026-12-01T17:00"}, column(rows, "hour"))
	// 2026-12-01 in Kolkata starts at 2026-11-30T18:30Z.
	rows = usageRows(t, getUsage(t, srv, "from=2026-12-01&to=2026-12-02"))
	assert.Equal(t, float64(4), rows[0]["requests"])
	rows = usageRows(t, getUsage(t, srv, "from=2026-12-01T01:00:00%2B05:30&to=2026-12-01T02:00:00%2B05:30&group_by=hour"))
	assert.Equal(t, []any{"2026-12-01T01:00"}, column(rows, "hour"))

	rec := getUsage(t, srv, "from=2026-12-01&to=2026-12-02&format=csv")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `attachment; filename="usage-2026-12-01-2026-12-02.csv"`, rec.Header().Get("Content-Disposition"),
		"dates in the zone")
}

func TestUsageAPICSV(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	seedUsage(t, s)
	srv := newUsageServer(t, s, time.UTC)
	const header = "thread,key_id,requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens," +
		"cost_usd,unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors"
	for _, tc := range []struct {
		name    string
		query   string
		headers []string
	}{
		{"format=csv", "group_by=thread,key&format=csv", nil},
		{"Accept", "group_by=thread,key", []string{"Accept", "text/csv"}},
		{"Accept among others", "group_by=thread,key", []string{"Accept", "application/json;q=0.5, text/csv"}},
		{"format wins over Accept", "group_by=thread,key&format=CSV", []string{"Accept", "application/json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := getUsage(t, srv, tc.query, tc.headers...)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.Equal(t, "text/csv; charset=utf-8", rec.Header().Get("Content-Type"))
			assert.Equal(t, `attachment; filename="usage-2026-11-02T120000-2026-12-02T120100.csv"`,
				rec.Header().Get("Content-Disposition"), "named after the default window")
			body := rec.Body.String()
			assert.True(t, strings.HasPrefix(body, header+"\n"), body)
			recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
			require.NoError(t, err)
			require.Len(t, recs, 5)
			assert.Equal(t, []string{"'=cmd|' /C calc'!A0", "key_b", "1", "200", "200", "20", "0", "220", "0.000000001", "1", "1", "200", "200", "0"},
				recs[1], "a formula-looking thread id is defused")
			assert.Equal(t, []string{"t1", "key_a", "1", "1000", "250", "100", "40", "1100", "1.5", "0", "0.25", "300", "300", "0"}, recs[2])
			assert.Equal(t, []string{"t3", "key_b", "1", "0", "0", "0", "0", "0", "0", "0", "0", "", "", "1"}, recs[4])
		})
	}

	rec := getUsage(t, srv, "", "Accept", "text/csv;q=0, application/json")
	assert.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json"), "q=0 refuses CSV")
	rec = getUsage(t, srv, "format=json", "Accept", "text/csv")
	assert.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json"), "format=json wins")

	rec = getUsage(t, srv, "format=csv&from=1796083200&to=2026-12-01T10:30:00Z")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `attachment; filename="usage-2026-12-01-2026-12-01T103000.csv"`, rec.Header().Get("Content-Disposition"))
	assert.Equal(t, "requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens,cost_usd,"+
		"unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors\n1,500,0,50,0,550,0.250000001,0,0,100,100,0\n", rec.Body.String())
}

// Bad parameters are a 400 naming the parameter, also when CSV was asked.
func TestUsageAPIBadParameters(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newUsageServer(t, s, time.UTC)
	for _, tc := range []struct {
		query string
		field string
	}{
		{"group_by=week", "group_by"},
		{"group_by=key_id", "group_by"},
		{"group_by=key,key", "group_by"},
		{"group_by=key,", "group_by"},
		{"from=yesterday", "from"},
		{"from=2026-13-01", "from"},
		{"from=2026-12-01T10:00:00", "from"}, // no offset
		{"from=-5", "from"},
		{"from=1e9", "from"},
		{"to=99999999999999", "to"},
		{"to=9223372036854775807", "to"},
		{"to=9223372036854775808", "to"},
		{"to=2026/12/01", "to"},
		{"from=2026-12-01&to=2026-12-01", "to"},
		{"from=2026-12-02&to=2026-12-01", "to"},
		{"from=2026-12-03", "to"}, // after the default to
		{"format=xml", "format"},
		{"format=csv&group_by=week", "group_by"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			rec := getUsage(t, srv, tc.query)
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			var body map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
			code, field := errorOf(t, body)
			assert.Equal(t, "invalid_field", code)
			assert.Equal(t, tc.field, field)
		})
	}
	rec := getUsage(t, srv, "group_by=week")
	assert.Contains(t, rec.Body.String(), `group_by: unknown group \"week\"`)
}

func TestUsageAPINeedsTheAdminToken(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	seedUsage(t, s)
	srv := newUsageServer(t, s, time.UTC)
	for _, token := range []string{"", "wrong"} {
		code, body, raw := call(t, srv, http.MethodGet, "/api/v1/usage?"+url.Values{"format": {"csv"}}.Encode(), token, nil)
		assert.Equal(t, http.StatusUnauthorized, code)
		c, _ := errorOf(t, body)
		assert.Equal(t, "unauthorized", c)
		assert.NotContains(t, raw, "key_a")
	}
}

// The window's bounds and the Accept header come from outside.
func FuzzUsageParameters(f *testing.F) {
	for _, s := range []string{"2026-12-01", "2026-12-01T10:00:00Z", "2026-12-01T10:00:00 05:30", "1796083200", "0",
		"9223372036854775807", "-1", "text/csv;q=0.5, */*", "text/csv;q=x"} {
		f.Add(s)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, s string) {
		for _, loc := range []*time.Location{time.UTC, kolkata} {
			if at, ok := parseReportTime(s, loc); ok {
				assert.False(t, at.Before(minReportTime) || at.After(maxReportTime), "%q gave %v", s, at)
				back := time.UnixMilli(at.UnixMilli())
				assert.True(t, !back.After(at) && at.Sub(back) < time.Millisecond, "%v fits the log's unix milliseconds", at)
			}
		}
		_ = acceptsCSV([]string{s})
	})
}
