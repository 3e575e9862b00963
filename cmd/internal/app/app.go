// Package app assembles the relay as codex-relay runs it: the relay server
// (relay.Server) with its upstream clients, token refresher and usage
// poller, behind the web layer's front (the admin API, the console, the
// operations endpoints and their middleware) and the HTTP server's limits.
// serve, demo, the bench's relay phases and its hostile run all start it
// through New, so what the bench measures is what production runs.
//
// Nothing here reads flags or the environment: cmd/ does, and passes the
// values in Options.
package app

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web"
)

// DefaultLaneMaxAge is the lane age limit unless told otherwise: five
// minutes below the upstream's 60-minute connection limit.
const DefaultLaneMaxAge = 55 * time.Minute

// Options are the relay's settings. The zero value of each field is its
// default, as the field says.
type Options struct {
	// Store is the relay's database, opened and migrated (OpenStore).
	// Required.
	Store *store.Store
	// Secret is the secret key: console sessions and replica hops are
	// signed with keys derived from it (derivedKey). Nil: no hop key, and
	// console sessions signed with a key of this process only.
	Secret []byte
	// AdminTokenHash is the SHA-256 of the admin token (web.HashAdminToken).
	AdminTokenHash [32]byte
	// Logger receives the relay's logs; nil discards them.
	Logger *slog.Logger
	// TokenURL is where ChatGPT refresh tokens are redeemed; "" is
	// oauth.DefaultTokenURL.
	TokenURL string
	// AuthURL is the ChatGPT auth server of the console's sign-in; "" is
	// oauth.DefaultIssuer.
	AuthURL string
	// OIDC, when set, is the console's single sign-on; its provider is
	// reached through EnvProxy unless it brings a client.
	OIDC *web.OIDC
	// NoAdminTokenLogin turns the admin token's console sign-in off once
	// an admin person exists (web.Config.NoAdminTokenLogin).
	NoAdminTokenLogin bool
	// FallbackModel is the model a request asks for once it fell back to
	// the fallback group; "": the client's.
	FallbackModel string
	// AdvertiseURL is the base URL other replicas forward to; "" derives it
	// from the listener (advertiseURL).
	AdvertiseURL string
	// Retention is how long request records are kept; 0 the relay's
	// default (30 days), negative keeps them all.
	Retention time.Duration
	// Location is the time zone of calendar budget windows and report
	// days; nil is UTC.
	Location *time.Location
	// EnvProxy picks the proxy of accounts without one of their own; nil
	// sends them direct.
	EnvProxy func(*http.Request) (*url.URL, error)
	// StreamIdleTimeout ends an upstream answer that sent nothing this
	// long; 0 the relay's default (5 minutes).
	StreamIdleTimeout time.Duration
	// ClientCompression and UpstreamCompression are the WebSocket
	// compression of each side; zero values are pooled.
	ClientCompression, UpstreamCompression relay.Compression
	// Bridge tunes the pool of upstream lanes; zero fields are the pool's
	// defaults, but for MaxAge, whose default is DefaultLaneMaxAge (serve
	// sets it from -lane-max-age; the bench's soak closes idle lanes
	// sooner).
	Bridge bridge.PoolConfig

	// The limits serve leaves at the relay's defaults, which the bench's
	// hostile run lowers (relay.Config's fields of these names), and the
	// HTTP server's header deadline (0: ReadHeaderTimeout).
	MaxBodyBytes       int64
	BodyReadTimeout    time.Duration
	ClientWriteTimeout time.Duration
	ReadHeaderTimeout  time.Duration
	// Continuity is the relay's replay cache and OwnerIDs the bound of its
	// response id index (relay.Config's); nil and 0 are the relay's
	// defaults. The bench's soak bounds them lower.
	Continuity *continuity.Cache
	OwnerIDs   int
}

// Relay is the relay assembled on a listener, ready to Serve. Its accessors
// are safe for concurrent use; Serve is called once.
type Relay struct {
	ln       net.Listener // static after New
	log      *slog.Logger
	store    *store.Store
	server   *relay.Server
	upstream *relay.Upstream
	tokens   *oauth.Refresher
	poller   *oauth.UsagePoller
	web      *web.Server
	hs       *http.Server
}

// New assembles the relay and its web front on opts.Store, to serve on ln
// (Serve), and logs that it listens there. Nothing runs until Serve.
func New(ln net.Listener, opts Options) (*Relay, error) {
	if ln == nil || opts.Store == nil {
		return nil, errors.New("app: a listener and a store are required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st := opts.Store
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Everything sent for an account, token refreshes and usage polls
	// included, goes through its proxy, or the environment's when it names
	// none (unless the operator ignores that).
	up := relay.NewUpstreamWith(relay.UpstreamOptions{EnvProxy: opts.EnvProxy, Compression: opts.UpstreamCompression})
	tokens := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: up.HTTP, ClientFor: up.Client, TokenURL: opts.TokenURL, Logger: log.With("component", "tokens")})
	poller := oauth.NewUsagePoller(oauth.UsagePollerConfig{Store: st, Tokens: tokens, HTTPClient: up.HTTP, ClientFor: up.Client, Logger: log.With("component", "usage")})
	advertise := opts.AdvertiseURL
	if advertise == "" {
		advertise = advertiseURL(ln.Addr())
	}
	pool := opts.Bridge
	pool.MaxAge = cmp.Or(pool.MaxAge, DefaultLaneMaxAge)
	// Alerts are watched and delivered on every replica (each change and
	// each try is made once among them); no webhook goes to this
	// listener's own admin routes.
	self := []string{ln.Addr().String()}
	rl := relay.New(relay.Config{Store: st, Logger: log, Registry: reg, Upstream: up, Tokens: tokens, FallbackModel: opts.FallbackModel,
		Replica: relay.ReplicaConfig{Address: advertise, HopKey: derivedKey(opts.Secret, hopKeyPurpose)}, Retention: opts.Retention, Location: opts.Location,
		StreamIdleTimeout: opts.StreamIdleTimeout, ClientCompression: opts.ClientCompression, Bridge: pool,
		MaxBodyBytes: opts.MaxBodyBytes, BodyReadTimeout: opts.BodyReadTimeout, ClientWriteTimeout: opts.ClientWriteTimeout,
		Continuity: opts.Continuity, OwnerIDs: opts.OwnerIDs, Alerts: &alert.Options{Self: self}})
	probe := func(ctx context.Context, id string) (store.Account, error) {
		a, err := st.Account(ctx, id)
		if err != nil {
			return store.Account{}, err
		}
		if poller.Polls(a) {
			return poller.PollOnce(ctx, a) // usage windows from the upstream, and recovery after a reset
		}
		if status, ok := oauth.Recover(a, time.Now()); ok {
			return st.SetAccountStatus(ctx, id, status, "probed after its reset", time.Time{})
		}
		return a, nil
	}
	if opts.OIDC != nil && opts.OIDC.Client == nil {
		sso := *opts.OIDC
		sso.Client = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{Proxy: opts.EnvProxy}}
		opts.OIDC = &sso
	}
	srv := web.New(web.Config{Store: st, AdminTokenHash: opts.AdminTokenHash, Logger: log, Registry: reg, Gatherer: reg, Client: rl, Relay: rl,
		SessionKey: derivedKey(opts.Secret, sessionKeyPurpose), Probe: probe, Location: opts.Location,
		AuthURL: opts.AuthURL, SignInClient: up.Via, AlertSelf: self, KickAlerts: rl.KickAlerts, OIDC: opts.OIDC,
		NoAdminTokenLogin: opts.NoAdminTokenLogin})
	hs := httpServer(srv, log)
	if opts.ReadHeaderTimeout > 0 {
		hs.ReadHeaderTimeout = opts.ReadHeaderTimeout
	}
	log.Info("codex-relay listening", "addr", ln.Addr().String(), "database", st.Location().String(),
		"lane_max_age", pool.MaxAge.String(),
		"ws_compression", opts.ClientCompression.String(), "upstream_ws_compression", opts.UpstreamCompression.String())
	return &Relay{ln: ln, log: log, store: st, server: rl, upstream: up, tokens: tokens, poller: poller, web: srv, hs: hs}, nil
}

// Addr is the address the relay listens on.
func (r *Relay) Addr() net.Addr { return r.ln.Addr() }

// Server is the relay server behind the web front (its lane pool, for
// one).
func (r *Relay) Server() *relay.Server { return r.server }

// CloseIdleConnections closes the idle HTTP connections of the relay's
// upstream client (to the upstreams and the token endpoint), so a count of
// open sockets compares what clients left behind.
func (r *Relay) CloseIdleConnections() { r.upstream.HTTP.CloseIdleConnections() }

// Serve runs the relay's background work (its lane pool, heartbeat and
// housekeeping, and the usage poller) and serves on the listener until ctx
// ends, then drains within grace (serveUntilDone): readiness fails, the
// WebSocket sessions end between turns and the HTTP requests finish; what
// is still running at the grace's end is cut. It returns once everything
// it started has ended, the listener closed.
func (r *Relay) Serve(ctx context.Context, grace time.Duration) error {
	defer r.ln.Close()
	defer r.tokens.Close()
	// The background work outlives ctx: it ends after the drain below.
	// Cancelled with ctx, the pool would close every lane at the signal,
	// busy ones included, and cut the turns the drain is there to let
	// finish.
	rctx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { r.server.Run(rctx) })
	background.Go(func() { r.poller.Run(rctx, time.Minute) })
	defer func() { stopRelay(); background.Wait() }()
	err := serveUntilDone(ctx, r.hs, r.ln, grace, r.log, r.server)
	r.server.Close() // WebSocket sessions are hijacked: Shutdown did not end them
	r.web.Close()    // the console's sign-ins under way end; failed admin-token attempts are audited
	return err
}

// advertiseURL is the base URL other replicas reach this one at: the
// listener's own address, unless it listens on every interface (then no
// one address is known to be reachable, and it takes no forwarded requests).
func advertiseURL(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		return ""
	}
	return "http://" + tcp.String()
}
