package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

const e2eAdminToken = "cra_console_e2e_admin_token_0123456789"

// browserTools finds Chromium, node and playwright-core, or skips the test
// (fails it when CODEX_RELAY_REQUIRE_E2E=1).
func browserTools(t *testing.T, root string) (chromium, node string) {
	t.Helper()
	missing := func(what string) {
		if storetest.Required() {
			t.Fatalf("%s is missing but CODEX_RELAY_REQUIRE_E2E=1: the browser test must run (./scripts/test.sh installs it)", what)
		}
		t.Skipf("%s is missing: browser test skipped (./scripts/test.sh installs it)", what)
	}
	chromium = os.Getenv("CODEX_RELAY_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		missing("Chromium (" + chromium + ")")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node")
	}
	if _, err := os.Stat(filepath.Join(root, "node_modules", "playwright-core", "package.json")); err != nil {
		missing("node_modules/playwright-core (run npm ci)")
	}
	return chromium, node
}

// runBrowserScript runs the browser script web/e2e/<script> with node in
// root, within timeout, with env added to the test's (RELAY_URL, CHROMIUM,
// OUT_DIR and the script's own), logs what it printed, fails the test when
// it failed, and returns its standard output.
func runBrowserScript(t *testing.T, root, node, script string, timeout time.Duration, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "web", "e2e", script))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	t.Logf("%s stdout:\n%s", script, stdout.String())
	if stderr.Len() > 0 {
		t.Logf("%s stderr:\n%s", script, stderr.String())
	}
	require.NoError(t, runErr, "the browser script failed")
	return stdout.String()
}

// The console in a real browser, on a relay serving a real Codex: a Codex
// turn binds its thread; the operator logs in, finds the binding on the
// Bindings page, resets it there and sees it gone and audited; a form
// without its CSRF token is refused; the next Codex turn binds the thread
// again. On the Usage page every chart draws its series at both widths and
// the CSV link downloads the report; a key's limits are edited on its page.
// Every page is captured at 1280 and 390 px in test-output/console.
func TestConsoleInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)

	// The first request meets a usage limit and fails over, so the pages
	// have a switch, a limited account and usage windows to show.
	window := func(pct float64) sim.Window { return sim.Window{UsedPercent: pct} }
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "a1", AccessToken: "at-a1", RefreshToken: "rt-a1", Organization: "org-a", Primary: window(35), Secondary: window(62), UsagePerRequest: 1},
		{ID: "a2", AccessToken: "at-a2", RefreshToken: "rt-a2", Organization: "org-a", Primary: window(12), Secondary: window(91), UsagePerRequest: 1},
		{ID: "b1", AccessToken: "at-b1", RefreshToken: "rt-b1", Organization: "org-b", Primary: window(71), Secondary: window(20), UsagePerRequest: 1},
	}, Faults: []sim.Fault{{Kind: sim.FaultUsageLimit, Times: 1, ResetsIn: sim.Duration(time.Hour)}}})
	t.Cleanup(upstream.Close)
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	for _, a := range upstream.Accounts() {
		_, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: a.Account.ID, BaseURL: upstream.CodexBaseURL(),
			ChatGPTAccountID: a.Account.ID, Organization: a.Account.Organization},
			store.Credentials{AccessToken: a.Account.AccessToken, RefreshToken: a.Account.RefreshToken})
		require.NoError(t, err)
	}
	rl := relay.New(relay.Config{Store: st, StreamIdleTimeout: 20 * time.Second})
	srv := httptest.NewServer(web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken), Client: rl, Relay: rl,
		LiveInterval: 300 * time.Millisecond}))
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); rl.Run(runCtx) }() // heartbeat and housekeeping, as serve runs them
	t.Cleanup(func() {
		stopRun()
		<-ran
		rl.Close()
		srv.CloseClientConnections()
		srv.Close()
	})
	laptop, key, err := st.CreateClientKey(ctx, store.ClientKey{Name: "e2e laptop"})
	require.NoError(t, err)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/backend-api/codex", Key: key})

	first, err := codex.Exec(ctx, "say hello", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, first.ExitCode, "stderr: %s", first.Stderr)
	require.NotEmpty(t, first.ThreadID)
	before, _, err := st.Bindings(ctx, store.BindingFilter{ThreadID: first.ThreadID})
	require.NoError(t, err)
	require.Len(t, before, 1, "the Codex turn bound its thread")
	_, switched, err := st.Attempts(ctx, store.AttemptFilter{Recovery: "failover"})
	require.NoError(t, err)
	require.Equal(t, 1, switched, "precondition: the turn failed over once")

	// Usage windows as an upstream reports them, for the usage bars.
	accounts, err := st.Accounts(ctx)
	require.NoError(t, err)
	for i, a := range accounts {
		require.NoError(t, st.UpdateUsage(ctx, a.ID,
			store.Window{UsedPercent: float64(20 + 35*i), WindowMinutes: 300, ResetAt: time.Now().Add(time.Duration(i+1) * time.Hour), Known: true},
			store.Window{UsedPercent: float64(60 + 15*i), WindowMinutes: 10080, ResetAt: time.Now().Add(time.Duration(i+2) * 24 * time.Hour), Known: true}))
	}

	// A request log over the last six days, across two keys, two models and
	// the three accounts, for the Usage page's charts; the second key has
	// limits, for its gauges and the key page's form.
	budgeted, _, err := st.CreateClientKey(ctx, store.ClientKey{Name: "e2e budgeted", Limits: []budget.Limit{
		{Metric: budget.Tokens, Window: budget.FiveHours, Max: 50000}, {Metric: budget.CostUSD, Window: budget.Day, Max: 2},
		{Metric: budget.Concurrent, Max: 3}}})
	require.NoError(t, err)
	for d := range 6 {
		for i, k := range []store.ClientKey{laptop, budgeted} {
			in := int64(1000 * (d + 1) * (i + 1))
			require.NoError(t, st.RecordRequest(ctx, store.RequestRecord{ID: fmt.Sprintf("req_seed_%d_%d", d, i), ClientKeyID: k.ID,
				AccountID: accounts[(d+i)%len(accounts)].ID, ThreadID: fmt.Sprintf("seed-thread-%d", i), Transport: "http",
				Path: "/backend-api/codex/responses", Model: []string{"gpt-5.1-codex", "gpt-5.1-codex-mini"}[i],
				ModelServed: []string{"gpt-5.1-codex", "gpt-5.1-codex-mini"}[i], Status: 200,
				StartedAt: time.Now().Add(-time.Duration(d)*24*time.Hour - time.Duration(i+1)*time.Hour), Duration: 2 * time.Second,
				InputTokens: in, CachedTokens: in * int64(d) / 8, OutputTokens: 300, ReasoningTokens: 100, TotalTokens: in + 300,
				CostNanos: in * 1250, Charged: true, FirstOutput: time.Duration(300+100*d+200*i) * time.Millisecond}, nil))
		}
	}

	out := filepath.Join(root, "test-output", "console")
	require.NoError(t, os.MkdirAll(out, 0o755))
	started := time.Now().Add(-time.Second) // file times may be coarser than the clock
	stdout := runBrowserScript(t, root, node, "console.mjs", 3*time.Minute, "RELAY_URL="+srv.URL, "ADMIN_TOKEN="+e2eAdminToken, "THREAD_ID="+first.ThreadID,
		"CHROMIUM="+chromium, "OUT_DIR="+out, "BUDGETED_KEY="+budgeted.ID)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var result struct {
		OK           bool   `json:"ok"`
		ResetBinding string `json:"reset_binding"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &result))
	require.True(t, result.OK)
	assert.Equal(t, before[0].ID, result.ResetBinding, "the browser reset the thread's binding")

	after, _, err := st.Bindings(ctx, store.BindingFilter{ThreadID: first.ThreadID})
	require.NoError(t, err)
	assert.Empty(t, after, "the reset removed the binding")
	entries, _, err := st.AuditLog(ctx, store.AuditFilter{Action: "binding.reset"})
	require.NoError(t, err)
	require.Len(t, entries, 1, "one reset; the posts without their CSRF token reset nothing")
	assert.Equal(t, "admin-token", entries[0].Actor)
	assert.Equal(t, "binding:"+before[0].ID, entries[0].Target)

	pins, _, err := st.Bindings(ctx, store.BindingFilter{Kind: store.BindRawSession, SessionID: "e2e-pinned-session"})
	require.NoError(t, err)
	require.Len(t, pins, 1, "the pin made in the browser is stored")
	assert.Equal(t, store.Hard, pins[0].Strength)

	next, err := codex.Resume(ctx, first.ThreadID, "and again", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, next.ExitCode, "stderr: %s", next.Stderr)
	rebound, _, err := st.Bindings(ctx, store.BindingFilter{ThreadID: first.ThreadID})
	require.NoError(t, err)
	require.Len(t, rebound, 1, "the next turn bound the thread again")
	assert.NotEqual(t, before[0].ID, rebound[0].ID, "a new binding, not the old one")

	saved, err := st.ClientKey(ctx, budgeted.ID)
	require.NoError(t, err)
	assert.Equal(t, []budget.Limit{{Metric: budget.Tokens, Window: budget.FiveHours, Max: 60000}, {Metric: budget.Concurrent, Max: 4}},
		saved.Limits, "the limits saved in the browser are stored")
	assert.Equal(t, "high", saved.Policy.MaxReasoningEffort)

	for _, name := range []string{"login", "bindings", "bindings-after-reset", "bindings-all", "csrf-refused", "audit", "overview", "accounts",
		"lanes", "diagnostics", "requests", "keys", "settings", "usage", "usage-day", "requests-thread", "key", "key-refused", "key-saved"} {
		for _, w := range []string{"1280", "390"} {
			fi, err := os.Stat(filepath.Join(out, name+"-"+w+".png"))
			if assert.NoError(t, err, "screenshot %s-%s", name, w) {
				assert.True(t, fi.ModTime().After(started), "screenshot %s-%s was taken by this run", name, w)
			}
		}
	}
}
