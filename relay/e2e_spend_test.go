package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web"
)

// spendRequest is responseRequest for a model the price table prices.
func spendRequest(prompt string) map[string]any {
	r := responseRequest(prompt)
	r["model"] = "gpt-5.1-codex"
	return r
}

func bearer(secret string) http.Header { return http.Header{"Authorization": {"Bearer " + secret}} }

// requestRows reads the request log of a key, oldest first.
func requestRows(t *testing.T, st *store.Store, keyID string) []store.RequestRecord {
	t.Helper()
	rows, _, err := st.Requests(context.Background(), store.RequestFilter{ClientKeyID: keyID, Limit: 1000})
	require.NoError(t, err)
	for i, j := 0, len(rows)-1; i < j; i, j = i+1, j-1 {
		rows[i], rows[j] = rows[j], rows[i]
	}
	return rows
}

// A key whose token budget covers one turn gets exactly that turn, on HTTP
// and on a WebSocket alike: the next is refused 429 usage_limit_reached with
// the window's reset (Codex shows "try again at") and the limit named. The
// request log holds exactly the usage the upstream reported, priced.
func TestKeyTokenBudgetAdmitsOneTurn(t *testing.T) {
	t.Parallel()
	clk := newTestClock(time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now, c.Registry = clk.Now, reg }, simAccount("a1", "org-a"))
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "one turn",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 1}}})
	require.NoError(t, err)
	midnight := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix()

	resp, body := h.post(sessionS, rootT, spendRequest("the one turn"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = h.post(sessionS, rootT, spendRequest("one too many"), bearer(secret))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "tokens/day", resp.Header.Get(relay.HeaderLimit))
	var refusal struct {
		Error struct {
			Type     string `json:"type"`
			ResetsAt int64  `json:"resets_at"`
			Message  string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &refusal), body)
	assert.Equal(t, "usage_limit_reached", refusal.Error.Type)
	assert.Equal(t, midnight, refusal.Error.ResetsAt)
	assert.Contains(t, refusal.Error.Message, "tokens per day")

	// The WebSocket's turn is refused the same way, as an error event.
	c := h.dialWSWith(sessionS, childT, bearer(secret))
	events := c.turn(spendRequest("over the socket"))
	ev := events[len(events)-1]
	require.Equal(t, "error", ev["type"], "events: %v", events)
	assert.EqualValues(t, 429, ev["status"])
	e := ev["error"].(map[string]any)
	assert.Equal(t, "usage_limit_reached", e["type"])
	assert.EqualValues(t, midnight, e["resets_at"])
	assert.Equal(t, "tokens/day", ev["headers"].(map[string]any)["x-codex-relay-limit"], "the header, as error events carry them")

	recs := h.responseRecords("")
	require.Len(t, recs, 1, "nothing refused went upstream")
	require.NotNil(t, recs[0].Usage)
	var rows []store.RequestRecord
	require.Eventually(t, func() bool { rows = requestRows(t, h.store, k.ID); return len(rows) == 3 }, time.Minute, 10*time.Millisecond)
	u := recs[0].Usage
	var first store.RequestRecord
	for _, r := range rows {
		if r.Status == http.StatusOK {
			first = r
		}
	}
	assert.Equal(t, u.TotalTokens, first.TotalTokens)
	assert.Equal(t, u.InputTokens, first.InputTokens)
	assert.Equal(t, u.CachedTokens, first.CachedTokens)
	assert.Equal(t, u.OutputTokens, first.OutputTokens)
	assert.Equal(t, u.ReasoningTokens, first.ReasoningTokens)
	assert.Equal(t, "gpt-5.1-codex", first.Model)
	assert.Equal(t, "gpt-5.1-codex", first.ModelServed)
	assert.True(t, first.Charged)
	// gpt-5.1-codex: 1.25 USD per million input, 0.125 cached, 10 output.
	want := (u.InputTokens-u.CachedTokens)*1250 + u.CachedTokens*125 + u.OutputTokens*10000
	assert.Equal(t, want, first.CostNanos)
	for _, r := range rows {
		if r.ID == first.ID {
			continue
		}
		assert.Equal(t, http.StatusTooManyRequests, r.Status)
		assert.Equal(t, "usage_limit_reached", r.ErrorCode)
		assert.False(t, r.Charged, "a refused request counts nothing")
		assert.Zero(t, r.TotalTokens)
	}
	assert.Equal(t, float64(u.InputTokens), metricValue(t, reg, "codex_relay_tokens_total", map[string]string{"key": k.ID, "model": "gpt-5.1-codex", "kind": "input"}))
	assert.Equal(t, float64(u.OutputTokens), metricValue(t, reg, "codex_relay_tokens_total", map[string]string{"key": k.ID, "model": "gpt-5.1-codex", "kind": "output"}))
	assert.InDelta(t, float64(want)/1e9, metricValue(t, reg, "codex_relay_cost_usd_total", map[string]string{"key": k.ID, "model": "gpt-5.1-codex"}), 1e-12)
	assert.Equal(t, 2.0, metricValue(t, reg, "codex_relay_key_limit_refusals_total", map[string]string{"key": k.ID, "limit": "tokens/day"}))
	diag, _, err := h.store.Attempts(ctx, store.AttemptFilter{Class: "key_limit"})
	require.NoError(t, err)
	assert.Len(t, diag, 2, "each refusal is recorded under key_limit")

	// The next day the key has its turn again.
	clk.Add(9 * time.Hour)
	resp, body = h.post(sessionS, rootT, spendRequest("a new day"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
}

// A key limited to one request at once: while a turn streams, a second is
// refused; a prewarm (Codex's generate:false) checks its key's limits but
// counts nothing; a request already streaming is never cut by a budget.
func TestConcurrentLimitAndPrewarm(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a")}, Logger: testLogger(t)}, nil2)
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "one at a time",
		Limits: []budget.Limit{{Metric: budget.Concurrent, Max: 1}, {Metric: budget.Requests, Window: budget.Minute, Max: 2}}})
	require.NoError(t, err)

	c := h.dialWSWith(sessionS, rootT, bearer(secret))
	warm := spendRequest("warm up")
	warm["generate"] = false
	typ, _ := lastEvent(c.turn(warm))
	require.Equal(t, "response.completed", typ)

	// A slow turn holds the key's one slot; meanwhile, an HTTP request of
	// the same key is refused.
	done := make(chan []map[string]any, 1)
	go func() { done <- c.turn(spendRequest("slow turn [[sim:delay 1500ms]]")) }()
	require.Eventually(t, func() bool { return len(h.responseRecords("")) >= 2 }, time.Minute, 5*time.Millisecond,
		"the prewarm and the slow turn reached the upstream")
	resp, body := h.post(sessionS, childT, spendRequest("at the same time"), bearer(secret))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "concurrent", resp.Header.Get(relay.HeaderLimit))
	typ, _ = lastEvent(<-done)
	require.Equal(t, "response.completed", typ, "the streaming turn finished")

	// The prewarm did not count as a request: one more is allowed this minute.
	resp, body = h.post(sessionS, childT, spendRequest("second request"), bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = h.post(sessionS, childT, spendRequest("third request"), bearer(secret))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "requests/minute", resp.Header.Get(relay.HeaderLimit))
	var charged int
	require.Eventually(t, func() bool { return len(requestRows(t, h.store, k.ID)) == 5 }, time.Minute, 10*time.Millisecond)
	for _, r := range requestRows(t, h.store, k.ID) {
		if r.Charged {
			charged++
		}
	}
	assert.Equal(t, 2, charged, "the two turns that did work")
}

func nil2(*harness, *relay.Config) {}

// Many requests of one key at once, with failovers injected (usage
// limits, server errors and cut streams before any output): every request
// is settled once, so the key's settled tokens equal the sum of what the
// upstream reported, exactly, and no reservation is left; on SQLite and on
// PostgreSQL.
func TestSettledUsageIsExactUnderConcurrencyAndFailover(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessOn(t, b.URL(t), sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a"), simAccount("a2", "org-a"),
				simAccount("a3", "org-a")}, Logger: testLogger(t)}, nil2)
			ctx := context.Background()
			k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "busy",
				Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Month, Max: 1e12}, {Metric: budget.Concurrent, Max: 1000}}})
			require.NoError(t, err)
			for _, f := range []sim.Fault{
				{Kind: sim.FaultUsageLimit, Account: "a1", Times: 4, ResetsIn: sim.Duration(time.Second)},
				{Kind: sim.FaultServerError, Account: "a2", Times: 4},
				{Kind: sim.FaultCutStream, Account: "a3", Events: 1, Times: 3},
			} {
				_, err := h.sim.AddFault(f)
				require.NoError(t, err)
			}
			const n = 24
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					thread := fmt.Sprintf("019a0000-0000-7000-8000-%012d", i)
					if i%3 == 0 {
						c := h.dialWSWith(sessionS, thread, bearer(secret))
						c.turn(spendRequest("over the socket " + strconv.Itoa(i)))
						return
					}
					h.post(sessionS, thread, spendRequest("over http "+strconv.Itoa(i)), bearer(secret))
				})
			}
			wg.Wait()

			var reported int64
			completed := 0
			for _, r := range h.responseRecords("") {
				if r.Usage != nil {
					reported += r.Usage.TotalTokens
					completed++
				}
			}
			require.Positive(t, completed)
			var rows []store.RequestRecord
			require.Eventually(t, func() bool { rows = requestRows(t, h.store, k.ID); return len(rows) == n }, time.Minute, 10*time.Millisecond)
			var settled int64
			charged := 0
			for _, r := range rows {
				settled += r.TotalTokens
				if r.Charged {
					charged++
				}
			}
			assert.Equal(t, reported, settled, "settled tokens are what the upstream reported")
			assert.Equal(t, completed, charged, "each completed response is charged once")
			use, err := h.store.KeyBudget(ctx, k, h.relay.ReplicaID(), h.relay.ReplicaLiveSince(), time.UTC)
			require.NoError(t, err)
			assert.Equal(t, float64(reported), use[0].Used)
			assert.Zero(t, use[0].Reserved, "every reservation settled")
			assert.Zero(t, use[1].Used, "nothing in flight")
			failovers, _, err := h.store.Attempts(ctx, store.AttemptFilter{Recovery: relay.RecoveryFailover})
			require.NoError(t, err)
			assert.NotEmpty(t, failovers, "requests failed over")
		})
	}
}

// A key's model policy: an alias becomes its model upstream, a reasoning
// effort above the cap is lowered, and the priority tier is downgraded or
// refused as the operator chose; the request log records what was asked
// and what changed.
func TestKeyModelPolicy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "policed", Models: []string{"gpt-5.1-codex"},
		Policy: store.KeyPolicy{ModelAliases: map[string]string{"fast": "gpt-5.1-codex-mini"}, MaxReasoningEffort: "medium", PriorityTier: "downgrade"}})
	require.NoError(t, err)
	req := spendRequest("quick one")
	req["model"] = "fast"
	req["reasoning"] = map[string]any{"effort": "xhigh", "summary": "auto"}
	req["service_tier"] = "priority"
	resp, body := h.post(sessionS, rootT, req, bearer(secret))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords(rootT)
	require.Len(t, recs, 1)
	assert.Equal(t, "gpt-5.1-codex-mini", recs[0].Model, "the alias's model went upstream")
	assert.Equal(t, "medium", recs[0].ReasoningEffort, "capped")
	assert.Empty(t, recs[0].ServiceTier, "downgraded to the default tier")
	var rows []store.RequestRecord
	require.Eventually(t, func() bool { rows = requestRows(t, h.store, k.ID); return len(rows) == 1 }, time.Minute, 10*time.Millisecond)
	assert.Equal(t, "fast", rows[0].Model, "the model as asked")
	assert.Equal(t, "gpt-5.1-codex-mini", rows[0].ModelServed)
	assert.Equal(t, "model fast>gpt-5.1-codex-mini; effort xhigh>medium; tier priority>default", rows[0].Policy)
	assert.Positive(t, rows[0].FirstOutput, "the time to the first output delta is recorded")
	assert.GreaterOrEqual(t, rows[0].FirstOutput, rows[0].FirstEvent)

	// A model outside the allow-list and its aliases is refused; so is
	// priority once the key refuses it.
	req["model"] = "gpt-5.2"
	resp, body = h.post(sessionS, rootT, req, bearer(secret))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	_, err = h.store.UpdateClientKey(ctx, func() store.ClientKey { k.Policy.PriorityTier = "refuse"; return k }())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		req["model"] = "gpt-5.1-codex"
		resp, body = h.post(sessionS, rootT, req, bearer(secret))
		return resp.StatusCode == http.StatusForbidden
	}, time.Minute, 50*time.Millisecond)
	assert.Contains(t, body, "service_tier_not_allowed")
	assert.Len(t, h.responseRecords(rootT), 1, "nothing refused went upstream")
}

// Two replicas on one PostgreSQL share one key's budget: of many requests
// at once, spread over both, exactly max start; then each replica refuses
// the key, and each sees the other's use.
func TestReplicasShareAKeysBudget(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t, "a1", "a2")
	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	lb := roundRobin(t, a, b)
	ctx := context.Background()
	k, secret, err := setup.CreateClientKey(ctx, store.ClientKey{Name: "shared",
		Limits: []budget.Limit{{Metric: budget.Requests, Window: budget.Day, Max: 3}}})
	require.NoError(t, err)
	h := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: lb}
	const n = 10
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			thread := fmt.Sprintf("019a0000-0000-7000-8000-%012d", 100+i)
			resp, _ := h.post(sessionS, thread, spendRequest("shared budget [[sim:delay 300ms]]"), bearer(secret))
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: n - 3}, count)
	assert.Positive(t, a.served.Load())
	assert.Positive(t, b.served.Load())
	for _, r := range []*replica{a, b} {
		hr := &harness{t: t, sim: upstream, store: setup, relay: r.relay, srv: r.srv}
		resp, body := hr.post(sessionS, "019a0000-0000-7000-8000-000000000999", spendRequest("after"), bearer(secret))
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	}
	rows := requestRows(t, setup, k.ID)
	charged := 0
	for _, r := range rows {
		if r.Charged {
			charged++
		}
	}
	assert.Equal(t, 3, charged)
}

// The real Codex CLI, over WebSocket and over HTTP, with a key whose token
// budget covers one turn: the first turn succeeds, the next is refused and
// Codex shows "try again at"; the usage report (JSON and CSV) shows exactly
// the tokens the upstream reported.
func TestCodexKeyBudgetAndUsageReport(t *testing.T) {
	t.Parallel()
	for _, ws := range []bool{true, false} {
		t.Run(map[bool]string{true: "websocket", false: "http"}[ws], func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simAccount("a1", "org-a"))
			const admin = "cra_test_admin_token_budget"
			front := httptest.NewServer(web.New(web.Config{Store: h.store, AdminTokenHash: web.HashAdminToken(admin), Client: h.relay,
				Relay: h.relay, Registry: prometheus.NewRegistry(), Gatherer: prometheus.NewRegistry()}))
			t.Cleanup(front.Close)
			ctx := context.Background()
			k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "one turn",
				Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: 1}}})
			require.NoError(t, err)
			codex := codexcli.New(t, codexcli.Provider{BaseURL: front.URL + "/backend-api/codex", WebSockets: ws, Key: secret,
				RequestMaxRetries: ptr(1), StreamMaxRetries: ptr(1)})
			first, err := codex.Exec(ctx, "the one turn the budget covers", codexcli.RunOptions{})
			require.NoError(t, err)
			require.Equal(t, 0, first.ExitCode, first.Stderr)
			second, err := codex.Exec(ctx, "one turn too many", codexcli.RunOptions{})
			require.NoError(t, err)
			assert.NotEqual(t, 0, second.ExitCode)
			assert.Contains(t, strings.ToLower(strings.Join(second.Errors, " ")), "try again at", "Codex shows the key's reset: %v", second.Errors)

			var reported sim.RecordUsage
			for _, r := range h.responseRecords("") {
				if r.Usage != nil {
					reported.InputTokens += r.Usage.InputTokens
					reported.CachedTokens += r.Usage.CachedTokens
					reported.OutputTokens += r.Usage.OutputTokens
					reported.ReasoningTokens += r.Usage.ReasoningTokens
					reported.TotalTokens += r.Usage.TotalTokens
				}
			}
			require.Positive(t, reported.TotalTokens)
			get := func(path string, hdr http.Header) (int, string) { return adminGet(t, front.URL+path, admin, hdr) }
			var rows []map[string]any
			require.Eventually(t, func() bool {
				code, body := get("/api/v1/usage?group_by=key&key="+k.ID, http.Header{})
				var out struct {
					Rows []map[string]any `json:"rows"`
				}
				if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || len(out.Rows) != 1 {
					return false
				}
				rows = out.Rows
				return rows[0]["total_tokens"] == float64(reported.TotalTokens)
			}, time.Minute, 50*time.Millisecond, "the report shows what the upstream reported: %v", rows)
			r := rows[0]
			assert.Equal(t, k.ID, r["key_id"])
			assert.EqualValues(t, reported.InputTokens, r["input_tokens"])
			assert.EqualValues(t, reported.CachedTokens, r["cached_input_tokens"])
			assert.EqualValues(t, reported.OutputTokens, r["output_tokens"])
			assert.EqualValues(t, reported.ReasoningTokens, r["reasoning_tokens"])
			code, csv := get("/api/v1/usage?group_by=key&key="+k.ID, http.Header{"Accept": {"text/csv"}})
			require.Equal(t, http.StatusOK, code, csv)
			lines := strings.Split(strings.TrimSpace(csv), "\n")
			require.Len(t, lines, 2, csv)
			header, values := strings.Split(lines[0], ","), strings.Split(lines[1], ",")
			col := map[string]string{}
			for i, name := range header {
				col[name] = values[i]
			}
			assert.Equal(t, k.ID, col["key_id"])
			assert.Equal(t, strconv.FormatInt(reported.TotalTokens, 10), col["total_tokens"])
			assert.Equal(t, strconv.FormatInt(reported.InputTokens, 10), col["input_tokens"])
			assert.Equal(t, strconv.FormatInt(reported.OutputTokens, 10), col["output_tokens"])
		})
	}
}

// The README's model, gpt-5.5-codex, has no published price: the real Codex
// CLI under a key limited to a millionth of a dollar a day gets one turn,
// priced at the default table's fallback (gpt-5.5) and marked unpriced, and
// the next turn is refused as over the limit. Before the fallback it cost $0
// and the limit let every turn through.
func TestCodexCostLimitForTheREADMEModel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	const admin = "cra_test_admin_token_cost"
	front := httptest.NewServer(web.New(web.Config{Store: h.store, AdminTokenHash: web.HashAdminToken(admin), Client: h.relay,
		Relay: h.relay, Registry: prometheus.NewRegistry(), Gatherer: prometheus.NewRegistry()}))
	t.Cleanup(front.Close)
	ctx := context.Background()
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "a millionth of a dollar",
		Limits: []budget.Limit{{Metric: budget.CostUSD, Window: budget.Day, Max: 0.000001}}})
	require.NoError(t, err)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: front.URL + "/backend-api/codex", WebSockets: true, Key: secret,
		RequestMaxRetries: ptr(1), StreamMaxRetries: ptr(1)})
	first, err := codex.Exec(ctx, "the one turn a millionth of a dollar buys", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, first.Stderr)
	second, err := codex.Exec(ctx, "one turn too many", codexcli.RunOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, 0, second.ExitCode, "the limit refuses the second turn")
	assert.Contains(t, strings.ToLower(strings.Join(second.Errors, " ")), "try again at", "Codex shows the key's reset: %v", second.Errors)

	// The log is written behind the answers: wait for the refused turn's row.
	var rows []store.RequestRecord
	require.Eventually(t, func() bool {
		rows = requestRows(t, h.store, k.ID)
		return slices.ContainsFunc(rows, func(r store.RequestRecord) bool { return r.Status == http.StatusTooManyRequests })
	}, time.Minute, 20*time.Millisecond, "the refused turn is logged")
	var charged, unpriced int
	for _, r := range rows {
		if r.TotalTokens > 0 {
			assert.Equal(t, "gpt-5.5-codex", r.Model)
			assert.True(t, r.Unpriced, "no entry of its own: marked unpriced")
			assert.Positive(t, r.CostNanos, "priced at the fallback's prices")
		}
		if r.Charged {
			charged++
		}
		if r.Unpriced {
			unpriced++
		}
	}
	assert.Equal(t, 1, charged, "one turn charged, the rest refused: %+v", rows)
	code, body := adminGet(t, front.URL+"/api/v1/usage?group_by=key&key="+k.ID, admin, http.Header{})
	require.Equal(t, http.StatusOK, code, body)
	var report struct {
		Rows []map[string]any `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &report))
	require.Len(t, report.Rows, 1)
	assert.EqualValues(t, unpriced, report.Rows[0]["unpriced_requests"])
	assert.Positive(t, report.Rows[0]["cost_usd"])
}

func ptr[T any](v T) *T { return &v }

// adminGet GETs url with the admin token and the headers hdr.
func adminGet(t *testing.T, url, token string, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header = hdr
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode, readAllString(t, resp)
}

// metricValue reads one series of a counter or gauge from reg (0 when it
// is not there).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
