package main

import (
	"context"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func TestBindingsCommand(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "alpha", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		b, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "beta", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		for _, p := range []store.Placement{
			{ThreadKey: "k-t1", SessionKey: "k-s1", SessionID: "s1", ThreadID: "t1", AccountID: a.ID, SeedSession: true},
			{ThreadKey: "k-t2", SessionKey: "k-s1", SessionID: "s1", ThreadID: "t2", AccountID: a.ID},
			{ThreadKey: "k-t3", SessionID: "s2", ThreadID: "t3", AccountID: b.ID},
		} {
			p.Source, p.TTL = "admission", time.Hour
			require.NoError(t, s.Place(ctx, p))
		}
		_, err = s.Pin(ctx, store.BindRawThread, "t-pinned", b.ID, "pin")
		require.NoError(t, err)
		env := adminEnv("CODEX_RELAY_URL", adminAPI(t, s))

		out, _, err := runCLI(t, env, "bindings", "list")
		require.NoError(t, err)
		assert.Contains(t, out, "ID  ")
		assert.Contains(t, out, "raw_thread (pin)")
		assert.Contains(t, out, "t-pinned")
		assert.Contains(t, out, "never", "a pin does not expire")
		assert.Contains(t, out, "5 bindings")

		out, _, err = runCLI(t, env, "bindings", "list", "-thread", "t1")
		require.NoError(t, err)
		assert.Contains(t, out, "  t1  ")
		assert.NotContains(t, out, "  t2  ")
		assert.Contains(t, out, "1 binding\n")

		out, _, err = runCLI(t, env, "bindings", "list", "-account", b.ID, "-json")
		require.NoError(t, err)
		var page struct {
			Bindings []map[string]any `json:"bindings"`
			Total    int              `json:"total"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		assert.Equal(t, 2, page.Total)

		out, _, err = runCLI(t, env, "bindings", "list", "-session", "s1", "-limit", "1")
		require.NoError(t, err)
		assert.Contains(t, out, "1-1 of 3 bindings; more with -offset 1")

		out, _, err = runCLI(t, env, "bindings", "list", "-thread", "nope")
		require.NoError(t, err)
		assert.Equal(t, "No bindings match.\n", out)

		out, _, err = runCLI(t, env, "bindings", "reset", "-thread", "t1")
		require.NoError(t, err)
		assert.Equal(t, "Reset 1 binding of thread t1.\n", out)
		out, _, err = runCLI(t, env, "bindings", "reset", "-session", "s1", "-json")
		require.NoError(t, err)
		assert.JSONEq(t, `{"reset":2}`, out, "t2 and the session preference")
		rows, _, err := s.Bindings(ctx, store.BindingFilter{Kind: store.BindRawThread})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		out, _, err = runCLI(t, env, "bindings", "reset", "-id", rows[0].ID)
		require.NoError(t, err)
		assert.Equal(t, "Reset binding "+rows[0].ID+".\n", out)
		out, _, err = runCLI(t, env, "bindings", "reset", "-account", a.ID)
		require.NoError(t, err)
		assert.Equal(t, "Nothing to reset: no binding of account "+a.ID+".\n", out)
		_, total, err := s.Bindings(ctx, store.BindingFilter{})
		require.NoError(t, err)
		assert.Equal(t, 1, total, "only t3 is left")

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "binding.reset"})
		require.NoError(t, err)
		require.Len(t, entries, 4)
		assert.Equal(t, "admin-token", entries[0].Actor, "the command acts with the admin token")
		assert.Equal(t, "thread:t1", entries[3].Target)
	})
}

func TestBindingsCommandErrors(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	base := adminAPI(t, s)
	env := adminEnv("CODEX_RELAY_URL", base)

	_, _, err := runCLI(t, env, "bindings", "reset")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exactly one of -id, -thread, -session, -account")
	_, _, err = runCLI(t, env, "bindings", "reset", "-thread", "t", "-session", "s")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exactly one")

	_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": base}, "bindings", "list")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CODEX_RELAY_ADMIN_TOKEN is not set")
	_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": base, "CODEX_RELAY_ADMIN_TOKEN": "wrong"}, "bindings", "list")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin token required")
	_, _, err = runCLI(t, env, "bindings", "list", "-kind", "soft")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kind: must be")
	_, _, err = runCLI(t, adminEnv(), "bindings", "list", "-url", base)
	require.NoError(t, err, "-url works without CODEX_RELAY_URL")
	_, _, err = runCLI(t, adminEnv(), "bindings", "list", "-url", "http://127.0.0.1:1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot reach the relay")

	_, errOut, err := runCLI(t, env, "bindings")
	require.Error(t, err)
	assert.Contains(t, errOut, "reset")
	_, errOut, err = runCLI(t, env, "bindings", "reset", "-help")
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.True(t, strings.Contains(errOut, "-thread") && strings.Contains(errOut, "CODEX_RELAY_ADMIN_TOKEN"))
}
