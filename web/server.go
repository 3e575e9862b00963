// Package web serves the operator side of the relay: the admin console under
// /admin/ (server-rendered with templ, see package ui), the admin REST API
// under /api/v1, and the operations endpoints (/healthz, /readyz, /metrics).
// Handlers stay thin: parse into a small struct, call the store or the relay,
// render a view model.
package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/codexrelay/codex-relay/internal/ratelimit"
	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// Config is what the web layer needs, built by cmd.
type Config struct {
	Store *store.Store
	// AdminTokenHash is the SHA-256 of the admin token; the token itself is
	// not kept in memory.
	AdminTokenHash [32]byte
	Logger         *slog.Logger
	// Registry receives the web layer's metrics; Gatherer serves /metrics.
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
	// Client, when set, serves the client routes (Codex's Responses API).
	Client http.Handler
	// Relay, when set, is this replica's relay: the console and the API list
	// its live lanes and in-flight requests, and every binding reset is
	// followed by Relay.Forget. Nil: no lanes, nothing to forget.
	Relay Relay
	// SessionKey signs the console's session cookies and CSRF tokens. cmd
	// derives it from the relay's secret key, so every replica accepts the
	// same sessions. Nil: a random key per process (sessions end with it).
	SessionKey []byte
	// Now is the clock (sessions, rate limits, ages); time.Now when nil.
	Now func() time.Time
	// Probe checks an account against its upstream now (its usage windows)
	// and returns it as stored afterwards; a limited account whose reset
	// has passed returns to service. Nil: probing is not available.
	Probe func(ctx context.Context, accountID string) (store.Account, error)
	// LiveInterval is how often the console's live views (overview, lanes,
	// diagnostics) are re-rendered for their SSE streams. Default 2s.
	LiveInterval time.Duration
	// BodyReadTimeout is how long a request to the console, the admin API or
	// the operations endpoints has to send its whole body; a slower one is
	// answered 408 and its connection closed. Default 30s. The client routes
	// bound their own reads.
	BodyReadTimeout time.Duration
	// Location is the time zone of usage reports' days and hours and of
	// calendar budget windows (CODEX_RELAY_TIMEZONE). Nil: UTC.
	Location *time.Location
	// AuthURL is the ChatGPT auth server the console's "Sign in with
	// ChatGPT" uses (CODEX_RELAY_AUTH_URL, as `accounts login -auth-url`);
	// "" is oauth.DefaultIssuer. Tests point it at the simulated upstream.
	AuthURL string
	// SignInClient returns the HTTP client a console sign-in is sent
	// through, given the proxy the account will use: its traffic's way out
	// (cmd passes the relay's upstream's Via). Nil: a client of the sign-in's
	// own, through the proxy or as the environment says.
	SignInClient func(store.Proxy) (*http.Client, error)
	// SignInTimeout is how long a console sign-in waits for its approval:
	// the life of its user code. Default 15 minutes.
	SignInTimeout time.Duration
	// AlertSelf are the addresses the relay listens on (host:port): a
	// webhook to their /api or /admin routes is refused, as one to the
	// address a request reached the console at is.
	AlertSelf []string
	// KickAlerts has this replica send due webhook deliveries now (a test
	// event); nil: they go at the deliverer's next poll.
	KickAlerts func()
	// OIDC, when set, offers single sign-on on the login page.
	OIDC *OIDC
	// NoAdminTokenLogin turns the admin token's console sign-in off
	// (CODEX_RELAY_ADMIN_TOKEN_LOGIN=off) once an admin person exists, who
	// signs in with single sign-on or a personal token; until then the
	// admin token still signs in, or nobody could. The admin API keeps
	// taking it.
	NoAdminTokenLogin bool
}

// Relay is what the web layer uses of the relay. *relay.Server has it.
type Relay interface {
	// Lanes lists the live upstream lanes of every replica.
	Lanes() []relay.LaneInfo
	// Draining reports that the replica is stopping: readiness fails.
	Draining() bool
	// InFlight reports requests under way on an account on this replica.
	InFlight(accountID string) int
	// AccountLanes reports the upstream lanes open on an account on this
	// replica, of every kind, and the cap they count against.
	AccountLanes(accountID string) (open, max int)
	// Forget drops the continuity entries and lanes of reset bindings.
	Forget(reset []store.Binding)
	// ReplicaID names this replica among those sharing the database.
	ReplicaID() string
	// ReplicaLiveSince is the heartbeat time before which a replica is dead.
	ReplicaLiveSince() time.Time
}

// noRelay stands in when Config.Relay is nil.
type noRelay struct{}

func (noRelay) Lanes() []relay.LaneInfo        { return nil }
func (noRelay) InFlight(string) int            { return 0 }
func (noRelay) Draining() bool                 { return false }
func (noRelay) AccountLanes(string) (int, int) { return 0, 0 }
func (noRelay) Forget([]store.Binding)         {}
func (noRelay) ReplicaID() string              { return "" }
func (noRelay) ReplicaLiveSince() time.Time {
	return time.Now().Add(-15 * time.Second)
}

// Server is the HTTP front of the relay. Its fields are static after New;
// sessions, the limiters, authFailures and signIns guard their own state.
type Server struct {
	cfg      Config
	echo     *echo.Echo
	metrics  *httpMetrics
	sessions *sessions
	limiter  *ratelimit.Limiter // console logins, every attempt counted
	// apiFailures limits failed admin-token attempts on the admin API per
	// client address; authFailures audits them, in aggregate.
	apiFailures  *ratelimit.Limiter
	authFailures *authFailures
	log          *slog.Logger
	signIns      *signIns // the console's sign-ins; ended by Close
	// roleOf is the route table's roles by "METHOD path" (handle); static
	// after New.
	roleOf map[string]roles.Role
	oidc   *oidcClient // nil without single sign-on
}

// New builds the server and its routes.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		reg := prometheus.NewRegistry()
		cfg.Registry, cfg.Gatherer = reg, reg
	}
	if cfg.Relay == nil {
		cfg.Relay = noRelay{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Location == nil {
		cfg.Location = time.UTC
	}
	if cfg.LiveInterval <= 0 {
		cfg.LiveInterval = 2 * time.Second
	}
	if cfg.SignInTimeout <= 0 {
		cfg.SignInTimeout = defaultSignInTimeout
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = defaultBodyReadTimeout
	}
	if len(cfg.SessionKey) == 0 {
		cfg.SessionKey = make([]byte, 32)
		if _, err := rand.Read(cfg.SessionKey); err != nil {
			panic("crypto/rand failed: " + err.Error()) // the platform is broken; nothing sane to do
		}
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	// The client address is the peer's: a forwarded-for header is the
	// client's own claim and would let it dodge the rate limits.
	e.IPExtractor = echo.ExtractIPDirect()
	s := &Server{
		cfg: cfg, echo: e, log: cfg.Logger,
		metrics:     newHTTPMetrics(cfg.Registry),
		sessions:    newSessions(cfg.SessionKey, cfg.AdminTokenHash, cfg.Now).keptIn(cfg.Store, cfg.Logger),
		limiter:     ratelimit.New(loginBurst, loginRefill, cfg.Now),
		apiFailures: ratelimit.New(apiFailureBurst, apiFailureRefill, cfg.Now),
		signIns:     newSignIns(),
		roleOf:      map[string]roles.Role{},
	}
	if cfg.OIDC != nil {
		s.oidc = newOIDCClient(*cfg.OIDC)
	}
	s.authFailures = newAuthFailures(failureWindow, cfg.Now, s.auditAuthFailures)
	e.HTTPErrorHandler = s.handleError
	s.routes()
	return s
}

// ServeHTTP makes the server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

// HashAdminToken is the form of the admin token the server compares against.
func HashAdminToken(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// adminToken reports whether token is the admin token. Hashing first makes
// the comparison constant-time whatever the lengths.
func (s *Server) adminToken(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], s.cfg.AdminTokenHash[:]) == 1
}

// Failed admin-token attempts on the admin API per client address: a burst
// of apiFailureBurst, then one more every apiFailureRefill, the console
// login's figures. Only failures count, so scripts with the right token are
// never slowed; once an address has none left, its requests are refused with
// 429, the right token's too, until the next one comes.
const (
	apiFailureBurst  = loginBurst
	apiFailureRefill = loginRefill
)

// requireBearer admits API requests bearing the admin token (actor
// admin-token, role admin) or a personal token that stands (read at every
// request: a revoked token, or a disabled user's, is refused at its next).
// A request bearing another token is a failed attempt: counted against its
// address (apiFailures) and audited in aggregate (authFailures); a request
// without any is refused uncounted.
func (s *Server) requireBearer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if token, ok := bearer(c.Request().Header.Get("Authorization")); ok {
			addr := c.RealIP()
			if ok, wait := s.apiFailures.Check(addr); !ok {
				s.authFailures.add(addr, true)
				secs := int(wait / time.Second)
				c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
				return &HTTPError{Status: http.StatusTooManyRequests, Code: "too_many_failures",
					Msg: "too many failed admin-token attempts from your address: try again in " + strconv.Itoa(secs) + " s"}
			}
			if s.adminToken(token) {
				c.Set(principalKey, adminPrincipal)
				return next(c)
			}
			if strings.HasPrefix(token, store.UserTokenPrefix) {
				t, u, err := s.cfg.Store.AuthenticateUserToken(c.Request().Context(), token)
				switch {
				case err == nil:
					s.seeUser(c.Request().Context(), u)
					c.Set(principalKey, tokenPrincipal(t, u))
					return next(c)
				case !errors.Is(err, store.ErrTokenRejected):
					return err // the store did not answer: not the client's failure
				}
			}
			s.apiFailures.Take(addr)
			s.authFailures.add(addr, false)
		}
		c.Response().Header().Set("WWW-Authenticate", `Bearer realm="codex-relay admin"`)
		return &HTTPError{Status: http.StatusUnauthorized, Code: "unauthorized",
			Msg: "admin token required, or a personal token that stands (not revoked or expired, its user not disabled): Authorization: Bearer <token>"}
	}
}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	const p = "bearer "
	if len(h) <= len(p) || !equalFoldASCII(h[:len(p)], p) {
		return "", false
	}
	return h[len(p):], true
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
