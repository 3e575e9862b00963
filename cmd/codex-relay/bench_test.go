package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/relay/store"
)

// bench runs real conversations direct and through the relay on both
// transports and reports every turn; nothing is left running afterwards.
// (Not parallel: it counts the process's goroutines.)
func TestBenchMeasuresBothTargetsOnBothTransports(t *testing.T) {
	out, errOut, err := runCLI(t, cliEnv{}, "bench", "-conversations", "3", "-turns", "2", "-words", "5", "-accounts", "2", "-json")
	require.NoError(t, err, errOut)
	var rep benchReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Rows, 4)
	seen := map[string]bool{}
	for _, row := range rep.Rows {
		seen[row.Transport+"/"+row.Target] = true
		assert.Equal(t, 6, row.Turns, "%+v", row)
		assert.Zero(t, row.Errors, row.FirstError)
		assert.Positive(t, row.FirstToken.P50)
		assert.LessOrEqual(t, row.FirstToken.P50, row.Turn.P50, "the first token comes before the turn ends")
		assert.LessOrEqual(t, row.Turn.P50, row.Turn.Max)
		assert.Positive(t, row.PerSecond)
		assert.Positive(t, row.AllocBytes)
	}
	assert.Equal(t, map[string]bool{"http/direct": true, "http/relay": true, "ws/direct": true, "ws/relay": true}, seen)
	require.Len(t, rep.Overhead, 2)
	assert.Equal(t, "http", rep.Overhead[0].Transport)
	assert.Equal(t, "ws", rep.Overhead[1].Transport)
	assert.LessOrEqual(t, rep.Goroutines.After, rep.Goroutines.Before, "every goroutine the bench started ended")

	// The table names every row and the relay's added cost.
	out, errOut, err = runCLI(t, cliEnv{}, "bench", "-conversations", "1", "-turns", "1", "-words", "3", "-transport", "ws")
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "relay adds over ws")
	assert.NotContains(t, out, "relay adds over http")
	assert.NotContains(t, out, "first error")
}

func TestBenchRefusesBadOptions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-conversations", "0"},
		{"-turns", "-1"},
		{"-words", "100000"},
		{"-transport", "grpc"},
		{"-turn-timeout", "0s"},
		{"extra"},
	} {
		_, _, err := runCLI(t, cliEnv{}, append([]string{"bench"}, args...)...)
		assert.Error(t, err, "%v", args)
	}
}

// bench adds accounts of its own: a database that holds accounts (an
// operator's) is refused, untouched.
func TestBenchRefusesADatabaseWithAccounts(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "in-use.db")
	env := cliEnv{"CODEX_RELAY_SECRET_KEY": "a-secret-key-for-this-test"}
	c := cli{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return env[k] }}
	st, _, err := openStoreWithKey(context.Background(), c, dbFlags{databaseURL: db}, slog.New(slog.DiscardHandler), false)
	require.NoError(t, err)
	_, err = st.CreateAccount(context.Background(), store.Account{Kind: store.KindOpenAI, Label: "production"}, store.Credentials{APIKey: "sk-real"})
	require.NoError(t, err)
	require.NoError(t, st.Close())

	_, _, err = runCLI(t, env, "bench", "-database-url", db, "-conversations", "1", "-turns", "1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "holds accounts")
}
