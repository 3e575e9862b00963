// Package web serves the operator side of the relay: the admin REST API under
// /api/v1, the operations endpoints (/healthz, /readyz, /metrics), and later
// the console. Handlers stay thin: parse, call the store or the relay, render.
package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/codexrelay/codex-relay/relay/store"
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
}

// Server is the HTTP front of the relay. Static after New.
type Server struct {
	cfg     Config
	echo    *echo.Echo
	metrics *httpMetrics
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
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(cfg.Logger)
	s := &Server{cfg: cfg, echo: e, metrics: newHTTPMetrics(cfg.Registry)}
	s.routes()
	return s
}

// ServeHTTP makes the server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

// HashAdminToken is the form of the admin token the server compares against.
func HashAdminToken(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// requireAdmin admits requests bearing the admin token. Hashing both sides
// first makes the comparison constant-time whatever the lengths.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		token, ok := bearer(c.Request().Header.Get("Authorization"))
		if ok {
			sum := sha256.Sum256([]byte(token))
			if subtle.ConstantTimeCompare(sum[:], s.cfg.AdminTokenHash[:]) == 1 {
				return next(c)
			}
		}
		c.Response().Header().Set("WWW-Authenticate", `Bearer realm="codex-relay admin"`)
		return &HTTPError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "admin token required (Authorization: Bearer <CODEX_RELAY_ADMIN_TOKEN>)"}
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
