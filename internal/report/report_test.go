package report_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/report"
	"github.com/codexrelay/codex-relay/internal/store"
)

func ms(v int64) *int64 { return &v }

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func aggregate(rows []store.UsageRow, groups []report.Group, loc *time.Location) []report.Row {
	return report.Aggregate(slices.Values(rows), groups, loc)
}

// values lists each row's group values joined by "|".
func values(rows []report.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = strings.Join(r.Values, "|")
	}
	return out
}

func TestParseGroups(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    []report.Group
		wantErr string
	}{
		{"", nil, ""},
		{"  ", nil, ""},
		{"key", []report.Group{report.GroupKey}, ""},
		{"account", []report.Group{report.GroupAccount}, ""},
		{"model", []report.Group{report.GroupModel}, ""},
		{"thread", []report.Group{report.GroupThread}, ""},
		{"day", []report.Group{report.GroupDay}, ""},
		{"hour", []report.Group{report.GroupHour}, ""},
		{"model,key", []report.Group{report.GroupModel, report.GroupKey}, ""},
		{" day , account ", []report.Group{report.GroupDay, report.GroupAccount}, ""},
		{"key,account,model,thread,day,hour", []report.Group{report.GroupKey, report.GroupAccount, report.GroupModel,
			report.GroupThread, report.GroupDay, report.GroupHour}, ""},
		{"week", nil, `unknown group "week"`},
		{"key_id", nil, `unknown group "key_id"`},
		{"Key", nil, `unknown group "Key"`},
		{"key,", nil, "empty name"},
		{"key,,model", nil, "empty name"},
		{"key,model,key", nil, `"key" is given twice`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := report.ParseGroups(tc.in)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestGroupColumns(t *testing.T) {
	t.Parallel()
	groups, err := report.ParseGroups("key,account,model,thread,day,hour")
	require.NoError(t, err)
	assert.Equal(t, []string{"key_id", "account_id", "model", "thread", "day", "hour", "requests", "input_tokens",
		"cached_input_tokens", "output_tokens", "reasoning_tokens", "total_tokens", "cost_usd", "unpriced_requests", "cache_hit_rate",
		"ttft_p50_ms", "ttft_p95_ms", "errors"}, report.Header(groups))
}

// A small log: two keys, two accounts, three models (one asked under an
// alias the upstream resolved), over two UTC days.
func sampleRows() []store.UsageRow {
	d1 := time.Date(2026, 11, 30, 10, 15, 0, 0, time.UTC)
	d2 := time.Date(2026, 12, 1, 9, 5, 0, 0, time.UTC)
	return []store.UsageRow{
		{StartedAt: d1, KeyID: "key_b", AccountID: "acc_1", ThreadID: "t1", Model: "alias", ModelServed: "gpt-5.5",
			Status: 200, InputTokens: 100, CachedTokens: 50, OutputTokens: 10, ReasoningTokens: 2, TotalTokens: 110,
			CostNanos: 1_000, FirstOutputMS: ms(300)},
		{StartedAt: d1.Add(time.Minute), KeyID: "key_a", AccountID: "acc_2", ThreadID: "t2", Model: "gpt-5.4",
			ModelServed: "gpt-5.4", Status: 200, InputTokens: 200, OutputTokens: 20, TotalTokens: 220, CostNanos: 2_000,
			FirstOutputMS: ms(100)},
		{StartedAt: d2, KeyID: "key_a", AccountID: "acc_1", ThreadID: "t1", Model: "gpt-5.5", ModelServed: "gpt-5.5",
			Status: 200, InputTokens: 300, CachedTokens: 300, OutputTokens: 30, ReasoningTokens: 5, TotalTokens: 330,
			CostNanos: 3_000, FirstOutputMS: ms(200)},
		// No upstream answered: the model asked stands, no tokens, an error.
		{StartedAt: d2.Add(time.Hour), KeyID: "key_b", AccountID: "", ThreadID: "t3", Model: "gpt-5.4",
			Status: 429, ErrorCode: "usage_limit_reached"},
	}
}

func TestAggregateGroups(t *testing.T) {
	t.Parallel()
	rows := sampleRows()
	for _, tc := range []struct {
		groups   string
		want     []string // group values, in order
		requests []int64
		input    []int64
	}{
		{"", []string{""}, []int64{4}, []int64{600}},
		{"key", []string{"key_a", "key_b"}, []int64{2, 2}, []int64{500, 100}},
		{"account", []string{"", "acc_1", "acc_2"}, []int64{1, 2, 1}, []int64{0, 400, 200}},
		{"model", []string{"gpt-5.4", "gpt-5.5"}, []int64{2, 2}, []int64{200, 400}},
		{"thread", []string{"t1", "t2", "t3"}, []int64{2, 1, 1}, []int64{400, 200, 0}},
		{"day", []string{"2026-11-30", "2026-12-01"}, []int64{2, 2}, []int64{300, 300}},
		{"hour", []string{"2026-11-30T10:00", "2026-12-01T09:00", "2026-12-01T10:00"}, []int64{2, 1, 1}, []int64{300, 300, 0}},
		{"key,model", []string{"key_a|gpt-5.4", "key_a|gpt-5.5", "key_b|gpt-5.4", "key_b|gpt-5.5"},
			[]int64{1, 1, 1, 1}, []int64{200, 300, 0, 100}},
		{"model,key", []string{"gpt-5.4|key_a", "gpt-5.4|key_b", "gpt-5.5|key_a", "gpt-5.5|key_b"},
			[]int64{1, 1, 1, 1}, []int64{200, 0, 300, 100}},
		{"day,account", []string{"2026-11-30|acc_1", "2026-11-30|acc_2", "2026-12-01|", "2026-12-01|acc_1"},
			[]int64{1, 1, 1, 1}, []int64{100, 200, 0, 300}},
	} {
		t.Run(tc.groups, func(t *testing.T) {
			t.Parallel()
			groups, err := report.ParseGroups(tc.groups)
			require.NoError(t, err)
			got := aggregate(rows, groups, time.UTC)
			assert.Equal(t, tc.want, values(got))
			var requests, input []int64
			for _, r := range got {
				requests = append(requests, r.Requests)
				input = append(input, r.InputTokens)
				assert.Equal(t, groups, r.Groups)
			}
			assert.Equal(t, tc.requests, requests)
			assert.Equal(t, tc.input, input)
		})
	}
}

// The order of the rows depends on their group values only, never on the
// order the requests came in (nor on map iteration).
func TestAggregateOrderIsDeterministic(t *testing.T) {
	t.Parallel()
	var rows []store.UsageRow
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 200 {
		rows = append(rows, store.UsageRow{StartedAt: start.Add(time.Duration(i*7) * time.Hour),
			KeyID: []string{"k2", "k10", "k1"}[i%3], ThreadID: string(rune('a' + i%5)), Status: 200})
	}
	groups := []report.Group{report.GroupKey, report.GroupThread, report.GroupDay}
	got := aggregate(rows, groups, time.UTC)
	require.NotEmpty(t, got)
	assert.True(t, slices.IsSortedFunc(got, func(a, b report.Row) int { return slices.Compare(a.Values, b.Values) }),
		"ascending by key, then thread, then day")
	want := values(got)
	assert.Equal(t, "k1", strings.Split(want[0], "|")[0], "text order: k1 < k10 < k2")
	r := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		r.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		assert.Equal(t, want, values(aggregate(rows, groups, time.UTC)))
	}
}

// Days and hours are the configured zone's, also across a clock change.
func TestDaysAndHoursInTheZone(t *testing.T) {
	t.Parallel()
	kolkata := mustZone(t, "Asia/Kolkata") // +05:30, no DST
	newYork := mustZone(t, "America/New_York")
	at := func(s string) store.UsageRow {
		ts, err := time.Parse(time.RFC3339, s)
		require.NoError(t, err)
		return store.UsageRow{StartedAt: ts.UTC(), Status: 200, InputTokens: 1}
	}
	for _, tc := range []struct {
		name  string
		loc   *time.Location
		group report.Group
		rows  []store.UsageRow
		want  []string
		reqs  []int64
	}{
		{"kolkata day starts at 18:30 UTC", kolkata, report.GroupDay,
			[]store.UsageRow{at("2026-11-30T18:29:59Z"), at("2026-11-30T18:30:00Z"), at("2026-12-01T18:29:00Z")},
			[]string{"2026-11-30", "2026-12-01"}, []int64{1, 2}},
		{"kolkata hours are on the half hour in UTC", kolkata, report.GroupHour,
			[]store.UsageRow{at("2026-11-30T18:29:59Z"), at("2026-11-30T18:30:00Z"), at("2026-11-30T19:29:59Z"), at("2026-11-30T19:30:00Z")},
			[]string{"2026-11-30T23:00", "2026-12-01T00:00", "2026-12-01T01:00"}, []int64{1, 2, 1}},
		{"utc for comparison", time.UTC, report.GroupDay,
			[]store.UsageRow{at("2026-11-30T18:29:59Z"), at("2026-11-30T18:30:00Z"), at("2026-12-01T18:29:00Z")},
			[]string{"2026-11-30", "2026-12-01"}, []int64{2, 1}},
		// 2026-03-08: clocks go from 02:00 EST to 03:00 EDT; there is no 02:00 hour.
		{"new york spring forward", newYork, report.GroupHour,
			[]store.UsageRow{at("2026-03-08T06:30:00Z"), at("2026-03-08T07:00:00Z"), at("2026-03-08T07:30:00Z")},
			[]string{"2026-03-08T01:00", "2026-03-08T03:00"}, []int64{1, 2}},
		// 2026-11-01: clocks go from 02:00 EDT back to 01:00 EST: the 01:00
		// hour happens twice and is one row, in time order among the others.
		{"new york fall back", newYork, report.GroupHour,
			[]store.UsageRow{at("2026-11-01T04:59:00Z"), at("2026-11-01T05:10:00Z"), at("2026-11-01T06:10:00Z"), at("2026-11-01T07:00:00Z")},
			[]string{"2026-11-01T00:00", "2026-11-01T01:00", "2026-11-01T02:00"}, []int64{1, 2, 1}},
		// The day of the fall-back change has 25 hours, all of them in it.
		{"new york 25-hour day", newYork, report.GroupDay,
			[]store.UsageRow{at("2026-11-01T03:59:00Z"), at("2026-11-01T04:00:00Z"), at("2026-11-02T04:59:00Z"), at("2026-11-02T05:00:00Z")},
			[]string{"2026-10-31", "2026-11-01", "2026-11-02"}, []int64{1, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := aggregate(tc.rows, []report.Group{tc.group}, tc.loc)
			assert.Equal(t, tc.want, values(got))
			var reqs []int64
			for _, r := range got {
				reqs = append(reqs, r.Requests)
			}
			assert.Equal(t, tc.reqs, reqs)
		})
	}
}

func TestCacheHitRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		input, cached int64
		want          float64
	}{
		{"no input", 0, 0, 0},
		{"none cached", 100, 0, 0},
		{"quarter", 400, 100, 0.25},
		{"all", 300, 300, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, report.Row{InputTokens: tc.input, CachedInputTokens: tc.cached}.CacheHitRate())
		})
	}
	got := aggregate(sampleRows(), []report.Group{report.GroupAccount}, time.UTC)
	require.Len(t, got, 3)
	assert.Equal(t, 0.0, got[0].CacheHitRate(), "no input")
	assert.Equal(t, 350.0/400.0, got[1].CacheHitRate(), "sums first, then divides")
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	seq := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(i+1) * 10
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		sorted []int64
		p      int
		want   int64
	}{
		{"one value p50", []int64{7}, 50, 7},
		{"one value p95", []int64{7}, 95, 7},
		{"two values p50 is the lower", []int64{1, 9}, 50, 1},
		{"two values p95 is the upper", []int64{1, 9}, 95, 9},
		{"four values p50: rank 2", seq(4), 50, 20},
		{"five values p50: rank 3", seq(5), 50, 30},
		{"twenty values p95: rank 19", seq(20), 95, 190},
		{"twenty-one values p95: rank 20", seq(21), 95, 200},
		{"hundred values p95: rank 95", seq(100), 95, 950},
		{"hundred values p100", seq(100), 100, 1000},
		{"p1 of hundred", seq(100), 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := report.Percentile(tc.sorted, tc.p)
			assert.True(t, ok)
			assert.Equal(t, tc.want, got)
		})
	}
	_, ok := report.Percentile(nil, 50)
	assert.False(t, ok)
}

func TestTimeToFirstToken(t *testing.T) {
	t.Parallel()
	var rows []store.UsageRow
	// 1..20 in a scrambled order, and rows without output that do not count.
	for _, v := range []int64{13, 2, 20, 7, 1, 19, 4, 16, 11, 8, 3, 18, 6, 15, 10, 5, 17, 9, 14, 12} {
		rows = append(rows, store.UsageRow{Status: 200, FirstOutputMS: ms(v * 10)})
		rows = append(rows, store.UsageRow{Status: 200})
	}
	got := aggregate(rows, nil, time.UTC)
	require.Len(t, got, 1)
	require.NotNil(t, got[0].TTFTP50MS)
	require.NotNil(t, got[0].TTFTP95MS)
	assert.Equal(t, int64(100), *got[0].TTFTP50MS, "rank 10 of 20")
	assert.Equal(t, int64(190), *got[0].TTFTP95MS, "rank 19 of 20")
	assert.Equal(t, int64(40), got[0].Requests)

	none := aggregate([]store.UsageRow{{Status: 499}}, nil, time.UTC)
	assert.Nil(t, none[0].TTFTP50MS, "no output: no percentile")
	assert.Nil(t, none[0].TTFTP95MS)

	// Per group, over the group's own samples.
	byKey := aggregate(sampleRows(), []report.Group{report.GroupKey}, time.UTC)
	require.Len(t, byKey, 2)
	assert.Equal(t, int64(100), *byKey[0].TTFTP50MS)
	assert.Equal(t, int64(200), *byKey[0].TTFTP95MS)
	assert.Equal(t, int64(300), *byKey[1].TTFTP50MS, "key_b's second request had no output")
}

func TestErrors(t *testing.T) {
	t.Parallel()
	rows := []store.UsageRow{
		{Status: 200},
		{Status: 200, ErrorCode: "stream_interrupted"}, // an error after the answer began
		{Status: 429, ErrorCode: "usage_limit_reached"},
		{Status: 429, ErrorCode: "usage_limit_reached"},
		{Status: 502}, // no code: counted under its status
		{Status: 499}, // the client went away
		{Status: 399}, // not an error
		{Status: 400}, // the first error status
		{Status: 409, ErrorCode: "continuity_owner_conflict"},
	}
	got := aggregate(rows, nil, time.UTC)
	require.Len(t, got, 1)
	assert.Equal(t, int64(7), got[0].Errors)
	assert.Equal(t, map[string]int64{"stream_interrupted": 1, "usage_limit_reached": 2, "http_502": 1, "http_499": 1,
		"http_400": 1, "continuity_owner_conflict": 1}, got[0].ErrorsByClass)
	var sum int64
	for _, n := range got[0].ErrorsByClass {
		sum += n
	}
	assert.Equal(t, got[0].Errors, sum, "the classes add up to the errors")
}

// Sums stay int64 until written: no float drift in tokens or cost.
func TestExactSums(t *testing.T) {
	t.Parallel()
	big := int64(1)<<53 + 1 // not representable as a float64
	rows := []store.UsageRow{
		{Status: 200, InputTokens: big, TotalTokens: big, CostNanos: 100_000_000},
		{Status: 200, InputTokens: 2, TotalTokens: 2, CostNanos: 200_000_000},
	}
	for range 10 {
		rows = append(rows, store.UsageRow{Status: 200, CostNanos: 1}) // 0.000000001 each
	}
	got := aggregate(rows, nil, time.UTC)
	require.Len(t, got, 1)
	assert.Equal(t, big+2, got[0].InputTokens)
	assert.Equal(t, int64(300_000_010), got[0].CostNanos)
	raw, err := json.Marshal(got[0])
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"input_tokens":9007199254740995,`)
	assert.Contains(t, string(raw), `"cost_usd":0.30000001,`, "0.1 + 0.2 + 10 nano-dollars, exactly")
	var buf bytes.Buffer
	require.NoError(t, report.WriteCSV(&buf, nil, got))
	assert.Contains(t, buf.String(), "\n12,9007199254740995,0,0,0,9007199254740995,0.30000001,0,0,,,0\n")
}

// The JSON of a row is the contract's, field for field.
func TestRowJSON(t *testing.T) {
	t.Parallel()
	rows := aggregate(sampleRows(), []report.Group{report.GroupKey, report.GroupModel}, time.UTC)
	raw, err := json.Marshal(map[string]any{"rows": rows})
	require.NoError(t, err)
	assert.JSONEq(t, `{"rows":[
		{"key_id":"key_a","model":"gpt-5.4","requests":1,"input_tokens":200,"cached_input_tokens":0,"output_tokens":20,
		 "reasoning_tokens":0,"total_tokens":220,"cost_usd":0.000002,"unpriced_requests":0,"cache_hit_rate":0,"ttft_p50_ms":100,"ttft_p95_ms":100,
		 "errors":0,"errors_by_class":{}},
		{"key_id":"key_a","model":"gpt-5.5","requests":1,"input_tokens":300,"cached_input_tokens":300,"output_tokens":30,
		 "reasoning_tokens":5,"total_tokens":330,"cost_usd":0.000003,"unpriced_requests":0,"cache_hit_rate":1,"ttft_p50_ms":200,"ttft_p95_ms":200,
		 "errors":0,"errors_by_class":{}},
		{"key_id":"key_b","model":"gpt-5.4","requests":1,"input_tokens":0,"cached_input_tokens":0,"output_tokens":0,
		 "reasoning_tokens":0,"total_tokens":0,"cost_usd":0,"unpriced_requests":0,"cache_hit_rate":0,"ttft_p50_ms":null,"ttft_p95_ms":null,
		 "errors":1,"errors_by_class":{"usage_limit_reached":1}},
		{"key_id":"key_b","model":"gpt-5.5","requests":1,"input_tokens":100,"cached_input_tokens":50,"output_tokens":10,
		 "reasoning_tokens":2,"total_tokens":110,"cost_usd":0.000001,"unpriced_requests":0,"cache_hit_rate":0.5,"ttft_p50_ms":300,"ttft_p95_ms":300,
		 "errors":0,"errors_by_class":{}}
	]}`, string(raw))
	// Group columns first, in the order asked, then the metrics in the
	// documented order.
	assert.True(t, strings.HasPrefix(string(raw), `{"rows":[{"key_id":"key_a","model":"gpt-5.4","requests":1,"input_tokens":200,`+
		`"cached_input_tokens":0,"output_tokens":20,"reasoning_tokens":0,"total_tokens":220,"cost_usd":0.000002,`+
		`"unpriced_requests":0,"cache_hit_rate":0,"ttft_p50_ms":100,"ttft_p95_ms":100,"errors":0,"errors_by_class":{}}`), string(raw))
}

// Without groups there is one totals row, with no group column, even when
// nothing matched.
func TestTotalsRow(t *testing.T) {
	t.Parallel()
	empty := aggregate(nil, nil, time.UTC)
	require.Len(t, empty, 1)
	raw, err := json.Marshal(empty[0])
	require.NoError(t, err)
	assert.Equal(t, `{"requests":0,"input_tokens":0,"cached_input_tokens":0,"output_tokens":0,"reasoning_tokens":0,`+
		`"total_tokens":0,"cost_usd":0,"unpriced_requests":0,"cache_hit_rate":0,"ttft_p50_ms":null,"ttft_p95_ms":null,"errors":0,"errors_by_class":{}}`,
		string(raw))

	all := aggregate(sampleRows(), nil, time.UTC)
	require.Len(t, all, 1)
	raw, err = json.Marshal(all[0])
	require.NoError(t, err)
	assert.Equal(t, `{"requests":4,"input_tokens":600,"cached_input_tokens":350,"output_tokens":60,"reasoning_tokens":7,`+
		`"total_tokens":660,"cost_usd":0.000006,"unpriced_requests":0,"cache_hit_rate":0.5833333333333334,"ttft_p50_ms":200,"ttft_p95_ms":300,`+
		`"errors":1,"errors_by_class":{"usage_limit_reached":1}}`, string(raw))

	assert.Empty(t, aggregate(nil, []report.Group{report.GroupKey}, time.UTC), "grouped and empty: no rows")

	raw, err = json.Marshal(report.Row{})
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"errors_by_class":{}`, "an object, never null")
}

func TestFormatAndParseUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		nanos int64
		text  string
	}{
		{0, "0"},
		{1, "0.000000001"},
		{10, "0.00000001"},
		{500_000_000, "0.5"},
		{1_000_000_000, "1"},
		{1_234_567_890, "1.23456789"},
		{12_000_000_001, "12.000000001"},
		{-1_500_000_000, "-1.5"},
		{math.MaxInt64, "9223372036.854775807"},
	} {
		t.Run(tc.text, func(t *testing.T) {
			assert.Equal(t, tc.text, report.FormatUSD(tc.nanos))
			n, err := report.ParseUSD(tc.text)
			require.NoError(t, err)
			assert.Equal(t, tc.nanos, n)
		})
	}
	n, err := report.ParseUSD("2.50")
	require.NoError(t, err)
	assert.Equal(t, int64(2_500_000_000), n)
	for _, bad := range []string{"", "-", ".5", "1.", "1e-9", "1.0000000001", "abc", "1,5", "+1", "9223372036.854775808", "99999999999"} {
		_, err := report.ParseUSD(bad)
		assert.Error(t, err, bad)
	}
}

func TestWriteCSV(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rows := []store.UsageRow{
		{StartedAt: day, ThreadID: "=HYPERLINK(\"http://x\")", Model: "m", Status: 200, InputTokens: 4, CachedTokens: 1,
			CostNanos: 1_500_000_000, FirstOutputMS: ms(42)},
		{StartedAt: day, ThreadID: "+1", Model: "m", Status: 200},
		{StartedAt: day, ThreadID: "-2", Model: "m", Status: 200},
		{StartedAt: day, ThreadID: "@SUM(A1)", Model: "m", Status: 200},
		{StartedAt: day, ThreadID: "\tx", Model: "m", Status: 200},
		{StartedAt: day, ThreadID: "a,b \"c\"\nd", Model: "m", Status: 500},
		{StartedAt: day, ThreadID: "plain", Model: "-model", Status: 200},
		{StartedAt: day, ThreadID: ";=cmd|' /C calc'!A0;", Model: "m", Status: 200},
		{StartedAt: day, ThreadID: "x;=1+1", Model: "a|=2", Status: 200},
		{StartedAt: day, ThreadID: "|=3", Model: "tab\t=4", Status: 200},
	}
	groups := []report.Group{report.GroupThread, report.GroupModel, report.GroupDay}
	var buf bytes.Buffer
	require.NoError(t, report.WriteCSV(&buf, groups, aggregate(rows, groups, time.UTC)))
	out := buf.String()
	assert.True(t, strings.HasPrefix(out, "thread,model,day,requests,input_tokens,cached_input_tokens,output_tokens,"+
		"reasoning_tokens,total_tokens,cost_usd,unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors\n"), out)

	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, "valid CSV")
	require.Len(t, recs, 11)
	cells := map[string][]string{}
	for _, r := range recs[1:] {
		require.Len(t, r, 15)
		cells[r[0]] = r
	}
	for _, want := range []string{`'=HYPERLINK("http://x")`, "'+1", "'-2", "'@SUM(A1)", "'\tx", "a,b \"c\"\nd", "plain"} {
		assert.Contains(t, cells, want, "thread cell %q", want)
	}
	assert.Equal(t, []string{`'=HYPERLINK("http://x")`, "m", "2026-11-30", "1", "4", "1", "0", "0", "0", "1.5", "0", "0.25", "42", "42", "0"},
		cells[`'=HYPERLINK("http://x")`])
	assert.Equal(t, []string{"a,b \"c\"\nd", "m", "2026-11-30", "1", "0", "0", "0", "0", "0", "0", "0", "0", "", "", "1"},
		cells["a,b \"c\"\nd"], "quoted as RFC 4180, empty percentiles")
	assert.Equal(t, "'-model", cells["plain"][1], "every user-controlled column is defused")
	assert.Contains(t, out, `"a,b ""c""`+"\nd\"", "quotes doubled inside a quoted cell")
	assert.Contains(t, cells, `';=cmd|' /C calc'!A0;`, "a leading semicolon is defused")
	// Read as a spreadsheet of any locale reads CSV (its separator a comma,
	// a semicolon, a tab or a pipe), no cell starts a formula.
	for _, sep := range []rune{',', ';', '\t', '|'} {
		r := csv.NewReader(strings.NewReader(out))
		r.Comma, r.LazyQuotes, r.FieldsPerRecord = sep, true, -1
		recs, err := r.ReadAll()
		require.NoError(t, err, "separator %q", sep)
		for _, rec := range recs {
			for _, cell := range rec {
				if cell != "" {
					assert.NotContains(t, "=+-@", cell[:1], "separator %q: cell %q of %q", sep, cell, rec)
				}
			}
		}
	}

	buf.Reset()
	require.NoError(t, report.WriteCSV(&buf, nil, aggregate(nil, nil, time.UTC)))
	assert.Equal(t, "requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens,cost_usd,"+
		"unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors\n0,0,0,0,0,0,0,0,0,,,0\n", buf.String())
}

func TestSafeCell(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "", "abc": "abc", "=1": "'=1", "+1": "'+1", "-1": "'-1", "@a": "'@a",
		"\t1": "'\t1", "\r1": "'\r1", "a=1": "a=1", "'=1": "'=1", " =1": " =1", ";=1": "';=1", "|=1": "'|=1"} {
		assert.Equal(t, want, report.SafeCell(in), "%q", in)
	}
}

func FuzzParseGroups(f *testing.F) {
	for _, s := range []string{"", "key", "key,model", " day , hour ", "key,,", "week", "key,key"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		groups, err := report.ParseGroups(s)
		if err != nil {
			return
		}
		assert.LessOrEqual(t, len(groups), 6)
		seen := map[report.Group]bool{}
		for _, g := range groups {
			assert.False(t, seen[g], "a dimension once")
			seen[g] = true
			assert.NotEmpty(t, g.Column())
		}
		// Any accepted list can build a report.
		_ = report.Aggregate(slices.Values(sampleRows()), groups, time.UTC)
	})
}

func FuzzUSD(f *testing.F) {
	for _, s := range []string{"0", "1.5", "0.000000001", "-3.25", "9223372036.854775807", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := report.ParseUSD(s)
		if err != nil {
			return
		}
		back, err := report.ParseUSD(report.FormatUSD(n))
		require.NoError(t, err)
		assert.Equal(t, n, back, "FormatUSD and ParseUSD agree")
	})
}

// A row counts the requests priced by the fallback (unpriced), in JSON and
// CSV alike.
func TestUnpricedRequestsAreCounted(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	rows := aggregate([]store.UsageRow{
		{StartedAt: day, Model: "gpt-6-sol", Status: 200, CostNanos: 30, Unpriced: true},
		{StartedAt: day, Model: "gpt-6-sol", Status: 200, CostNanos: 40, Unpriced: true},
		{StartedAt: day, Model: "gpt-5.5", Status: 200, CostNanos: 50},
	}, []report.Group{report.GroupModel}, time.UTC)
	require.Len(t, rows, 2)
	byModel := map[string]report.Row{}
	for _, r := range rows {
		m, _ := r.Value(report.GroupModel)
		byModel[m] = r
	}
	assert.Equal(t, int64(2), byModel["gpt-6-sol"].UnpricedRequests)
	assert.Equal(t, int64(70), byModel["gpt-6-sol"].CostNanos, "their cost is the fallback's, counted")
	assert.Zero(t, byModel["gpt-5.5"].UnpricedRequests)
	raw, err := json.Marshal(byModel["gpt-6-sol"])
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"unpriced_requests":2,`)
	var buf bytes.Buffer
	require.NoError(t, report.WriteCSV(&buf, []report.Group{report.GroupModel}, rows))
	assert.Contains(t, buf.String(), "\ngpt-6-sol,2,0,0,0,0,0,0.00000007,2,")
}
