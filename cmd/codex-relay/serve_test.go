package main

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// withPasswords returns a PostgreSQL URL carrying canary passwords in its
// user info and as ?password=, and the canaries.
func withPasswords(t *testing.T, raw string) (string, []string) {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "userinfo-canary")
	q := u.Query()
	q.Set("password", "query-canary")
	u.RawQuery = q.Encode()
	return u.String(), []string{"userinfo-canary", "query-canary"}
}

// serve names its database at start, and in the error when it cannot open
// it, without the passwords of its URL.
func TestServeHidesTheDatabasePassword(t *testing.T) {
	t.Run("database that cannot be opened", func(t *testing.T) {
		dbURL, secrets := withPasswords(t, "postgres://relay@127.0.0.1:1/x?sslmode=disable")
		env := map[string]string{"CODEX_RELAY_DATABASE_URL": dbURL, "CODEX_RELAY_SECRET_KEY": "a-postgres-secret-key-for-tests"}
		var out, errOut logbuf.Buffer
		err := run(context.Background(), nil, cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "127.0.0.1:1", "the database is named")
		for _, s := range secrets {
			assert.NotContains(t, err.Error(), s)
			assert.NotContains(t, errOut.String(), s)
		}
	})
	t.Run("help and flag errors", func(t *testing.T) {
		dbURL, secrets := withPasswords(t, "postgres://relay@127.0.0.1:1/x?sslmode=disable")
		env := map[string]string{"CODEX_RELAY_DATABASE_URL": dbURL}
		for _, args := range [][]string{{"serve", "-help"}, {"serve", "-bogus"}, {"migrate", "-help"}} {
			var out, errOut logbuf.Buffer
			_ = run(context.Background(), args, cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }})
			assert.Contains(t, out.String()+errOut.String(), "-database-url", "%v prints the flags", args)
			for _, s := range secrets {
				assert.NotContains(t, out.String()+errOut.String(), s, "%v", args)
			}
		}
	})
	t.Run("listening", func(t *testing.T) {
		dbURL, secrets := withPasswords(t, storetest.PostgresURL(t))
		r := start(t, map[string]string{"CODEX_RELAY_DATABASE_URL": dbURL, "CODEX_RELAY_SECRET_KEY": "a-postgres-secret-key-for-tests",
			"CODEX_RELAY_ADMIN_TOKEN": "an-admin-token-from-the-env", "CODEX_RELAY_LOG_FORMAT": "text"})
		require.NoError(t, r.stop())
		assert.Contains(t, r.stderr.String(), "codex-relay listening")
		assert.Contains(t, r.stderr.String(), "xxxxx", "the database is named, its passwords hidden")
		for _, s := range secrets {
			assert.NotContains(t, r.stderr.String(), s)
			assert.NotContains(t, r.stdout.String(), s)
		}
	})
}

// The lane age limit is the operator's: CODEX_RELAY_LANE_MAX_AGE or
// -lane-max-age, 55 minutes by default, and never zero or at the
// upstream's 60-minute limit or past it.
func TestServeLaneMaxAge(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			env  string
			args []string
			want string
		}{
			{"0", nil, "must be above zero"},
			{"-5m", nil, "must be above zero"},
			{"60m", nil, "must be below the upstream's 60m connection limit"},
			{"2h", nil, "must be below the upstream's 60m connection limit"},
			{"soon", nil, "give a duration such as 55m"},
			{"", []string{"serve", "-lane-max-age", "61m"}, "-lane-max-age"},
		} {
			var out, errOut logbuf.Buffer
			env := map[string]string{"CODEX_RELAY_LANE_MAX_AGE": tc.env}
			err := run(context.Background(), tc.args, cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }})
			require.Error(t, err, "%q %v", tc.env, tc.args)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "CODEX_RELAY_LANE_MAX_AGE", "the message names the setting")
		}
	})
	for _, tc := range []struct{ env, want string }{{"", "55m0s"}, {"10m", "10m0s"}} {
		t.Run("serving with "+tc.want, func(t *testing.T) {
			r := start(t, map[string]string{"CODEX_RELAY_DATABASE_URL": filepath.Join(t.TempDir(), "relay.db"),
				"CODEX_RELAY_ADMIN_TOKEN": "an-admin-token-from-the-env", "CODEX_RELAY_LOG_FORMAT": "text", "CODEX_RELAY_LANE_MAX_AGE": tc.env})
			require.NoError(t, r.stop())
			assert.Contains(t, r.stderr.String(), "lane_max_age="+tc.want)
		})
	}
}
