package relay

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/ratelimit"
	"github.com/codexrelay/codex-relay/internal/store"
)

// Config is what the relay needs, built by cmd.
type Config struct {
	// Store is the relay's durable state: accounts, keys, bindings, the
	// request log. Required: New panics without one.
	Store    *store.Store
	Upstream *Upstream
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Now      func() time.Time
	// BindingTTL bounds soft bindings: they expire after this long without
	// activity. Default 6h.
	BindingTTL time.Duration
	// StreamIdleTimeout ends an upstream stream that sent nothing for this
	// long. Default 5m.
	StreamIdleTimeout time.Duration
	// MaxBodyBytes bounds a request body after decompression. Default 64 MiB.
	MaxBodyBytes int64
	// MaxUploadBytes bounds an upload on the object routes (files,
	// transcriptions, image edits), streamed upstream as it comes, never
	// held. Default 512 MiB (OpenAI's file limit).
	MaxUploadBytes int64
	// BodyReadTimeout bounds reading a client request's body (large
	// histories take a while on slow links; a client that trickles its body
	// is cut). Default 2m.
	BodyReadTimeout time.Duration
	// ClientWriteTimeout bounds one write to a client on either transport:
	// a client that stops reading is let go, and the account slot and lane
	// its request held with it. Default 15s.
	ClientWriteTimeout time.Duration
	// HangUpAfter is how long a request whose client went away mid-answer
	// keeps reading what its upstream had sent already before it takes the
	// upstream for still answering and hangs up (the upstream then stops):
	// a response the upstream completed in that time is settled, and its
	// lane kept. Default 50ms; below 10s.
	HangUpAfter time.Duration
	// MaxAttempts bounds how many accounts one request may try. Default 4.
	MaxAttempts int
	// Continuity is the thread-scoped replay cache; one is made when nil.
	Continuity *continuity.Cache
	// OwnerIDs bounds the index of response ids and turn states to the
	// account that issued them (the oldest go first). Default 200,000.
	OwnerIDs int
	// Tokens hands out account credentials: fresh ChatGPT access tokens
	// (refreshed before expiry and once after an upstream 401). Nil reads
	// the stored credentials as they are.
	Tokens TokenSource
	// FallbackModel, when set, is the model a request asks for once it fell
	// back to the fallback group (accounts tagged "fallback").
	FallbackModel string
	// DisableRecovery switches off reasoning recovery and ciphertext
	// mismatch switching (seed 000); a rejection then goes to the client.
	DisableRecovery bool
	// Bridge tunes the upstream lanes (the HTTP bridge's and client
	// WebSockets'); its OnEvent is told of lane events after the relay's
	// metrics. DisableBridge serves HTTP clients over plain HTTP upstream
	// requests instead.
	Bridge        bridge.PoolConfig
	DisableBridge bool
	// Replica names this process among the replicas sharing the database
	// (see Run); defaults: a random id, and host:pid for the name.
	Replica ReplicaConfig
	// Retention is how long request log rows and attempt records are kept
	// (Run deletes older ones). Default 30 days; negative keeps them all.
	Retention time.Duration
	// ClientCompression is what client WebSockets are answered with when
	// they offer permessage-deflate; the zero value is pooled (see
	// Compression). The upstream side's is Upstream.Compression.
	ClientCompression Compression
	// Location is the time zone of calendar budget windows (day, week,
	// month). Nil: UTC.
	Location *time.Location
	// Alerts, when set, has Run watch the alert conditions and send the
	// due webhook deliveries (package alert) on this replica, through the
	// default egress (Upstream's environment proxy). Every replica may run
	// them: each event is recorded and each try made once. Nil: no alerts.
	Alerts *alert.Options
}

// TokenSource hands out an account's credentials, refreshing ChatGPT tokens
// (internal/oauth's Refresher is one).
type TokenSource interface {
	Token(ctx context.Context, a store.Account) (store.Credentials, error)
	AfterUnauthorized(ctx context.Context, a store.Account, staleAccessToken string) (store.Credentials, error)
}

// Server serves Codex's routes. Safe for concurrent use.
type Server struct {
	cfg     Config // static after New
	log     *slog.Logger
	metrics *metrics
	owners  *ownerIndex       // response id / turn state -> account
	conts   *continuity.Cache // thread-scoped history
	// inflight counts requests under way per account id on this replica,
	// each from the moment its account was selected.
	inflight sync.Map // string -> *atomic.Int64
	// balancing serializes selections with the in-flight counts they read
	// and the claim they add (see selectAndClaim).
	balancing sync.Mutex
	// pool holds every upstream lane: the HTTP bridge's and each client
	// WebSocket's, under one cap per account.
	pool     *bridge.Pool
	httpOnly accountMarks
	// unreachable are the accounts whose upstream did not answer lately
	// (see unreachableFor).
	unreachable accountMarks
	// sessions are the live client WebSocket sessions; Close ends them
	// (their connections are hijacked, so http.Server.Shutdown does not).
	sessions sessionCount
	// closing is cancelled by Close; static after New.
	closing context.Context
	close   context.CancelFunc
	// draining is cancelled by Drain; static after New.
	draining context.Context
	drain    context.CancelFunc
	// remoteLanes are the other live replicas' lanes, from their last
	// heartbeats (nil until Run has looked).
	remoteLanes atomic.Pointer[[]LaneInfo]
	// alerts are this replica's alert loops (Config.Alerts), run by Run;
	// static after New, nil without alerts.
	alerts *alert.Loops
	// leased remembers the threads whose lease this replica renewed, and
	// when and at which epoch (leaseKey -> leaseSeen), so a lease is
	// written once a minute and a lease taken over from another replica
	// is announced.
	leased sync.Map
	// keyUse counts requests per client key, written in batches.
	keyUse *keyUse
	// keyFailures counts wrong client keys per client address
	// (limitKeyFailures); it guards its own state.
	keyFailures *ratelimit.Limiter
	// requestLog writes the request log's rows (and their attempts) in
	// batches behind the requests; static after New.
	requestLog *writeBehind[store.LoggedRequest]
	// usage writes the accounts' usage windows the answers report, in
	// batches behind the requests; static after New.
	usage *writeBehind[usageReport]
	// placements retries the binding writes the database did not take as
	// their requests settled; static after New.
	placements *writeBehind[store.Placement]
	// hop carries requests forwarded to other replicas: no ambient proxy,
	// and a short dial deadline, so a dead replica fails fast and the
	// request is served here.
	hop *http.Transport
	// hopNonces are the nonces of the hops accepted here, within their
	// window.
	hopNonces hopNonces
}

// New builds the relay server.
func New(cfg Config) *Server {
	if cfg.Store == nil {
		panic("relay.New: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Upstream == nil {
		cfg.Upstream = NewUpstream()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BindingTTL <= 0 {
		cfg.BindingTTL = 6 * time.Hour
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = 5 * time.Minute
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = 512 << 20
	}
	if cfg.HangUpAfter <= 0 || cfg.HangUpAfter >= hearOutFor {
		cfg.HangUpAfter = hangUpAfter
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 4
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = 2 * time.Minute
	}
	if cfg.ClientWriteTimeout <= 0 {
		cfg.ClientWriteTimeout = clientWriteTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Continuity == nil {
		cfg.Continuity = continuity.New(continuity.Options{Now: cfg.Now})
	}
	if cfg.OwnerIDs <= 0 {
		cfg.OwnerIDs = 200_000
	}
	cfg.Replica = cfg.Replica.withDefaults()
	if cfg.Retention == 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.Location == nil {
		cfg.Location = time.UTC
	}
	closing, cancel := context.WithCancel(context.Background())
	draining, drain := context.WithCancel(context.Background())
	s := &Server{
		draining:    draining,
		drain:       drain,
		cfg:         cfg,
		log:         cfg.Logger,
		metrics:     newMetrics(cfg.Registry),
		owners:      newOwnerIndex(cfg.OwnerIDs),
		conts:       cfg.Continuity,
		closing:     closing,
		close:       cancel,
		keyFailures: ratelimit.New(keyFailureBurst, keyFailureRefill, cfg.Now),
		hop: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute,
			// A holder that takes a forwarded request and never answers it
			// (frozen, or cut off) is given up: the request is served here.
			ResponseHeaderTimeout: hopSilence(cfg.StreamIdleTimeout)},
	}
	pc := cfg.Bridge
	if pc.Now == nil {
		pc.Now = cfg.Now
	}
	onEvent := pc.OnEvent
	pc.OnEvent = func(e string) {
		s.metrics.lanes.WithLabelValues(e).Inc()
		if onEvent != nil {
			onEvent(e)
		}
	}
	s.pool = bridge.NewPool(pc)
	s.keyUse, s.requestLog, s.placements, s.usage = s.newKeyUse(), s.newRequestLog(), s.newPlacements(), s.newUsage()
	cfg.Registry.MustRegister(newAccountsCollector(s))
	if cfg.Alerts != nil {
		s.alerts = alert.New(alert.Config{Store: cfg.Store, Replica: cfg.Replica.ID, Proxy: cfg.Upstream.envProxy, Now: cfg.Now,
			Logger: cfg.Logger.With("component", "alerts"),
			Budget: func(ctx context.Context, k store.ClientKey) ([]store.LimitUse, error) {
				return cfg.Store.KeyBudget(ctx, k, cfg.Replica.ID, s.ReplicaLiveSince(), cfg.Location)
			}}, *cfg.Alerts)
	}
	return s
}

// KickAlerts has this replica send the due webhook deliveries now (a test
// event just recorded) rather than at its next poll; without alerts it
// does nothing.
func (s *Server) KickAlerts() {
	if s.alerts != nil {
		s.alerts.Deliverer.Kick()
	}
}

// Bridge exposes the pool of upstream lanes.
func (s *Server) Bridge() *bridge.Pool { return s.pool }

// Close ends every live WebSocket session (clients get a going-away close
// and reconnect elsewhere) and waits for them, their lanes included. HTTP
// requests are left to http.Server.Shutdown.
func (s *Server) Close() {
	s.Drain()
	s.close()
	s.sessions.wait(context.Background())
	// The writers give up together: a database that is away costs one
	// grace, not one each.
	var writers sync.WaitGroup
	writers.Go(func() { s.keyUse.close(5 * time.Second) })
	writers.Go(func() { s.requestLog.close(requestLogCloseGrace) })
	writers.Go(func() { s.placements.close(requestLogCloseGrace) })
	writers.Go(func() { s.usage.close(5 * time.Second) })
	writers.Wait()
	s.hop.CloseIdleConnections()
	s.pool.Close()
}

// Drain begins a graceful stop: readiness fails, new WebSocket sessions
// are refused, and every open session ends with close code 1012 (service
// restart; Codex reconnects, to another replica) as soon as it has no turn
// under way: a turn already streaming finishes first. HTTP requests are the
// HTTP server's to drain (Shutdown). Safe to call more than once.
func (s *Server) Drain() {
	s.sessions.stop()
	s.drain()
}

// Draining reports whether Drain (or Close) was called.
func (s *Server) Draining() bool { return s.draining.Err() != nil }

// WaitSessions waits until every WebSocket session has ended, or ctx does.
func (s *Server) WaitSessions(ctx context.Context) error { return s.sessions.wait(ctx) }

// sessionCount counts the live client WebSocket sessions. Unlike a
// sync.WaitGroup, a session may start while another goroutine waits for
// them to end (the WaitGroup forbids an Add from zero then), a wait ends
// with its context without leaving a goroutine behind, and once stopped
// (Drain) no session starts. Safe for concurrent use.
type sessionCount struct {
	mu      sync.Mutex
	n       int           // live sessions; guarded by mu
	stopped bool          // no session starts any more; guarded by mu
	none    chan struct{} // closed when n falls to zero; guarded by mu (nil while n is zero)
}

// start counts a new session, unless the count was stopped: then it
// reports false, and the session must not start.
func (c *sessionCount) start() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	if c.n == 0 {
		c.none = make(chan struct{})
	}
	c.n++
	return true
}

// end counts a session's end.
func (c *sessionCount) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n--
	if c.n == 0 {
		close(c.none)
		c.none = nil
	}
}

// stop refuses every later start.
func (c *sessionCount) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
}

// wait waits until no session is live, or ctx ends. A session started
// meanwhile is waited for too.
func (c *sessionCount) wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		none := c.none
		c.mu.Unlock()
		if none == nil {
			return nil
		}
		select {
		case <-none:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Continuity exposes the cache, for operators' resets.
func (s *Server) Continuity() *continuity.Cache { return s.conts }

func (s *Server) counter(accountID string) *atomic.Int64 {
	v, _ := s.inflight.LoadOrStore(accountID, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// inFlight counts a request under way on an account until the returned
// func is called.
func (s *Server) inFlight(accountID string) (done func()) {
	c := s.counter(accountID)
	c.Add(1)
	return func() { c.Add(-1) }
}

// InFlight reports requests under way on an account on this replica.
func (s *Server) InFlight(accountID string) int { return int(s.counter(accountID).Load()) }

// Run does the relay's background housekeeping until ctx ends: expired
// bindings, request records past their retention and ended console
// sessions are deleted, idle continuity entries swept, and the bridge's
// idle and aged lanes closed (its sweeper runs beside, owned here). It
// also keeps this replica registered with the others sharing the database
// (heartbeat) and applies what they announce (see replicas.go).
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.pool.Run(ctx) }()
	wg.Add(2)
	go func() { defer wg.Done(); s.heartbeat(ctx) }()
	go func() { defer wg.Done(); s.listen(ctx) }()
	if s.alerts != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.alerts.Run(ctx) }()
	}
	defer wg.Wait()
	s.housekeep(ctx) // at once too: a restart prunes what piled up meanwhile
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.housekeep(ctx)
		}
	}
}

// housekeep sweeps idle continuity entries and deletes expired bindings,
// request records and finished webhook deliveries past their retention,
// stale lane leases and console sessions past their absolute end.
func (s *Server) housekeep(ctx context.Context) {
	s.conts.Sweep()
	if _, err := s.cfg.Store.DeleteExpiredBindings(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("delete expired bindings", "err", err)
	}
	now := s.cfg.Now()
	if s.cfg.Retention > 0 {
		if _, err := s.cfg.Store.DeleteRecordsBefore(ctx, now.Add(-s.cfg.Retention), 10); err != nil && ctx.Err() == nil {
			s.log.Warn("delete old request records", "err", err)
		}
		if _, err := s.cfg.Store.DeleteAlertHistoryBefore(ctx, now.Add(-s.cfg.Retention)); err != nil && ctx.Err() == nil {
			s.log.Warn("delete old webhook deliveries", "err", err)
		}
	}
	if _, err := s.cfg.Store.DeleteStaleReservations(ctx, s.cfg.Replica.ID, s.ReplicaLiveSince()); err != nil && ctx.Err() == nil {
		s.log.Warn("delete stale budget reservations", "err", err)
	}
	if _, err := s.cfg.Store.DeleteStaleLeases(ctx, now.Add(-leaseTTL)); err != nil && ctx.Err() == nil {
		s.log.Warn("delete stale lane leases", "err", err)
	}
	if _, err := s.cfg.Store.DeleteEndedConsoleSessions(ctx, now); err != nil && ctx.Err() == nil {
		s.log.Warn("delete ended console sessions", "err", err)
	}
	if _, err := s.cfg.Store.DeleteExpiredObjects(ctx, now); err != nil && ctx.Err() == nil {
		s.log.Warn("delete expired objects", "err", err)
	}
	s.leased.Range(func(k, v any) bool {
		if now.Sub(v.(leaseSeen).at) > leaseTTL {
			s.leased.Delete(k)
		}
		return true
	})
}

// ServeHTTP routes Codex's requests. Paths are accepted under both upstream
// flavours: /backend-api/codex/... (ChatGPT backend) and /v1/... (OpenAI);
// /v1 also serves other OpenAI clients (Chat Completions, the OpenAI model
// list).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		// Until the body is read (readRequestBody lifts it), an answer
		// closes the connection: net/http would otherwise read what is
		// left of the body before answering, so a request refused on its
		// headers (no key, a wrong one, no route) by a client that sends
		// its body slowly or never would hold its connection and goroutine.
		w.Header().Set("Connection", "close")
		// And once answered, net/http's own read of what is left (before it
		// closes the connection) must not wait for it either.
		defer func() {
			if w.Header().Get("Connection") == "close" {
				_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			}
		}()
	}
	if s.serveChatGPTAnswer(w, r) {
		return
	}
	rest, ok := cutPrefix(r.URL.Path, "/backend-api/codex", "/v1")
	if !ok {
		// The ChatGPT backend's own routes, beside its /codex (Codex's
		// file uploads and analytics, at its chatgpt_base_url).
		if rest, ok := cutPrefix(r.URL.Path, "/backend-api"); ok {
			if rt, id, ok := matchObjectRoute(r.Method, rest, true); ok {
				s.serveObject(w, r, rt, id, rest)
				return
			}
		}
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "not_found", Message: "no such route"})
		return
	}
	switch {
	case rest == "/responses" && r.Method == http.MethodGet && isWebSocketUpgrade(r):
		s.serveWebSocket(w, r)
	case rest == "/responses" && r.Method == http.MethodPost:
		s.serveResponses(w, r, "")
	case rest == "/responses/compact" && r.Method == http.MethodPost:
		s.serveResponses(w, r, "/compact")
	case rest == "/models" && r.Method == http.MethodGet:
		s.serveModels(w, r)
	case rest == "/chat/completions" && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/"):
		s.serveChatCompletions(w, r)
	case strings.HasPrefix(rest, "/thread/goal/") && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/backend-api/codex/"):
		s.serveGoal(w, r, strings.TrimPrefix(rest, "/thread/goal/"))
	case (rest == "/realtime" || rest == "") && r.Method == http.MethodGet && isWebSocketUpgrade(r):
		// Codex dials its provider's base itself for realtime on the
		// ChatGPT backend (no /realtime), and .../realtime on /v1.
		s.serveRealtime(w, r, "/realtime")
	case s.serveObjectRoute(w, r, rest):
	case rest == "/responses":
		w.Header().Set("Allow", "GET, POST")
		writeError(w, http.StatusMethodNotAllowed, apiError{Type: "invalid_request_error", Code: "method_not_allowed", Message: "use POST (or a WebSocket upgrade)"})
	default:
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "not_found", Message: "no such route"})
	}
}

func cutPrefix(p string, prefixes ...string) (string, bool) {
	for _, pre := range prefixes {
		if rest, ok := strings.CutPrefix(p, pre); ok && (rest == "" || rest[0] == '/') {
			return rest, true
		}
	}
	return "", false
}

func isWebSocketUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}
