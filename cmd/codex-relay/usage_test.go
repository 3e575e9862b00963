package main

import (
	"context"
	"encoding/json"
	"flag"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// seedUsageLog logs four requests on 2026-12-01 (UTC): two keys, two
// models, one refused, one with a thread id holding a terminal escape.
func seedUsageLog(t *testing.T, s *store.Store) {
	t.Helper()
	day := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, r := range []store.RequestRecord{
		{ClientKeyID: "key_a", AccountID: "acc_1", ThreadID: "t1", Model: "gpt-5.5", ModelServed: "gpt-5.5", Status: 200,
			StartedAt: day, InputTokens: 1000, CachedTokens: 250, OutputTokens: 100, ReasoningTokens: 40, TotalTokens: 1100,
			CostNanos: 1_234_560_000, FirstOutput: 300 * time.Millisecond},
		{ClientKeyID: "key_a", AccountID: "acc_2", ThreadID: "t2", Model: "gpt-5.4", ModelServed: "gpt-5.4", Status: 200,
			StartedAt: day.Add(time.Hour), InputTokens: 500, OutputTokens: 50, TotalTokens: 550, CostNanos: 50_000,
			FirstOutput: 100 * time.Millisecond},
		{ClientKeyID: "key_b", AccountID: "acc_1", ThreadID: "t\x1b[31mred", Model: "gpt-5.5", ModelServed: "gpt-5.5",
			Status: 200, StartedAt: day.Add(2 * time.Hour), InputTokens: 200, CachedTokens: 200, OutputTokens: 20,
			TotalTokens: 220, CostNanos: 1, FirstOutput: 200 * time.Millisecond},
		{ClientKeyID: "key_b", ThreadID: "t3", Model: "gpt-5.4", Status: 429, ErrorCode: "usage_limit_reached",
			StartedAt: day.Add(3 * time.Hour)},
	} {
		r.Transport, r.Path = "http", "/v1/responses"
		require.NoError(t, s.RecordRequest(context.Background(), r, nil))
	}
}

// fields splits a table line on its runs of two or more spaces.
func fields(line string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
}

func TestUsageCommand(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		seedUsageLog(t, s)
		env := adminEnv("CODEX_RELAY_URL", adminAPI(t, s))
		window := []string{"-from", "2026-12-01", "-to", "2026-12-02"}
		usage := func(t *testing.T, args ...string) string {
			t.Helper()
			out, _, err := runCLI(t, env, append(append([]string{"usage"}, window...), args...)...)
			require.NoError(t, err)
			return out
		}

		t.Run("totals", func(t *testing.T) {
			lines := strings.Split(strings.TrimRight(usage(t), "\n"), "\n")
			require.Len(t, lines, 2, "a header and the totals line")
			assert.Equal(t, []string{"REQUESTS", "INPUT", "CACHED", "OUTPUT", "REASONING", "TOTAL", "COST USD", "CACHE HIT",
				"TTFT P50", "TTFT P95", "ERRORS"}, fields(lines[0]))
			assert.Equal(t, []string{"4", "1700", "450", "170", "40", "1870", "1.2346", "26.5%", "200ms", "300ms", "1"},
				fields(lines[1]))
		})

		t.Run("grouped, with a totals line", func(t *testing.T) {
			out := usage(t, "-group-by", "key,model")
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			require.Len(t, lines, 6, out)
			assert.Equal(t, []string{"KEY", "MODEL", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "REASONING", "TOTAL", "COST USD",
				"CACHE HIT", "TTFT P50", "TTFT P95", "ERRORS"}, fields(lines[0]))
			assert.Equal(t, []string{"key_a", "gpt-5.4", "1", "500", "0", "50", "0", "550", "0.0001", "0.0%", "100ms", "100ms", "0"}, fields(lines[1]))
			assert.Equal(t, []string{"key_a", "gpt-5.5", "1", "1000", "250", "100", "40", "1100", "1.2346", "25.0%", "300ms", "300ms", "0"}, fields(lines[2]))
			assert.Equal(t, []string{"key_b", "gpt-5.4", "1", "0", "0", "0", "0", "0", "0.0000", "-", "-", "-", "1"}, fields(lines[3]))
			assert.Equal(t, []string{"key_b", "gpt-5.5", "1", "200", "200", "20", "0", "220", "0.0000", "100.0%", "200ms", "200ms", "0"}, fields(lines[4]))
			assert.Equal(t, []string{"TOTAL", "4", "1700", "450", "170", "40", "1870", "1.2346", "26.5%", "200ms", "300ms", "1"},
				fields(lines[5]), "sums of the rows; percentiles of all requests")
			col := strings.Index(lines[0], "ERRORS")
			for _, l := range lines[1:] {
				assert.Equal(t, l[col:], strings.TrimSpace(l[col:]), "columns are aligned: %q", l)
			}
		})

		t.Run("control characters are not printed", func(t *testing.T) {
			out := usage(t, "-group-by", "thread")
			assert.NotContains(t, out, "\x1b")
			assert.Contains(t, out, "t?[31mred")
		})

		t.Run("filters", func(t *testing.T) {
			for _, tc := range []struct {
				args     []string
				requests string
			}{
				{[]string{"-key", "key_b"}, "2"},
				{[]string{"-account", "acc_1"}, "2"},
				{[]string{"-model", "gpt-5.4"}, "2"},
				{[]string{"-thread", "t2"}, "1"},
				{[]string{"-key", "key_a", "-model", "gpt-5.5"}, "1"},
				{[]string{"-from", "2026-12-01T10:00:00Z", "-to", "2026-12-01T11:00:00Z"}, "1"},
			} {
				lines := strings.Split(strings.TrimRight(usage(t, tc.args...), "\n"), "\n")
				require.Len(t, lines, 2)
				assert.Equal(t, tc.requests, fields(lines[1])[0], "%v", tc.args)
			}
			out := usage(t, "-key", "key_none", "-group-by", "model")
			assert.Equal(t, "No requests in the window.\n", out)
		})

		t.Run("csv", func(t *testing.T) {
			out := usage(t, "-group-by", "day,key", "-csv")
			assert.Equal(t, "day,key_id,requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens,"+
				"cost_usd,unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors\n"+
				"2026-12-01,key_a,2,1500,250,150,40,1650,1.23461,0,0.16666666666666666,100,300,0\n"+
				"2026-12-01,key_b,2,200,200,20,0,220,0.000000001,0,1,200,200,1\n", out)
		})

		t.Run("json", func(t *testing.T) {
			out := usage(t, "-group-by", "model", "-json")
			var answer struct {
				Rows []map[string]any `json:"rows"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &answer), out)
			require.Len(t, answer.Rows, 2)
			assert.Equal(t, "gpt-5.4", answer.Rows[0]["model"])
			assert.Equal(t, map[string]any{"usage_limit_reached": float64(1)}, answer.Rows[0]["errors_by_class"])
			assert.Contains(t, out, `"cost_usd": 1.234560001`, "the API's number, as it wrote it")
		})
	})
}

func TestUsageCommandErrors(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	env := adminEnv("CODEX_RELAY_URL", adminAPI(t, s))
	_, _, err := runCLI(t, env, "usage", "-group-by", "week")
	assert.EqualError(t, err, `usage: -group-by: unknown group "week" (want key, account, model, thread, day or hour)`)
	_, _, err = runCLI(t, env, "usage", "-from", "yesterday")
	assert.ErrorContains(t, err, "from: must be an RFC 3339 time", "the API's message")
	_, _, err = runCLI(t, env, "usage", "-from", "yesterday", "-csv")
	assert.ErrorContains(t, err, "from: must be an RFC 3339 time", "the API's message, also for CSV")
	_, _, err = runCLI(t, env, "usage", "-csv", "-json")
	assert.ErrorContains(t, err, "not both")
	_, _, err = runCLI(t, env, "usage", "extra")
	assert.ErrorContains(t, err, "unexpected arguments")
	_, _, err = runCLI(t, adminEnv("CODEX_RELAY_URL", adminAPI(t, s), "CODEX_RELAY_ADMIN_TOKEN", "wrong"), "usage")
	var ae *apiError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, 401, ae.Status)
	_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": "http://127.0.0.1:9"}, "usage")
	assert.ErrorContains(t, err, "CODEX_RELAY_ADMIN_TOKEN is not set")

	_, errOut, err := runCLI(t, cliEnv{}, "usage", "--help")
	assert.ErrorIs(t, err, flag.ErrHelp)
	for _, f := range []string{"-group-by", "-from", "-to", "-key", "-account", "-model", "-thread", "-csv", "-json", "-url", "CODEX_RELAY_ADMIN_TOKEN"} {
		assert.Contains(t, errOut, f)
	}
}
