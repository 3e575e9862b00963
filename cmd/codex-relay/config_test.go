package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
)

// Logs are text on a terminal and JSON otherwise (auto), or as asked.
func TestNewLoggerFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format string
		json   bool
	}{{"auto", true}, {"json", true}, {"text", false}} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, tc.format, "info")
		require.NoError(t, err)
		log.Info("hello", "k", "v")
		var m map[string]any
		assert.Equal(t, tc.json, json.Unmarshal(buf.Bytes(), &m) == nil, "format %s: %q", tc.format, buf.String())
		if !tc.json {
			assert.Contains(t, buf.String(), "msg=hello")
		}
	}
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "warn")
	require.NoError(t, err)
	log.Info("quiet")
	assert.Empty(t, buf.String(), "below the level")
	_, err = newLogger(&buf, "json", "loud")
	assert.Error(t, err)
}

// An operator-chosen admin token under 16 characters stops serve and demo
// before they open the database, whichever way it was given: the variable,
// its _FILE, or admin_token in the configuration file. The error names the
// variable and the minimum.
func TestShortAdminTokenStopsServeAndDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "admin_token", "fifteen-chars!!\n", 0o600)
	configFile := writeFile(t, dir, "relay.yaml", "admin_token: abc\n", 0o600)
	for _, form := range []struct {
		name string
		env  map[string]string
		args []string
		len  int
	}{
		{"variable", map[string]string{"CODEX_RELAY_ADMIN_TOKEN": "short-token"}, nil, 11},
		{"file", map[string]string{"CODEX_RELAY_ADMIN_TOKEN_FILE": tokenFile}, nil, 15},
		{"config file", nil, []string{"-config", configFile}, 3},
	} {
		for _, cmd := range []string{"serve", "demo"} {
			t.Run(form.name+"/"+cmd, func(t *testing.T) {
				t.Parallel()
				db := filepath.Join(t.TempDir(), "relay.db")
				env := map[string]string{"CODEX_RELAY_DATABASE_URL": db, "CODEX_RELAY_ADDR": "127.0.0.1:0"}
				maps.Copy(env, form.env)
				var out, errOut logbuf.Buffer
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				err := run(ctx, append(slices.Clone(form.args), cmd), cli{stdout: &out, stderr: &errOut,
					getenv: func(k string) string { return env[k] }, listening: func(string) { cancel() }})
				require.Error(t, err, "it must not start (and serve until stopped)")
				assert.Contains(t, err.Error(), "CODEX_RELAY_ADMIN_TOKEN")
				assert.Contains(t, err.Error(), fmt.Sprintf("has %d characters: it needs at least 16", form.len))
				assert.NoFileExists(t, db, "refused before the database was opened")
				assert.NotContains(t, out.String(), "Admin token", "no token generated instead")
			})
		}
	}
	ok := func(v string) error {
		return checkAdminToken(cli{getenv: func(k string) string { return map[string]string{"CODEX_RELAY_ADMIN_TOKEN": v}[k] }})
	}
	assert.NoError(t, ok(strings.Repeat("x", 16)), "16 characters are enough")
	assert.Error(t, ok(strings.Repeat("x", 15)))
	assert.NoError(t, ok(""), "unset: one is generated")
}

// The single sign-on's settings: none without an issuer; an issuer
// without a client id, a public URL or a role map is refused, naming what
// is missing.
func TestOIDCSettings(t *testing.T) {
	t.Parallel()
	full := cliEnv{"CODEX_RELAY_OIDC_ISSUER": "https://id.example.com", "CODEX_RELAY_OIDC_CLIENT_ID": "relay",
		"CODEX_RELAY_OIDC_CLIENT_SECRET": "s3cret", "CODEX_RELAY_OIDC_ROLES": "admin=ops,viewer=*",
		"CODEX_RELAY_PUBLIC_URL": "https://relay.example.com/"}
	with := func(k, v string) cli {
		env := cliEnv{}
		for kk, vv := range full {
			env[kk] = vv
		}
		env[k] = v
		return cli{getenv: func(k string) string { return env[k] }}
	}
	o, err := oidcSettings(with("X", ""))
	require.NoError(t, err)
	require.NotNil(t, o)
	assert.Equal(t, "https://relay.example.com", o.PublicURL, "the trailing slash goes")
	assert.Equal(t, "groups", o.RoleClaim, "the default claim")
	assert.Equal(t, "s3cret", o.ClientSecret)
	none, err := oidcSettings(with("CODEX_RELAY_OIDC_ISSUER", ""))
	require.NoError(t, err)
	assert.Nil(t, none, "no issuer: no single sign-on")
	for k, says := range map[string]string{
		"CODEX_RELAY_OIDC_CLIENT_ID": "CODEX_RELAY_OIDC_CLIENT_ID is not",
		"CODEX_RELAY_PUBLIC_URL":     "CODEX_RELAY_PUBLIC_URL is not",
		"CODEX_RELAY_OIDC_ROLES":     "CODEX_RELAY_OIDC_ROLES",
	} {
		_, err := oidcSettings(with(k, ""))
		assert.ErrorContains(t, err, says, k)
	}
}
