package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web"
)

// DefaultAddr is where the relay listens unless told otherwise.
const DefaultAddr = "127.0.0.1:2455"

func runServe(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "serve", "Run the relay: Codex's Responses API in front of the account pool, the admin API under /api/v1, and /healthz, /readyz, /metrics.")
	var db dbFlags
	db.register(fs, c)
	addr := fs.String("addr", envOr(c, "CODEX_RELAY_ADDR", DefaultAddr), "listen address (env CODEX_RELAY_ADDR)")
	shutdown := fs.Duration("shutdown-timeout", 30*time.Second, "how long open requests may finish after SIGINT/SIGTERM")
	tokenURL := fs.String("token-url", envOr(c, "CODEX_RELAY_TOKEN_URL", oauth.DefaultTokenURL), "OAuth token endpoint that refreshes ChatGPT accounts' tokens (env CODEX_RELAY_TOKEN_URL)")
	authURL := fs.String("auth-url", envOr(c, "CODEX_RELAY_AUTH_URL", oauth.DefaultIssuer), "the ChatGPT auth server the console's Sign in with ChatGPT uses, as 'accounts login -auth-url' (env CODEX_RELAY_AUTH_URL)")
	fallbackModel := fs.String("fallback-model", envOr(c, "CODEX_RELAY_FALLBACK_MODEL", ""), "model requests ask for when they fall back to accounts tagged \"fallback\" (env CODEX_RELAY_FALLBACK_MODEL); empty: the client's model")
	retentionText := fs.String("retention", envOr(c, "CODEX_RELAY_RETENTION", "720h"), "how long the request log and attempt records are kept (env CODEX_RELAY_RETENTION), a duration such as 720h or 2160h; 0 keeps them all")
	advertise := fs.String("advertise-url", envOr(c, "CODEX_RELAY_ADVERTISE_URL", ""), "base URL the other replicas reach this one at, to forward a thread's requests to the replica holding its lane (env CODEX_RELAY_ADVERTISE_URL); default http://<listen address>, or none when listening on all interfaces without it")
	tz := fs.String("timezone", envOr(c, "CODEX_RELAY_TIMEZONE", "UTC"), "IANA time zone of the calendar budget windows (day, week, month) and of the usage reports' days and hours (env CODEX_RELAY_TIMEZONE), such as Europe/Berlin")
	envProxyMode := fs.String("env-proxy", envOr(c, "CODEX_RELAY_ENV_PROXY", "use"), "whether accounts without a proxy_url of their own go through the proxy of HTTPS_PROXY, HTTP_PROXY and NO_PROXY (env CODEX_RELAY_ENV_PROXY): use or ignore")
	laneMaxAgeText := fs.String("lane-max-age", envOr(c, "CODEX_RELAY_LANE_MAX_AGE", app.DefaultLaneMaxAge.String()), "age at which an upstream WebSocket lane is replaced, at its next turn boundary, ahead of the upstream's 60-minute connection limit (env CODEX_RELAY_LANE_MAX_AGE): a duration above 0 and below 60m; the margin below 60m must cover the longest turn")
	streamIdleText := fs.String("stream-idle-timeout", envOr(c, "CODEX_RELAY_STREAM_IDLE_TIMEOUT", defaultStreamIdleTimeout.String()), "how long an upstream answer may send nothing, its first event included, before the relay ends it (env CODEX_RELAY_STREAM_IDLE_TIMEOUT): the request moves to another account when nothing reached the client yet, else the client gets response.failed; a duration above 0 that must cover the longest pause an answer makes (a long reasoning step)")
	compression := registerCompressionFlags(fs, c)
	fs.Usage = withEnvNotes(fs.Usage, c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	clientCompression, upstreamCompression, err := compression()
	if err != nil {
		return err
	}
	loc, err := time.LoadLocation(*tz)
	if err != nil {
		return fmt.Errorf("serve: -timezone (CODEX_RELAY_TIMEZONE) %q: give an IANA time zone such as UTC or Europe/Berlin", *tz)
	}
	retention, err := time.ParseDuration(*retentionText)
	if err != nil || retention < 0 {
		return fmt.Errorf("serve: -retention (CODEX_RELAY_RETENTION) %q: give a duration such as 720h, or 0 to keep everything", *retentionText)
	}
	if retention == 0 {
		retention = -1 // keep everything
	}
	envProxy, err := environmentProxy(c, *envProxyMode)
	if err != nil {
		return err
	}
	laneMaxAge, err := parseLaneMaxAge(*laneMaxAgeText)
	if err != nil {
		return err
	}
	streamIdle, err := time.ParseDuration(*streamIdleText)
	if err != nil || streamIdle <= 0 {
		return fmt.Errorf("serve: -stream-idle-timeout (CODEX_RELAY_STREAM_IDLE_TIMEOUT) %q: give a duration above 0 such as 5m", *streamIdleText)
	}
	log, err := newLogger(c.stderr, db.logFormat, db.logLevel)
	if err != nil {
		return err
	}
	applyMemoryLimit(c, log)
	sso, err := oidcSettings(c)
	if err != nil {
		return err
	}
	adminLogin := envOr(c, "CODEX_RELAY_ADMIN_TOKEN_LOGIN", "on")
	if adminLogin != "on" && adminLogin != "off" {
		return fmt.Errorf("serve: CODEX_RELAY_ADMIN_TOKEN_LOGIN %q: give on or off", adminLogin)
	}
	st, secret, admin, err := openRelayStore(ctx, c, db, log)
	if err != nil {
		return err
	}
	defer st.Close()

	return serveRelay(ctx, c, *addr, *shutdown, app.Options{Store: st, Secret: secret, AdminTokenHash: admin.hash, Logger: log,
		TokenURL: *tokenURL, AuthURL: *authURL, FallbackModel: *fallbackModel, AdvertiseURL: *advertise, Retention: retention, Location: loc, EnvProxy: envProxy,
		StreamIdleTimeout: streamIdle, ClientCompression: clientCompression, UpstreamCompression: upstreamCompression,
		Bridge: bridge.PoolConfig{MaxAge: laneMaxAge}, OIDC: sso, NoAdminTokenLogin: adminLogin == "off"}, nil)
}

// oidcSettings reads the console's single sign-on (CODEX_RELAY_OIDC_*,
// CODEX_RELAY_PUBLIC_URL): nil without an issuer; an issuer without a
// client id, a public URL or a role map is an error that says what is
// missing.
func oidcSettings(c cli) (*web.OIDC, error) {
	issuer := strings.TrimSpace(c.getenv("CODEX_RELAY_OIDC_ISSUER"))
	if issuer == "" {
		return nil, nil
	}
	o := &web.OIDC{Issuer: issuer, ClientID: strings.TrimSpace(c.getenv("CODEX_RELAY_OIDC_CLIENT_ID")),
		ClientSecret: strings.TrimSpace(c.getenv("CODEX_RELAY_OIDC_CLIENT_SECRET")),
		RoleClaim:    envOr(c, "CODEX_RELAY_OIDC_ROLE_CLAIM", "groups"),
		PublicURL:    strings.TrimRight(strings.TrimSpace(c.getenv("CODEX_RELAY_PUBLIC_URL")), "/")}
	if o.ClientID == "" {
		return nil, errors.New("serve: CODEX_RELAY_OIDC_ISSUER is set but CODEX_RELAY_OIDC_CLIENT_ID is not: give the client id the provider registered for the relay")
	}
	if u, err := url.Parse(o.PublicURL); o.PublicURL == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, errors.New("serve: CODEX_RELAY_OIDC_ISSUER is set but CODEX_RELAY_PUBLIC_URL is not an http(s) URL: give the console's origin as browsers reach it (the redirect URI is <public URL>/admin/oidc/callback)")
	}
	m, err := web.ParseRoleMap(c.getenv("CODEX_RELAY_OIDC_ROLES"))
	if err != nil {
		return nil, fmt.Errorf("serve: CODEX_RELAY_OIDC_ROLES: %w", err)
	}
	o.Roles = m
	return o, nil
}

// defaultStreamIdleTimeout is how long an upstream answer may stay silent
// unless the operator says otherwise (relay.Config.StreamIdleTimeout's
// default).
const defaultStreamIdleTimeout = 5 * time.Minute

// upstreamConnectionLimit is how long the upstream keeps a WebSocket open
// (websocket_connection_limit_reached after it).
const upstreamConnectionLimit = 60 * time.Minute

// parseLaneMaxAge reads -lane-max-age: a duration above zero and below the
// upstream's connection limit, or a lane would meet the limit mid-turn.
func parseLaneMaxAge(text string) (time.Duration, error) {
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		return 0, fmt.Errorf("serve: -lane-max-age (CODEX_RELAY_LANE_MAX_AGE) %q: give a duration such as 55m", text)
	case d <= 0:
		return 0, fmt.Errorf("serve: -lane-max-age (CODEX_RELAY_LANE_MAX_AGE) %s: must be above zero", text)
	case d >= upstreamConnectionLimit:
		return 0, fmt.Errorf("serve: -lane-max-age (CODEX_RELAY_LANE_MAX_AGE) %s: must be below the upstream's %s connection limit, with a margin for the longest turn (default %s)",
			text, "60m", app.DefaultLaneMaxAge)
	}
	return d, nil
}

// registerCompressionFlags adds the WebSocket compression settings to fs;
// the returned func reads them once fs is parsed.
func registerCompressionFlags(fs *flag.FlagSet, c cli) func() (client, upstream relay.Compression, err error) {
	clientMode := fs.String("ws-compression", envOr(c, "CODEX_RELAY_WS_COMPRESSION", string(relay.CompressionPooled)),
		"how client WebSockets that offer permessage-deflate (Codex does) are answered (env CODEX_RELAY_WS_COMPRESSION): pooled (no context takeover: messages from the threshold up compressed alone by pooled compressors, nothing kept per connection), takeover (a compressor and window kept per connection, about 1 MB each) or off")
	upstreamMode := fs.String("upstream-ws-compression", envOr(c, "CODEX_RELAY_UPSTREAM_WS_COMPRESSION", string(relay.CompressionPooled)),
		"what the relay's upstream WebSockets offer (env CODEX_RELAY_UPSTREAM_WS_COMPRESSION): pooled, takeover or off, as for -ws-compression")
	threshold := fs.String("ws-compression-threshold", envOr(c, "CODEX_RELAY_WS_COMPRESSION_THRESHOLD", strconv.Itoa(relay.DefaultCompressionThreshold)),
		"smallest WebSocket message the relay compresses, in bytes, on both sides (env CODEX_RELAY_WS_COMPRESSION_THRESHOLD); smaller ones go as they are")
	return func() (client, upstream relay.Compression, err error) {
		n, err := strconv.Atoi(*threshold)
		if err != nil || n < 1 || n > maxCompressionThreshold {
			return client, upstream, fmt.Errorf("-ws-compression-threshold (CODEX_RELAY_WS_COMPRESSION_THRESHOLD) %q: give a size in bytes from 1 to %d", *threshold, maxCompressionThreshold)
		}
		client.Threshold, upstream.Threshold = n, n
		if client.Mode, err = relay.ParseCompressionMode(*clientMode); err != nil {
			return client, upstream, fmt.Errorf("-ws-compression (CODEX_RELAY_WS_COMPRESSION): %w", err)
		}
		if upstream.Mode, err = relay.ParseCompressionMode(*upstreamMode); err != nil {
			return client, upstream, fmt.Errorf("-upstream-ws-compression (CODEX_RELAY_UPSTREAM_WS_COMPRESSION): %w", err)
		}
		return client, upstream, nil
	}
}

// maxCompressionThreshold bounds -ws-compression-threshold: a message of
// this size is as large as a request gets.
const maxCompressionThreshold = 64 << 20

// environmentProxy is the proxy of accounts that name none: with mode
// "use", the one the environment's HTTPS_PROXY, HTTP_PROXY and NO_PROXY
// (or their lower-case forms) say, as http.ProxyFromEnvironment reads them
// (loopback hosts never proxied); with "ignore", none.
func environmentProxy(c cli, mode string) (func(*http.Request) (*url.URL, error), error) {
	switch mode {
	case "ignore":
		return nil, nil
	case "use":
	default:
		return nil, fmt.Errorf("serve: -env-proxy (CODEX_RELAY_ENV_PROXY) %q: want use or ignore", mode)
	}
	env := func(names ...string) string {
		for _, n := range names {
			if v := c.getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	cfg := httpproxy.Config{
		HTTPProxy:  env("HTTP_PROXY", "http_proxy"),
		HTTPSProxy: env("HTTPS_PROXY", "https_proxy"),
		NoProxy:    env("NO_PROXY", "no_proxy"),
		CGI:        c.getenv("REQUEST_METHOD") != "",
	}
	if cfg.HTTPProxy == "" && cfg.HTTPSProxy == "" {
		return nil, nil
	}
	pick := cfg.ProxyFunc()
	return func(r *http.Request) (*url.URL, error) { return pick(r.URL) }, nil
}

// serveRelay assembles the relay and its web front (app.New) and serves on
// addr until ctx ends, draining within grace. onListen, when set, is told
// the address first.
func serveRelay(ctx context.Context, c cli, addr string, grace time.Duration, opts app.Options, onListen func(addr string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	rl, err := app.New(ln, opts)
	if err != nil {
		ln.Close()
		return err
	}
	if onListen != nil {
		onListen(ln.Addr().String())
	}
	if c.listening != nil {
		c.listening(ln.Addr().String())
	}
	return rl.Serve(ctx, grace)
}

func runMigrate(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "migrate", "Apply the database migrations (under a lock, safe beside running replicas) and exit. The relay also does this at start.")
	var db dbFlags
	db.register(fs, c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(c.stderr, db.logFormat, db.logLevel)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, c, db, log, true)
	if err != nil {
		return err
	}
	defer st.Close()
	cur, latest, err := st.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "database %s at schema version %d of %d\n", st.Location(), cur, latest)
	return nil
}
