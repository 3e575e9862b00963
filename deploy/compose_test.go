package deploy

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadCompose loads compose.yaml as docker compose does (schema validation,
// the x-relay anchor merged, paths resolved), with no variable set.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	wd, err := filepath.Abs(".")
	require.NoError(t, err)
	details := types.ConfigDetails{
		WorkingDir:  wd,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(wd, "compose.yaml")}},
		Environment: types.Mapping{},
	}
	p, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("codex-relay", true)
		o.ResolvePaths = true
	})
	require.NoError(t, err, "compose.yaml must load as docker compose loads it")
	return p
}

// flagValue returns the value of -name=VALUE in a command line.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
		if a == "-"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// deref returns *p, or "" for nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// The compose file runs PostgreSQL, two relay replicas sharing one secret key
// (a compose secret, read through CODEX_RELAY_SECRET_KEY_FILE), the admin
// token and database URL from secrets, each replica advertising its own URL,
// health checks on everything, and nginx in front.
func TestCompose(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)

	var relays []types.ServiceConfig
	for _, s := range p.Services {
		if s.Build != nil {
			relays = append(relays, s)
		}
	}
	require.Len(t, relays, 2, "two relay replicas")
	slices.SortFunc(relays, func(a, b types.ServiceConfig) int { return strings.Compare(a.Name, b.Name) })
	secretFile := map[string]string{} // secret name -> the file both replicas mount
	for name, s := range p.Secrets {
		secretFile[name] = s.File
	}
	advertised := map[string]bool{}
	for _, r := range relays {
		t.Run(r.Name, func(t *testing.T) {
			assert.Equal(t, filepath.Join(filepath.Dir(mustAbs(t, ".")), "Dockerfile"), filepath.Join(r.Build.Context, r.Build.Dockerfile), "built from the repository's Dockerfile")
			assert.Equal(t, relays[0].Image, r.Image, "one image for both")
			env := r.Environment
			mounted := map[string]string{} // path in the container -> secret
			for _, s := range r.Secrets {
				target := s.Target
				if target == "" {
					target = s.Source
				}
				if !strings.HasPrefix(target, "/") {
					target = "/run/secrets/" + target
				}
				mounted[target] = s.Source
			}
			for variable, secret := range map[string]string{
				"CODEX_RELAY_SECRET_KEY_FILE":   "secret_key",
				"CODEX_RELAY_ADMIN_TOKEN_FILE":  "admin_token",
				"CODEX_RELAY_DATABASE_URL_FILE": "database_url",
			} {
				path := deref(env[variable])
				require.NotEmpty(t, path, variable)
				assert.Equal(t, secret, mounted[path], "%s names the mounted secret %s", variable, secret)
				assert.NotEmpty(t, secretFile[secret], "secret %s comes from a file", secret)
				_, direct := env[strings.TrimSuffix(variable, "_FILE")]
				assert.False(t, direct, "%s is not also given in the clear", strings.TrimSuffix(variable, "_FILE"))
			}
			adv := deref(env["CODEX_RELAY_ADVERTISE_URL"])
			assert.Equal(t, "http://"+r.Name+":2455", adv, "each replica advertises the address the other reaches it at")
			advertised[adv] = true

			require.NotNil(t, r.HealthCheck, "a health check")
			assert.Equal(t, types.HealthCheckTest{"CMD", "/usr/local/bin/codex-relay", "healthcheck"}, r.HealthCheck.Test)
			require.Contains(t, r.DependsOn, "postgres")
			assert.Equal(t, types.ServiceConditionHealthy, r.DependsOn["postgres"].Condition)

			grace := flagValue(r.Command, "shutdown-timeout")
			require.NotEmpty(t, grace, "serve -shutdown-timeout")
			d, err := time.ParseDuration(grace)
			require.NoError(t, err)
			require.NotNil(t, r.StopGracePeriod)
			assert.Greater(t, time.Duration(*r.StopGracePeriod), d, "Docker waits longer than the relay drains")
			assert.True(t, r.ReadOnly, "read-only root file system")
		})
	}
	assert.Len(t, advertised, 2, "the replicas advertise different URLs")

	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	require.NotNil(t, pg.HealthCheck)
	assert.Contains(t, pg.HealthCheck.Test, "pg_isready")
	assert.Equal(t, "/run/secrets/postgres_password", deref(pg.Environment["POSTGRES_PASSWORD_FILE"]))

	proxy, err := p.GetService("proxy")
	require.NoError(t, err)
	var conf string
	for _, v := range proxy.Volumes {
		if v.Target == "/etc/nginx/nginx.conf" {
			conf = v.Source
		}
	}
	require.Equal(t, mustAbs(t, "nginx.conf"), conf, "the proxy runs deploy/nginx.conf")
	require.Len(t, proxy.Ports, 1)
	assert.Equal(t, "2455", proxy.Ports[0].Published, "Codex reaches the proxy where it would reach one relay")
	for _, r := range relays {
		require.Contains(t, proxy.DependsOn, r.Name)
		assert.Equal(t, types.ServiceConditionHealthy, proxy.DependsOn[r.Name].Condition)
	}
	checkNginx(t, "nginx.conf", relays, proxy.Ports[0].Target)
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	require.NoError(t, err)
	return a
}

// checkNginx checks what Codex needs of the proxy: round-robin over both
// replicas, WebSocket upgrades, header names with underscores, unbuffered
// streams and long timeouts.
func checkNginx(t *testing.T, path string, relays []types.ServiceConfig, port uint32) {
	t.Helper()
	conf, err := parseNginx(path)
	require.NoError(t, err)
	http, ok := one(conf, "http")
	require.True(t, ok, "one http block")
	u, ok := one(http.block, "underscores_in_headers")
	require.True(t, ok, "underscores_in_headers: nginx drops session_id otherwise")
	assert.Equal(t, []string{"on"}, u.args)
	if d, ok := one(http.block, "ignore_invalid_headers"); ok {
		assert.NotEqual(t, []string{"on"}, d.args)
	}

	up, ok := one(http.block, "upstream")
	require.True(t, ok, "one upstream")
	require.Len(t, up.args, 1)
	var servers []string
	for _, s := range find(up.block, "server") {
		servers = append(servers, s.args[0])
	}
	var want []string
	for _, r := range relays {
		want = append(want, r.Name+":2455")
	}
	assert.ElementsMatch(t, want, servers, "every replica, once")
	for _, policy := range []string{"ip_hash", "hash", "least_conn", "random", "sticky"} {
		assert.Empty(t, find(up.block, policy), "round-robin: no %s", policy)
	}

	srv, ok := one(http.block, "server")
	require.True(t, ok)
	listen, ok := one(srv.block, "listen")
	require.True(t, ok)
	assert.Equal(t, []string{strconv.FormatUint(uint64(port), 10)}, listen.args, "listens where compose publishes")
	assertSize(t, srv.block, "client_max_body_size", 64<<20)

	loc, ok := one(srv.block, "location")
	require.True(t, ok)
	require.Equal(t, []string{"/"}, loc.args)
	pass, ok := one(loc.block, "proxy_pass")
	require.True(t, ok)
	assert.Equal(t, []string{"http://" + up.args[0]}, pass.args)
	ver, ok := one(loc.block, "proxy_http_version")
	require.True(t, ok)
	assert.Equal(t, []string{"1.1"}, ver.args, "WebSocket upgrades need HTTP/1.1")
	headers := map[string]string{}
	for _, h := range find(loc.block, "proxy_set_header") {
		require.Len(t, h.args, 2)
		headers[strings.ToLower(h.args[0])] = h.args[1]
	}
	assert.Equal(t, "$http_upgrade", headers["upgrade"])
	conn := headers["connection"]
	require.NotEmpty(t, conn, "Connection set for upgrades")
	if strings.HasPrefix(conn, "$") {
		var mapped bool
		for _, m := range find(http.block, "map") {
			if len(m.args) == 2 && m.args[0] == "$http_upgrade" && m.args[1] == conn {
				mapped = true
				def, ok := one(m.block, "default")
				require.True(t, ok)
				assert.Equal(t, []string{"upgrade"}, def.args)
			}
		}
		assert.True(t, mapped, "%s maps $http_upgrade", conn)
	}
	for _, off := range []string{"proxy_buffering", "proxy_request_buffering"} {
		d, ok := one(loc.block, off)
		require.True(t, ok, off)
		assert.Equal(t, []string{"off"}, d.args, "%s: streams pass as they come", off)
	}
	for _, timeout := range []string{"proxy_read_timeout", "proxy_send_timeout"} {
		d, ok := one(loc.block, timeout)
		require.True(t, ok, timeout)
		require.Len(t, d.args, 1)
		v, err := time.ParseDuration(d.args[0])
		require.NoError(t, err)
		assert.GreaterOrEqual(t, v, time.Hour, "%s: long turns and idle WebSockets", timeout)
	}
	for _, d := range find(loc.block, "proxy_next_upstream") {
		assert.NotContains(t, d.args, "non_idempotent", "a POST that may have reached a replica is never resent")
	}
}

// assertSize checks an nginx size directive (64m, 1g, 512k) is at least min.
func assertSize(t *testing.T, ds []directive, name string, min int64) {
	t.Helper()
	d, ok := one(ds, name)
	require.True(t, ok, name)
	require.Len(t, d.args, 1)
	s := strings.ToLower(d.args[0])
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, strings.TrimSuffix(s, "m")
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, strings.TrimSuffix(s, "g")
	}
	var n int64
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', "%s %s", name, d.args[0])
		n = n*10 + int64(c-'0')
	}
	if n != 0 { // 0 means unlimited
		assert.GreaterOrEqual(t, n*mult, min, name)
	}
}

// secrets.sh writes every secret compose.yaml mounts, once: a database URL
// that reaches the postgres service with its user, database and password,
// and a secret key long enough for the relay.
func TestComposeSecretsScript(t *testing.T) {
	t.Parallel()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	dir := t.TempDir()
	script, err := os.ReadFile("secrets.sh")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secrets.sh"), script, 0o755))
	out, err := exec.Command(sh, filepath.Join(dir, "secrets.sh")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, "secrets", name))
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	p := loadCompose(t)
	for name := range p.Secrets {
		assert.NotEmpty(t, read(name), "secrets.sh writes %s", name)
	}
	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	u, err := url.Parse(read("database_url"))
	require.NoError(t, err)
	assert.Equal(t, "postgres", u.Scheme)
	assert.Equal(t, "postgres:5432", u.Host, "the postgres service")
	assert.Equal(t, deref(pg.Environment["POSTGRES_USER"]), u.User.Username())
	pw, _ := u.User.Password()
	assert.Equal(t, read("postgres_password"), pw)
	assert.Equal(t, "/"+deref(pg.Environment["POSTGRES_DB"]), u.Path)
	assert.GreaterOrEqual(t, len(read("secret_key")), 16, "the relay wants 16+ characters")
	assert.True(t, strings.HasPrefix(read("admin_token"), "cra_"))
	st, err := os.Stat(filepath.Join(dir, "secrets"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "only the owner reaches the secrets")

	key := read("secret_key")
	out, err = exec.Command(sh, filepath.Join(dir, "secrets.sh")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, key, read("secret_key"), "a second run keeps the key: it encrypts stored credentials")
}
