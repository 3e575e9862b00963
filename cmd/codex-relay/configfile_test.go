package main

import (
	"bytes"
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeFile writes content to name in dir with mode and returns its path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode)) // past the umask
	return p
}

// A setting's value comes from, in order: the flag, the environment, the
// file its _FILE variable names, the configuration file, the default. Each
// case adds one layer above the previous ones and must see that layer win.
func TestSettingPrecedence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeFile(t, dir, "relay.yaml", "addr: config:1\nlog_level: warn\n", 0o600)
	secretFile := writeFile(t, dir, "addr", "  file:2\n\n", 0o644)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, nil, "default:0"},
		{"config file over the default", nil, []string{"-config", cfg}, "config:1"},
		{"config file named by CODEX_RELAY_CONFIG", map[string]string{"CODEX_RELAY_CONFIG": cfg}, nil, "config:1"},
		{"_FILE over the config file", map[string]string{"CODEX_RELAY_ADDR_FILE": secretFile}, []string{"-config", cfg}, "file:2"},
		{"a blank variable does not hide the _FILE", map[string]string{"CODEX_RELAY_ADDR": "  ", "CODEX_RELAY_ADDR_FILE": secretFile}, []string{"-config", cfg}, "file:2"},
		{"environment over _FILE", map[string]string{"CODEX_RELAY_ADDR": "env:3", "CODEX_RELAY_ADDR_FILE": secretFile}, []string{"-config", cfg}, "env:3"},
		{"flag over the environment", map[string]string{"CODEX_RELAY_ADDR": "env:3", "CODEX_RELAY_ADDR_FILE": secretFile}, []string{"-config=" + cfg, "-addr", "flag:4"}, "flag:4"},
		{"-config after the flags", map[string]string{"CODEX_RELAY_ADDR_FILE": secretFile}, []string{"-addr", "flag:4", "--config", cfg}, "flag:4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, c, err := configure(tc.args, cli{stderr: io.Discard, getenv: func(k string) string { return tc.env[k] }})
			require.NoError(t, err)
			// What every command does: flags whose defaults come from the settings.
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			addr := fs.String("addr", envOr(c, "CODEX_RELAY_ADDR", "default:0"), "")
			require.NoError(t, fs.Parse(args))
			assert.Equal(t, tc.want, *addr)
			assert.Empty(t, fs.Args(), "-config was taken out of the arguments")
		})
	}
}

// The same precedence reaches a real command: migrate reports the database it
// opened, whichever layer named it.
func TestSettingPrecedenceReachesCommands(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // were a layer lost, the default database would land here
	db := func(name string) string { return filepath.Join(dir, name, "codex-relay.db") }
	cfg := writeFile(t, dir, "relay.yaml", "database_url: "+db("from-config")+"\n", 0o644)
	urlFile := writeFile(t, dir, "database_url", db("from-file")+"\n", 0o600)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"config file", nil, []string{"-config", cfg, "migrate"}, "from-config"},
		{"_FILE", map[string]string{"CODEX_RELAY_DATABASE_URL_FILE": urlFile}, []string{"-config", cfg, "migrate"}, "from-file"},
		{"environment", map[string]string{"CODEX_RELAY_DATABASE_URL_FILE": urlFile, "CODEX_RELAY_DATABASE_URL": db("from-env")}, []string{"migrate", "-config", cfg}, "from-env"},
		{"flag", map[string]string{"CODEX_RELAY_DATABASE_URL": db("from-env")}, []string{"migrate", "-config", cfg, "-database-url", db("from-flag")}, "from-flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			c := cli{stdout: &out, stderr: io.Discard, getenv: func(k string) string { return tc.env[k] }}
			require.NoError(t, run(context.Background(), tc.args, c))
			assert.Contains(t, out.String(), filepath.Join(tc.want, "codex-relay.db"))
			assert.FileExists(t, db(tc.want))
		})
	}
}

// Secrets reach the code that reads them through the same getenv: the admin
// commands' token and the secret key, from _FILE variables.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "admin_token", "cra_from_a_file_0123456789\n", 0o400)
	keyFile := writeFile(t, dir, "secret_key", "a secret key of more than sixteen characters\n", 0o444)
	_, c, err := configure(nil, cli{getenv: func(k string) string {
		return map[string]string{"CODEX_RELAY_ADMIN_TOKEN_FILE": tokenFile, "CODEX_RELAY_SECRET_KEY_FILE": keyFile, "HTTPS_PROXY": "http://proxy:3128"}[k]
	}})
	require.NoError(t, err)
	api, err := newAPIClient(c, "http://127.0.0.1:2455")
	require.NoError(t, err)
	assert.Equal(t, "cra_from_a_file_0123456789", api.token, "trimmed")
	assert.Equal(t, "a secret key of more than sixteen characters", c.getenv("CODEX_RELAY_SECRET_KEY"))
	assert.Equal(t, "http://proxy:3128", c.getenv("HTTPS_PROXY"), "other variables pass through")
	assert.Empty(t, c.getenv("CODEX_RELAY_ADDR"))
}

func TestSettingFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := writeFile(t, dir, "empty", " \n\t\n", 0o600)
	big := writeFile(t, dir, "big", strings.Repeat("x", maxSettingFile+1), 0o600)
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"missing", filepath.Join(dir, "nope"), []string{"CODEX_RELAY_SECRET_KEY_FILE", "no such file"}},
		{"empty", empty, []string{"CODEX_RELAY_SECRET_KEY_FILE", empty, "is empty"}},
		{"a directory", dir, []string{"CODEX_RELAY_SECRET_KEY_FILE", "directory"}},
		{"too large", big, []string{"CODEX_RELAY_SECRET_KEY_FILE", "larger than"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"CODEX_RELAY_SECRET_KEY_FILE": tc.file}
			err := run(context.Background(), []string{"version"}, cli{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return env[k] }})
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// Set in the environment, the variable wins and its _FILE is not read.
	env := map[string]string{"CODEX_RELAY_SECRET_KEY": "set directly, sixteen+", "CODEX_RELAY_SECRET_KEY_FILE": empty}
	_, c, err := configure(nil, cli{getenv: func(k string) string { return env[k] }})
	require.NoError(t, err)
	assert.Equal(t, "set directly, sixteen+", c.getenv("CODEX_RELAY_SECRET_KEY"))
}

func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          []string
	}{
		{"unknown key", "addr: 127.0.0.1:2455\ndatabase_ulr: x.db\n", 0o600, []string{`unknown key "database_ulr"`, "line 2"}},
		{"a _file key", "admin_token_file: /run/secrets/t\n", 0o600, []string{`unknown key "admin_token_file"`, "CODEX_RELAY_ADMIN_TOKEN_FILE"}},
		{"a variable's own name", "CODEX_RELAY_ADDR: x\n", 0o600, []string{`unknown key "CODEX_RELAY_ADDR"`}},
		{"repeated key", "addr: a:1\naddr: b:2\n", 0o600, []string{`key "addr" given twice`}},
		{"a list", "addr: [a, b]\n", 0o600, []string{`key "addr": want a single value`}},
		{"not a mapping", "- addr\n", 0o600, []string{"want a mapping"}},
		{"two documents", "addr: a:1\n---\naddr: b:2\n", 0o600, []string{"one YAML document"}},
		{"not YAML", "addr: [\n", 0o600, []string{"relay.yaml"}},
		{"a secret other users can read", "log_level: info\nsecret_key: 0123456789abcdef0123\n", 0o644, []string{"secret_key", "other users can read it", "chmod 600", "CODEX_RELAY_SECRET_KEY_FILE"}},
		{"a database password other users can read", "database_url: postgres://relay:hunter2@db/relay\n", 0o604, []string{"database_url", "other users can read it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, t.TempDir(), "relay.yaml", tc.content, tc.mode)
			err := run(context.Background(), []string{"-config", p, "version"}, cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	// What is allowed: secrets in a file only its owner (and group) reads, a
	// password-less database URL in a readable one, null values, an empty file.
	for name, tc := range map[string]struct {
		content string
		mode    os.FileMode
	}{
		"secret, private":             {"secret_key: 0123456789abcdef0123\nadmin_token: cra_x\n", 0o640},
		"no secret, readable":         {"database_url: /data/codex-relay.db\naddr: 0.0.0.0:2455\n", 0o644},
		"null leaves a setting unset": {"fallback_model:\nretention: ~\n", 0o644},
		"empty":                       {"", 0o644},
		"comments only":               {"# nothing yet\n", 0o644},
	} {
		p := writeFile(t, dir, strings.ReplaceAll(name, " ", "_")+".yaml", tc.content, tc.mode)
		err := run(context.Background(), []string{"version", "-config", p}, cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
		assert.NoError(t, err, name)
	}
	for _, args := range [][]string{{"-config"}, {"-config", ""}, {"-config", "a.yaml", "-config=b.yaml"}, {"-config", filepath.Join(dir, "absent.yaml")}} {
		err := run(context.Background(), append(args, "version"), cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
		assert.Error(t, err, "%q", args)
	}
}

// A "--" ends the flags: what follows is never taken for -config.
func TestSplitConfigFlag(t *testing.T) {
	t.Parallel()
	path, rest, err := splitConfigFlag([]string{"accounts", "-config", "c.yaml", "list", "--", "-config", "x"})
	require.NoError(t, err)
	assert.Equal(t, "c.yaml", path)
	assert.Equal(t, []string{"accounts", "list", "--", "-config", "x"}, rest)
	path, rest, err = splitConfigFlag([]string{"serve", "-configuration", "x"})
	require.NoError(t, err)
	assert.Empty(t, path)
	assert.Equal(t, []string{"serve", "-configuration", "x"}, rest)
}

// Every CODEX_RELAY_* variable a command reads is a setting, so it has a
// configuration file key and a _FILE form; the README's configuration table
// documents each one.
func TestEverySettingIsListedAndDocumented(t *testing.T) {
	t.Parallel()
	// Not settings: the file of settings itself, and the variable Codex (not
	// the relay) reads its client key from, printed in config blocks.
	notSettings := map[string]bool{configEnv: true, "CODEX_RELAY_KEY": true}
	variable := regexp.MustCompile(`^CODEX_RELAY_[A-Z0-9_]+$`)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	read := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && variable.MatchString(s) && !notSettings[s] {
					read[s] = true
				}
			}
			return true
		})
	}
	require.NotEmpty(t, read)
	listed := map[string]bool{}
	for _, s := range settings {
		listed[s.env] = true
	}
	var missing []string
	for v := range read {
		if !listed[v] {
			missing = append(missing, v)
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "variables read by a command but missing from settings (settings.go)")

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, s := range settings {
		assert.True(t, strings.Contains(string(readme), "`"+s.env+"`"), "README documents %s", s.env)
		assert.True(t, strings.Contains(string(readme), "`"+s.key()+"`"), "README names the config key %s of %s", s.key(), s.env)
	}
}
