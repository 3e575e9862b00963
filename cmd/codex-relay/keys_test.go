package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

// keys create prints the key once with the Codex config block; the key
// works with its scope; list never shows it; revoke refuses it at once.
func TestKeysCommands(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		url := adminAPI(t, s)
		env := adminEnv("CODEX_RELAY_URL", url)
		acct, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "k", BaseURL: "http://127.0.0.1:9/v1", Tags: []string{"blue"}},
			store.Credentials{APIKey: "sk-x"})
		require.NoError(t, err)

		out, _, err := runCLI(t, env, "keys", "create", "-name", "laptop", "-accounts", acct.ID, "-models", "gpt-5.5-codex, gpt-5.4", "-expires-in", "720h")
		require.NoError(t, err)
		m := regexp.MustCompile(`export CODEX_RELAY_KEY=(crk_[0-9A-Za-z]+)`).FindStringSubmatch(out)
		require.NotNil(t, m, out)
		secret := m[1]
		assert.Contains(t, out, `base_url = "`+url+`/backend-api/codex"`)
		assert.Contains(t, out, `env_key = "CODEX_RELAY_KEY"`)
		assert.Contains(t, out, "shown once")
		assert.Contains(t, out, "(CODEX_HOME=~/.codex by default):\n\n"+web.CodexConfig(url),
			"the config block is the one the console shows with a new key")
		k, err := s.AuthenticateClientKey(ctx, secret)
		require.NoError(t, err, "the printed key authenticates")
		assert.Equal(t, "laptop", k.Name)
		assert.Equal(t, []string{acct.ID}, k.ScopeAccounts)
		assert.Equal(t, []string{"gpt-5.5-codex", "gpt-5.4"}, k.Models)
		assert.WithinDuration(t, time.Now().Add(720*time.Hour), k.ExpiresAt, time.Minute)

		out, _, err = runCLI(t, env, "keys", "create", "-name", "ci", "-tag", "blue", "-json")
		require.NoError(t, err)
		var created map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &created))
		assert.Equal(t, "blue", created["account_tag"])
		assert.True(t, strings.HasPrefix(created["key"].(string), "crk_"))

		out, _, err = runCLI(t, env, "keys", "list")
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3)
		assert.Regexp(t, `^ID\s+NAME\s+PREFIX\s+SCOPE\s+MODELS\s+EXPIRES\s+REQUESTS\s+LAST USED\s+STATE$`, lines[0])
		assert.NotContains(t, out, secret, "a key is shown once")
		assert.Contains(t, out, "tag:blue")
		col := strings.Index(lines[0], "STATE")
		for _, l := range lines[1:] {
			assert.Equal(t, "active", strings.TrimSpace(l[col:]), "columns are aligned: %q", l)
		}

		out, _, err = runCLI(t, env, "keys", "list", "-json")
		require.NoError(t, err)
		var listed []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &listed))
		require.Len(t, listed, 2)
		for _, l := range listed {
			assert.NotContains(t, l, "key")
		}

		out, _, err = runCLI(t, env, "keys", "revoke", k.ID)
		require.NoError(t, err)
		assert.Contains(t, out, "revoked "+k.ID)
		_, err = s.AuthenticateClientKey(ctx, secret)
		assert.ErrorIs(t, err, store.ErrKeyRejected, "refused at once")
		out, _, err = runCLI(t, env, "keys", "list")
		require.NoError(t, err)
		assert.Contains(t, out, "revoked")

		// The API's messages.
		_, _, err = runCLI(t, env, "keys", "create", "-name", "x", "-accounts", "acc_missing")
		assert.EqualError(t, err, `keys create: -accounts: no account with id or label "acc_missing"`)
		_, _, err = runCLI(t, env, "keys", "create", "-name", "x", "-accounts", acct.ID, "-tag", "blue")
		assert.EqualError(t, err, "account_tag: give account_ids or account_tag, not both")
		_, _, err = runCLI(t, env, "keys", "create")
		assert.ErrorContains(t, err, "-name is required")
		_, _, err = runCLI(t, env, "keys", "revoke", "key_missing")
		assert.EqualError(t, err, `keys revoke: no client key with id or name "key_missing"`)
	})
}

// keys create -limits sets a key's limits; keys limits shows each with its
// use and reset, replaces them with -set and removes them with -clear.
func TestKeysLimitsCommand(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		url := adminAPI(t, s)
		env := adminEnv("CODEX_RELAY_URL", url)
		out, _, err := runCLI(t, env, "keys", "create", "-name", "team", "-limits", "tokens/5h=2000000, cost_usd/month=50,concurrent=2", "-json")
		require.NoError(t, err)
		var created map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &created))
		id := created["id"].(string)
		k, err := s.ClientKey(ctx, id)
		require.NoError(t, err)
		require.Len(t, k.Limits, 3)
		assert.Equal(t, "tokens/5h", k.Limits[0].Name())
		assert.Equal(t, 50.0, k.Limits[1].Max)
		require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ID: "req_1", ClientKeyID: id, Transport: "http", Path: "/v1/responses",
			Status: 200, StartedAt: time.Now(), TotalTokens: 500000, CostNanos: 12_340_000_000, Charged: true}, nil))

		out, _, err = runCLI(t, env, "keys", "limits", id)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 4, out)
		assert.Regexp(t, `^LIMIT\s+USED\s+MAX\s+IN FLIGHT\s+USE\s+RESETS$`, lines[0])
		assert.Regexp(t, `^tokens/5h\s+500000\s+2000000\s+0\s+25\.0%\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, lines[1])
		assert.Regexp(t, `^cost_usd/month\s+12\.34\s+50\s+0\s+24\.7%\s+\d{4}-`, lines[2])
		assert.Regexp(t, `^concurrent\s+0\s+2\s+0\s+0\.0%\s+-$`, lines[3])

		out, _, err = runCLI(t, env, "keys", "limits", id, "-set", "requests/minute=60")
		require.NoError(t, err)
		assert.Contains(t, out, "requests/minute")
		assert.NotContains(t, out, "tokens/5h", "replaced")
		out, _, err = runCLI(t, env, "keys", "limits", id, "-clear")
		require.NoError(t, err)
		assert.Contains(t, out, "has no limits")
		k, err = s.ClientKey(ctx, id)
		require.NoError(t, err)
		assert.Empty(t, k.Limits)

		_, _, err = runCLI(t, env, "keys", "limits", id, "-set", "tokens/year=5")
		assert.ErrorContains(t, err, "limits: limit 1: window must be one of minute, 5h, day, week, month")
		_, _, err = runCLI(t, env, "keys", "limits", id, "-set", "tokens")
		assert.ErrorContains(t, err, "limits: line 1: write metric/window=max")
		_, _, err = runCLI(t, env, "keys", "limits", id, "-set", "x=1", "-clear")
		assert.ErrorContains(t, err, "not both")
	})
}

// A cost_usd limit on a key whose models the price table does not price
// warns on stderr, from keys create and keys limits -set alike; stdout
// stays the answer (JSON here) alone.
func TestKeysCostLimitWarns(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		env := adminEnv("CODEX_RELAY_URL", adminAPI(t, s))
		out, errOut, err := runCLI(t, env, "keys", "create", "-name", "capped", "-models", "gpt-5.5-codex", "-limits", "cost_usd/day=1", "-json")
		require.NoError(t, err)
		var created map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &created), "stdout is the JSON alone")
		id := created["id"].(string)
		assert.Contains(t, errOut, "warning: key "+id+" (capped): the price table does not price gpt-5.5-codex")

		_, errOut, err = runCLI(t, env, "keys", "limits", id, "-set", "tokens/day=5")
		require.NoError(t, err)
		assert.NotContains(t, errOut, "warning", "no cost limit: nothing to warn of")
		_, errOut, err = runCLI(t, env, "keys", "limits", id, "-set", "cost_usd/month=5")
		require.NoError(t, err)
		assert.Contains(t, errOut, "gpt-5.5's prices (the table's fallback_model)")
	})
}

// keys codex-auth prints the auth.json of a ChatGPT sign-in through the
// relay: the key from the environment as the access token, an ID token
// whose claims name the relay's workspace, a fresh last refresh. No key,
// or something that is no client key, is refused.
func TestKeysCodexAuth(t *testing.T) {
	out, _, err := runCLI(t, cliEnv{"CODEX_RELAY_KEY": " crk_abc123 "}, "keys", "codex-auth")
	require.NoError(t, err)
	var auth struct {
		Mode        string  `json:"auth_mode"`
		APIKey      *string `json:"OPENAI_API_KEY"`
		LastRefresh string  `json:"last_refresh"`
		Tokens      struct {
			IDToken     string `json:"id_token"`
			AccessToken string `json:"access_token"`
			AccountID   string `json:"account_id"`
		} `json:"tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &auth), out)
	assert.Equal(t, "chatgpt", auth.Mode)
	assert.Nil(t, auth.APIKey)
	assert.Equal(t, "crk_abc123", auth.Tokens.AccessToken)
	assert.Equal(t, "relay", auth.Tokens.AccountID)
	refreshed, err := time.Parse(time.RFC3339, auth.LastRefresh)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), refreshed, time.Minute)
	parts := strings.Split(auth.Tokens.IDToken, ".")
	require.Len(t, parts, 3)
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var claims struct {
		Email string `json:"email"`
		Auth  struct {
			Account string `json:"chatgpt_account_id"`
			Plan    string `json:"chatgpt_plan_type"`
		} `json:"https://api.openai.com/auth"`
	}
	require.NoError(t, json.Unmarshal(raw, &claims))
	assert.Equal(t, "relay", claims.Auth.Account)
	assert.NotEmpty(t, claims.Auth.Plan)
	assert.NotEmpty(t, claims.Email)

	for _, key := range []string{"", "sk-not-a-client-key"} {
		_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_KEY": key}, "keys", "codex-auth")
		assert.ErrorContains(t, err, "set CODEX_RELAY_KEY to the client key")
	}
}
