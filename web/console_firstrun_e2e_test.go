package web_test

import (
	"bufio"
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

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web"
)

// A newcomer's first run, in a real browser on a fresh store: / leads to
// the console; the overview's checklist follows the steps (an account added
// through the API, a key created in the console whose secret and config
// block the Copy buttons put on the clipboard, then a real Codex run with
// exactly what was copied) and goes away; the search box finds the thread,
// the key by name, the account by label and the request; the request's
// page shows it whole; every page explains itself. Every page is captured
// at 1280 and 390 px in test-output/firstrun.
func TestConsoleFirstRunInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)

	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "c1", AccessToken: "at-c1", RefreshToken: "rt-c1", Organization: "org-a"},
	}})
	t.Cleanup(upstream.Close)
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	rl := relay.New(relay.Config{Store: st, StreamIdleTimeout: 20 * time.Second})
	srv := httptest.NewServer(web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken), Client: rl, Relay: rl,
		LiveInterval: 300 * time.Millisecond}))
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); rl.Run(runCtx) }()
	t.Cleanup(func() {
		stopRun()
		<-ran
		rl.Close()
		srv.CloseClientConnections()
		srv.Close()
	})
	accountBody, err := json.Marshal(map[string]string{"label": "First account", "kind": "chatgpt", "base_url": upstream.CodexBaseURL(),
		"access_token": "at-c1", "refresh_token": "rt-c1", "account_id": "c1", "organization": "org-a"})
	require.NoError(t, err)

	out := filepath.Join(root, "test-output", "firstrun")
	require.NoError(t, os.MkdirAll(out, 0o755))
	started := time.Now().Add(-time.Second) // file times may be coarser than the clock
	sctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(sctx, node, filepath.Join(root, "web", "e2e", "firstrun.mjs"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "RELAY_URL="+srv.URL, "ADMIN_TOKEN="+e2eAdminToken, "CHROMIUM="+chromium, "OUT_DIR="+out,
		"ACCOUNT="+string(accountBody))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	// The script's lines, read as they come: it asks for the request Codex
	// makes, and ends with its result.
	var last string
	asked := false
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		line := lines.Text()
		t.Logf("firstrun.mjs: %s", line)
		last = line
		payload, ok := strings.CutPrefix(line, "need-request ")
		if !ok {
			continue
		}
		asked = true
		var copied struct{ Secret, Config string }
		require.NoError(t, json.Unmarshal([]byte(payload), &copied))
		assert.Equal(t, web.CodexConfig(srv.URL), copied.Config, "the clipboard held the config block keys create prints")
		key, err := st.AuthenticateClientKey(ctx, copied.Secret)
		require.NoError(t, err, "the clipboard held the key just created")
		assert.Equal(t, "Ana's laptop", key.Name)

		// Codex with exactly the copied block in its config.toml (and the
		// test's own offline settings around it), and the copied key.
		codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/backend-api/codex", Key: copied.Secret})
		toml := "model = \"gpt-5.5-codex\"\ncheck_for_update_on_startup = false\n" + copied.Config + "\n[analytics]\nenabled = false\n"
		require.NoError(t, os.WriteFile(filepath.Join(codex.Home, "config.toml"), []byte(toml), 0o600))
		res, err := codex.Exec(ctx, "hello from a first run", codexcli.RunOptions{})
		require.NoError(t, err)
		require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
		require.NotEmpty(t, res.ThreadID)
		answer, err := json.Marshal(map[string]string{"thread": res.ThreadID})
		require.NoError(t, err)
		_, err = fmt.Fprintf(stdin, "%s\n", answer)
		require.NoError(t, err)
	}
	require.NoError(t, lines.Err())
	waitErr := cmd.Wait()
	if stderr.Len() > 0 {
		t.Logf("firstrun.mjs stderr:\n%s", stderr.String())
	}
	require.NoError(t, waitErr, "the browser script failed")
	require.True(t, asked, "the script asked for Codex's request")
	var result struct {
		OK        bool   `json:"ok"`
		KeyName   string `json:"key_name"`
		AccountID string `json:"account_id"`
		RequestID string `json:"request_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(last), &result))
	require.True(t, result.OK)

	// What the browser saw is what the store holds.
	r, err := st.Request(ctx, result.RequestID)
	require.NoError(t, err)
	assert.Equal(t, 200, r.Status)
	assert.Equal(t, result.AccountID, r.AccountID)
	keys, err := st.ClientKeys(ctx)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	assert.Equal(t, result.KeyName, keys[0].Name)
	assert.Equal(t, keys[0].ID, r.ClientKeyID, "Codex was served with the key created in the browser")
	for action, actor := range map[string]string{"key.create": "admin-token", "account.create": "admin-token"} {
		entries, _, err := st.AuditLog(ctx, store.AuditFilter{Action: action})
		require.NoError(t, err)
		if assert.Len(t, entries, 1, action) {
			assert.Equal(t, actor, entries[0].Actor, action)
		}
	}

	for _, name := range []string{"firstrun-overview", "firstrun-overview-explained", "firstrun-keys", "firstrun-key-created", "firstrun-overview-done", "firstrun-request",
		"firstrun-request-404", "firstrun-search-none", "firstrun-accounts", "firstrun-bindings", "firstrun-lanes", "firstrun-diagnostics",
		"firstrun-requests", "firstrun-usage", "firstrun-settings", "firstrun-audit"} {
		for _, w := range []string{"1280", "390"} {
			fi, err := os.Stat(filepath.Join(out, name+"-"+w+".png"))
			if assert.NoError(t, err, "screenshot %s-%s", name, w) {
				assert.True(t, fi.ModTime().After(started), "screenshot %s-%s was taken by this run", name, w)
			}
		}
	}
}
