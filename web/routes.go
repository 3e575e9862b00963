package web

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Request body limits: the admin API's JSON, and the console's forms (an
// imported auth.json included).
const (
	maxAPIBody     = 1 << 20
	maxConsoleBody = 1 << 20
)

// defaultBodyReadTimeout is how long a request to the console, the admin API
// or the operations endpoints has to send its whole body (Config.BodyReadTimeout).
// Their bodies are small forms and JSON objects: a client still sending
// after this is trickling bytes to hold a connection and its goroutine.
const defaultBodyReadTimeout = 30 * time.Second

// routes is the one place every route of the server is declared.
func (s *Server) routes() {
	e := s.echo
	e.Use(middleware.Recover())
	e.Use(s.metrics.middleware)
	e.Use(s.bodyDeadline)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metricsHandler())
	// The bare address is where a newcomer's browser lands: the console.
	e.Any("/", rootRedirect)

	// The admin API: every route needs the admin bearer token.
	api := e.Group("/api/v1", s.requireAdmin, limitBody(maxAPIBody))
	api.GET("/openapi.json", s.openAPI)
	api.GET("/accounts", s.listAccounts)
	api.POST("/accounts", s.createAccount)
	api.GET("/accounts/:id", s.getAccount)
	api.PATCH("/accounts/:id", s.patchAccount)
	api.DELETE("/accounts/:id", s.deleteAccount)
	api.POST("/accounts/:id/pause", s.pauseAccount)
	api.POST("/accounts/:id/probe", s.probeAccountAPI)
	api.POST("/accounts/:id/resume", s.resumeAccount)
	api.GET("/keys", s.listKeys)
	api.POST("/keys", s.createKey)
	api.GET("/keys/:id", s.getKey)
	api.PATCH("/keys/:id", s.patchKey)
	api.DELETE("/keys/:id", s.revokeKey)
	api.GET("/bindings", s.listBindings)
	api.POST("/bindings", s.createPin)
	api.POST("/bindings/reset", s.resetBindingsAPI)
	api.GET("/bindings/:id", s.getBinding)
	api.DELETE("/bindings/:id", s.deleteBinding)
	api.GET("/lanes", s.listLanes)
	api.GET("/replicas", s.listReplicas)
	api.GET("/diagnostics", s.listDiagnostics)
	api.GET("/requests", s.listRequests)
	api.GET("/usage", s.usage)
	api.GET("/audit", s.listAudit)
	api.GET("/prices", s.getPrices)
	api.PUT("/prices", s.putPrices)
	api.GET("/prices/history", s.priceHistory)
	api.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	// The console. Only the login page and the static files are public;
	// every other page needs a session, and every write its CSRF token.
	// Forms are read before either check looks at them (readForm).
	pub := e.Group("/admin", consoleHeaders, limitBody(maxConsoleBody), readForm)
	pub.GET("/login", s.loginPage)
	pub.POST("/login", s.login)
	pub.GET("/static/*", s.static())

	con := e.Group("/admin", consoleHeaders, limitBody(maxConsoleBody), s.requireSession, readForm, s.requireCSRF, s.noteSeen)
	con.GET("", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/admin/") })
	con.GET("/", s.overviewPage)
	con.GET("/accounts", s.accountsPage)
	con.POST("/accounts", s.consoleAddAccount)
	con.POST("/accounts/import", s.consoleImportAccount)
	con.POST("/accounts/signin", s.consoleStartSignIn)
	con.GET("/accounts/signin/:id", s.signInPage)
	con.POST("/accounts/signin/:id/cancel", s.consoleCancelSignIn)
	con.GET("/accounts/:id", s.accountPage)
	con.POST("/accounts/:id", s.consoleSaveAccount)
	con.GET("/accounts/:id/remove", s.removeAccountPage)
	con.POST("/accounts/:id/remove", s.consoleRemoveAccount)
	con.POST("/accounts/:id/pause", s.consolePauseAccount)
	con.POST("/accounts/:id/probe", s.consoleProbeAccount)
	con.POST("/accounts/:id/resume", s.consoleResumeAccount)
	con.GET("/bindings", s.bindingsPage)
	con.POST("/bindings/reset", s.consoleResetBindings)
	con.POST("/bindings/pin", s.consolePin)
	con.GET("/lanes", s.lanesPage)
	con.GET("/diagnostics", s.diagnosticsPage)
	con.GET("/requests", s.requestsPage)
	con.GET("/requests/:id", s.requestPage)
	con.GET("/search", s.searchPage)
	con.GET("/usage", s.usagePage)
	con.GET("/usage.csv", s.usageCSV)
	con.GET("/keys", s.keysPage)
	con.POST("/keys", s.consoleCreateKey)
	con.GET("/keys/:id", s.keyPage)
	con.POST("/keys/:id", s.consoleUpdateKey)
	con.POST("/keys/:id/revoke", s.consoleRevokeKey)
	con.GET("/settings", s.settingsPage)
	con.POST("/settings/prices", s.consoleSavePrices)
	con.GET("/audit", s.auditPage)
	con.GET("/live/:topic", s.live)
	con.POST("/logout", s.logout)
	s.webhookRoutes(api, con)
	con.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	if s.cfg.Client != nil {
		e.Any(backendAPIRoute, echo.WrapHandler(s.cfg.Client))
		e.Any(openAIRoute, echo.WrapHandler(s.cfg.Client))
	}
	s.metrics.setRoutes(e.Routes())
}

// rootRedirect sends a GET or HEAD of exactly / to the console; any other
// method there is answered 404, as every unknown route is.
func rootRedirect(c echo.Context) error {
	if m := c.Request().Method; m != http.MethodGet && m != http.MethodHead {
		return echo.ErrNotFound
	}
	return c.Redirect(http.StatusFound, "/admin/")
}

// The client routes: Codex's, served by Config.Client, which bounds its own
// reads (its bodies are large and its streams long).
const (
	backendAPIRoute = "/backend-api/*"
	openAIRoute     = "/v1/*"
)

func isClientRoute(path string) bool { return path == backendAPIRoute || path == openAIRoute }

// limitBody refuses a body over n bytes with 413: at once when its length
// is declared, else (a chunked body) when a read passes n, which readForm
// and decodeJSON answer as 413 too. http.MaxBytesReader also tells net/http
// to close the connection after the answer instead of reading the rest.
func limitBody(n int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > n {
				return tooLarge(n)
			}
			r.Body = http.MaxBytesReader(c.Response().Writer, r.Body, n)
			return next(c)
		}
	}
}

// bodyDeadline gives every request with a body, except on the client routes,
// Config.BodyReadTimeout to send all of it: a read past the deadline fails
// (answered 408), and so do net/http's own reads to drain a body the handler
// left unread, which closes the connection.
//
// Once the body has been read to its end, net/http starts a background read
// to notice a hang-up, and clears the read deadline as it does (server.go,
// startBackgroundRead): a deadline passing under that read would fail it and
// cancel the request's context, so the deadline must not outlive the body.
// TestBodyReadDeadline holds net/http to that. Nothing is reset when the
// handler returns: an error answer is written after this middleware returns,
// and net/http drains an unread body before writing it, which must stay
// bounded. Bodiless requests get no deadline (their background read runs
// from the start, so a deadline would cancel them), nor do upgrades.
func (s *Server) bodyDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Upgrade") != "" || isClientRoute(c.Path()) {
			return next(c)
		}
		// A writer without deadlines (a test recorder) has nothing to bound.
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
		return next(c)
	}
}
