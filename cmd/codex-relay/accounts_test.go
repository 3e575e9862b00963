package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

const cliAdminToken = "cra_cli_test_admin_token_0123456789"

// adminAPI serves the relay's real admin API for s on a loopback server
// and returns its base URL.
func adminAPI(t *testing.T, s *store.Store) string {
	t.Helper()
	srv := httptest.NewServer(web.New(web.Config{Store: s, AdminTokenHash: web.HashAdminToken(cliAdminToken)}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// cliEnv is the environment of an admin command run by a test.
type cliEnv map[string]string

func adminEnv(extra ...string) cliEnv {
	env := cliEnv{"CODEX_RELAY_ADMIN_TOKEN": cliAdminToken}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// runCLI runs codex-relay in-process with args and env.
func runCLI(t *testing.T, env cliEnv, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut logbuf.Buffer
	err := run(context.Background(), args, cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }})
	return out.String(), errOut.String(), err
}

// testJWT builds an unsigned JWT-shaped token with claims.
func testJWT(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + base64.RawURLEncoding.EncodeToString(b) + ".sig"
}

// writeAuthJSON writes a Codex auth.json of a ChatGPT login and returns its
// path and tokens.
func writeAuthJSON(t *testing.T, dir, email, workspace, plan, refresh string) (string, map[string]string) {
	t.Helper()
	tokens := map[string]string{
		"id_token": testJWT(map[string]any{"email": email, "https://api.openai.com/auth": map[string]any{
			"chatgpt_account_id": workspace, "chatgpt_plan_type": plan,
			"organizations": []map[string]any{{"id": "org-" + workspace, "is_default": true}}}}),
		"access_token":  testJWT(map[string]any{"exp": time.Now().Add(240 * time.Hour).Unix()}),
		"refresh_token": refresh,
		"account_id":    workspace,
	}
	b, err := json.Marshal(map[string]any{"auth_mode": "chatgpt", "OPENAI_API_KEY": nil, "tokens": tokens, "last_refresh": time.Now().UTC()})
	require.NoError(t, err)
	path := filepath.Join(dir, workspace+"-"+refresh+".json")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return path, tokens
}

// An auth.json import of two workspaces of one email yields two accounts,
// keyed by workspace; importing again changes nothing; -update replaces the
// tokens (and resumes an account waiting for a new login).
func TestAccountsImport(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		url := adminAPI(t, s)
		dir := t.TempDir()
		personal, pTokens := writeAuthJSON(t, dir, "dev@example.com", "ws-personal", "plus", "rt-personal-1")
		team, tTokens := writeAuthJSON(t, dir, "dev@example.com", "ws-team", "team", "rt-team-1")

		out, _, err := runCLI(t, adminEnv(), "accounts", "import", "-url", url, personal, team, "-tags", "imported", "-base-url", "http://127.0.0.1:9/backend-api/codex")
		require.NoError(t, err)
		assert.Contains(t, out, "2 added, 0 updated, 0 skipped")
		accts, err := s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, accts, 2)
		byWS := map[string]store.Account{}
		for _, a := range accts {
			byWS[a.ChatGPTAccountID] = a
			assert.Equal(t, store.KindChatGPT, a.Kind)
			assert.Equal(t, "dev@example.com", a.Email)
			assert.Equal(t, []string{"imported"}, a.Tags)
			assert.Equal(t, "http://127.0.0.1:9/backend-api/codex", a.BaseURL)
		}
		require.Contains(t, byWS, "ws-personal")
		require.Contains(t, byWS, "ws-team")
		assert.Equal(t, "team", byWS["ws-team"].PlanType)
		assert.Equal(t, "org-ws-team", byWS["ws-team"].Organization)
		cred, err := s.Credentials(ctx, byWS["ws-team"].ID)
		require.NoError(t, err)
		assert.Equal(t, store.Credentials{AccessToken: tTokens["access_token"], RefreshToken: "rt-team-1", IDToken: tTokens["id_token"]}, cred)
		for _, tok := range []string{pTokens["access_token"], tTokens["refresh_token"], "rt-personal-1"} {
			assert.NotContains(t, out, tok, "the import never prints a token")
		}

		// Again, and as one file holding both: nothing changes.
		both := filepath.Join(dir, "both.json")
		a, _ := os.ReadFile(personal)
		b, _ := os.ReadFile(team)
		require.NoError(t, os.WriteFile(both, []byte("["+string(a)+","+string(b)+"]"), 0o600))
		for _, files := range [][]string{{personal, team}, {both}} {
			out, _, err = runCLI(t, adminEnv("CODEX_RELAY_URL", url), append([]string{"accounts", "import"}, files...)...)
			require.NoError(t, err)
			assert.Contains(t, out, "0 added, 0 updated, 2 skipped")
			assert.Contains(t, out, "skipped dev@example.com (team, ws-team): already account "+byWS["ws-team"].ID)
		}
		again, err := s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, again, 2)
		for _, a := range again {
			assert.Equal(t, byWS[a.ChatGPTAccountID].UpdatedAt, a.UpdatedAt, "re-importing changes nothing")
		}

		// A newer login of the team workspace, with -update.
		_, err = s.SetAccountStatus(ctx, byWS["ws-team"].ID, store.StatusReauthRequired, "token refresh rejected", time.Time{})
		require.NoError(t, err)
		newer, _ := writeAuthJSON(t, dir, "dev@example.com", "ws-team", "team", "rt-team-2")
		out, _, err = runCLI(t, adminEnv(), "accounts", "import", "-url", url, "-update", newer)
		require.NoError(t, err)
		assert.Contains(t, out, "0 added, 1 updated, 0 skipped")
		cred, err = s.Credentials(ctx, byWS["ws-team"].ID)
		require.NoError(t, err)
		assert.Equal(t, "rt-team-2", cred.RefreshToken)
		got, err := s.Account(ctx, byWS["ws-team"].ID)
		require.NoError(t, err)
		assert.Equal(t, store.StatusActive, got.Status, "a new login resumes an account that needed one")
		cred, err = s.Credentials(ctx, byWS["ws-personal"].ID)
		require.NoError(t, err)
		assert.Equal(t, "rt-personal-1", cred.RefreshToken, "the other workspace is untouched")

		// An auth.json with only an API key.
		keyFile := filepath.Join(dir, "key.json")
		require.NoError(t, os.WriteFile(keyFile, []byte(`{"OPENAI_API_KEY":"sk-from-auth-json"}`), 0o600))
		out, _, err = runCLI(t, adminEnv(), "accounts", "import", "-url", url, keyFile)
		require.NoError(t, err)
		assert.Contains(t, out, "1 added")
		assert.NotContains(t, out, "sk-from-auth-json")
		out, _, err = runCLI(t, adminEnv(), "accounts", "import", "-url", url, keyFile)
		require.NoError(t, err)
		assert.Contains(t, out, "1 skipped")

		// Bad input fails before anything is sent.
		bad := filepath.Join(dir, "bad.json")
		require.NoError(t, os.WriteFile(bad, []byte(`{"tokens":{"access_token":"secret-opaque"}}`), 0o600))
		_, _, err = runCLI(t, adminEnv(), "accounts", "import", "-url", url, bad)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no ChatGPT account id")
		assert.NotContains(t, err.Error(), "secret-opaque")
		_, _, err = runCLI(t, adminEnv(), "accounts", "import", "-url", url)
		assert.Error(t, err)
	})
}

// add, list (table and JSON), pause, resume, remove; API errors print the
// API's message.
func TestAccountsLifecycle(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		url := adminAPI(t, s)
		env := adminEnv("CODEX_RELAY_URL", url, "CODEX_RELAY_ACCOUNT_API_KEY", "sk-team-secret")
		out, _, err := runCLI(t, env, "accounts", "add", "-label", "team", "-base-url", "http://127.0.0.1:9/v1", "-org", "org-a", "-tags", "blue,red", "-priority", "5")
		require.NoError(t, err)
		assert.Contains(t, out, "added team as account acc_")
		assert.NotContains(t, out, "sk-team-secret")

		keyFile := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(keyFile, []byte("sk-compat-secret\n"), 0o600))
		out, _, err = runCLI(t, adminEnv("CODEX_RELAY_URL", url), "accounts", "add", "-kind", "compatible", "-label", "other", "-base-url", "http://127.0.0.1:9/v1", "-api-key-file", keyFile, "-json")
		require.NoError(t, err)
		var created map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &created))
		assert.Equal(t, "compatible", created["kind"])
		cred, err := s.Credentials(context.Background(), created["id"].(string))
		require.NoError(t, err)
		assert.Equal(t, "sk-compat-secret", cred.APIKey)

		out, _, err = runCLI(t, env, "accounts", "list")
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3)
		assert.Regexp(t, `^ID\s+KIND\s+LABEL\s+WORKSPACE\s+PLAN\s+STATUS\s+UNTIL\s+5H\s+WEEK\s+PRIO\s+PROXY\s+REASON$`, lines[0])
		col := strings.Index(lines[0], "STATUS")
		for _, l := range lines[1:] {
			assert.Equal(t, "active", strings.Fields(l[col:])[0], "columns are aligned: %q", l)
		}
		assert.Contains(t, lines[1], "team", "higher priority first")

		out, _, err = runCLI(t, env, "accounts", "list", "-json")
		require.NoError(t, err)
		var listed []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &listed))
		require.Len(t, listed, 2)
		id := listed[0]["id"].(string)
		assert.Equal(t, []any{"blue", "red"}, listed[0]["tags"])

		out, _, err = runCLI(t, env, "accounts", "pause", id, "-reason", "maintenance window")
		require.NoError(t, err)
		assert.Contains(t, out, "paused "+id)
		a, err := s.Account(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusPaused, a.Status)
		assert.Equal(t, "maintenance window", a.StatusReason)
		out, _, err = runCLI(t, env, "accounts", "list")
		require.NoError(t, err)
		assert.Contains(t, out, "paused")
		assert.Contains(t, out, "maintenance window")

		_, _, err = runCLI(t, env, "accounts", "resume", id)
		require.NoError(t, err)
		a, err = s.Account(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusActive, a.Status)

		out, _, err = runCLI(t, env, "accounts", "remove", id)
		require.NoError(t, err)
		assert.Contains(t, out, "removed "+id)
		_, err = s.Account(context.Background(), id)
		assert.ErrorIs(t, err, store.ErrNotFound)

		// The API's own messages; a removed account is no account.
		_, _, err = runCLI(t, env, "accounts", "pause", id)
		require.Error(t, err)
		assert.Equal(t, `accounts pause: no account with id or label "`+id+`"`, err.Error())
		_, _, err = runCLI(t, env, "accounts", "add", "-kind", "compatible", "-label", "x")
		require.Error(t, err)
		assert.Equal(t, "base_url: required for compatible accounts", err.Error())
		_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_ADMIN_TOKEN": "wrong-token", "CODEX_RELAY_URL": url}, "accounts", "list")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "admin token required")
		_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": url}, "accounts", "list")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "CODEX_RELAY_ADMIN_TOKEN is not set")
		_, _, err = runCLI(t, env, "accounts", "list", "-url", "not a url")
		assert.ErrorContains(t, err, "-url")
		_, _, err = runCLI(t, env, "accounts", "frobnicate")
		assert.ErrorContains(t, err, `unknown verb "frobnicate"`)
		_, _, err = runCLI(t, env, "accounts", "pause")
		assert.ErrorContains(t, err, "exactly one account ID")
	})
}

// A ChatGPT account from tokens in the environment: the workspace comes
// from the id token, and a second add of it is refused.
func TestAccountsAddChatGPT(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	url := adminAPI(t, s)
	id := testJWT(map[string]any{"email": "me@example.com", "https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "ws-env", "chatgpt_plan_type": "pro"}})
	env := adminEnv("CODEX_RELAY_URL", url, "CODEX_RELAY_ACCOUNT_ACCESS_TOKEN", "at-env", "CODEX_RELAY_ACCOUNT_REFRESH_TOKEN", "rt-env", "CODEX_RELAY_ACCOUNT_ID_TOKEN", id)
	out, _, err := runCLI(t, env, "accounts", "add", "-kind", "chatgpt")
	require.NoError(t, err)
	assert.Contains(t, out, "me@example.com (pro, ws-env)")
	accts, err := s.Accounts(context.Background())
	require.NoError(t, err)
	require.Len(t, accts, 1)
	assert.Equal(t, "ws-env", accts[0].ChatGPTAccountID)
	_, _, err = runCLI(t, env, "accounts", "add", "-kind", "chatgpt")
	assert.ErrorContains(t, err, "already account "+accts[0].ID)
	_, _, err = runCLI(t, adminEnv("CODEX_RELAY_URL", url), "accounts", "add", "-kind", "chatgpt")
	assert.Error(t, err, "no tokens")
}

// The device-code login against the sim: the command shows the code, the
// test approves it through the sim's control API, and the account is added;
// without approval it times out cleanly.
func TestAccountsLogin(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	url := adminAPI(t, s)
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "alice", Kind: sim.KindChatGPT, AccessToken: "at-alice", RefreshToken: "rt-alice", ChatGPTAccountID: "cg-alice", Email: "alice@example.com", Organization: "org-a"},
	}})
	defer upstream.Close()
	require.NoError(t, upstream.SetDeviceLogin(0, 0))
	env := adminEnv("CODEX_RELAY_URL", url, "CODEX_RELAY_AUTH_URL", upstream.URL)

	var out, errOut logbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"accounts", "login", "-base-url", upstream.CodexBaseURL(), "-tags", "team"},
			cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }})
	}()
	codeRE := regexp.MustCompile(`Enter the code ([A-Z0-9]{4}-[A-Z0-9]{4})`)
	var code string
	require.Eventually(t, func() bool {
		if m := codeRE.FindStringSubmatch(out.String()); m != nil {
			code = m[1]
			return true
		}
		return false
	}, time.Minute, 10*time.Millisecond, "the command shows a code: %s", out.String())
	assert.Contains(t, out.String(), "Open "+upstream.URL+"/codex/device")
	resp, err := http.Post(upstream.ControlURL()+"/deviceauth/approve", "application/json",
		strings.NewReader(`{"user_code":"`+code+`","account":"alice"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	select {
	case err := <-done:
		require.NoError(t, err, errOut.String())
	case <-time.After(30 * time.Second):
		t.Fatal("login did not finish after the approval")
	}
	assert.Contains(t, out.String(), "Signed in as alice@example.com")
	assert.Contains(t, out.String(), "1 added")
	accts, err := s.Accounts(context.Background())
	require.NoError(t, err)
	require.Len(t, accts, 1)
	assert.Equal(t, "cg-alice", accts[0].ChatGPTAccountID)
	assert.Equal(t, upstream.CodexBaseURL(), accts[0].BaseURL)
	assert.Equal(t, []string{"team"}, accts[0].Tags)
	cred, err := s.Credentials(context.Background(), accts[0].ID)
	require.NoError(t, err)
	st, _ := upstream.Account("alice")
	assert.Equal(t, st.RefreshToken, cred.RefreshToken, "the login's tokens are stored")
	assert.NotContains(t, out.String(), cred.RefreshToken)

	// No approval: a clean timeout, nothing added.
	start := time.Now()
	_, _, err = runCLI(t, env, "accounts", "login", "-timeout", "300ms")
	require.ErrorContains(t, err, "not approved in time")
	assert.Less(t, time.Since(start), 10*time.Second)
	accts, err = s.Accounts(context.Background())
	require.NoError(t, err)
	assert.Len(t, accts, 1)
	http.DefaultClient.CloseIdleConnections()
}

func TestAdminCommandsHelp(t *testing.T) {
	for cmd, verbs := range map[string][]string{"accounts": accountVerbs, "keys": keyVerbs} {
		_, errOut, err := runCLI(t, cliEnv{}, cmd, "--help")
		assert.ErrorIs(t, err, flag.ErrHelp)
		for _, v := range verbs {
			assert.Contains(t, errOut, "  "+v+" ")
		}
		_, _, err = runCLI(t, cliEnv{}, cmd)
		assert.ErrorContains(t, err, "missing verb")
		for _, v := range verbs {
			_, errOut, err := runCLI(t, cliEnv{}, cmd, v, "--help")
			assert.ErrorIs(t, err, flag.ErrHelp, "%s %s", cmd, v)
			assert.Contains(t, errOut, "Usage: codex-relay "+cmd+" "+v)
			if v == "codex-auth" {
				// Writes a file's contents; asks the relay nothing.
				assert.NotContains(t, errOut, "-url")
				continue
			}
			assert.Contains(t, errOut, "CODEX_RELAY_ADMIN_TOKEN")
			assert.Contains(t, errOut, "-url")
		}
	}
}
