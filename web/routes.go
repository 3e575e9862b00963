package web

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Request body limits: the admin API's JSON, and the console's forms (an
// imported auth.json included).
const (
	maxAPIBody     = "1M"
	maxConsoleBody = "1M"
)

// routes is the one place every route of the server is declared.
func (s *Server) routes() {
	e := s.echo
	e.Use(middleware.Recover())
	e.Use(s.metrics.middleware)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metricsHandler())

	// The admin API: every route needs the admin bearer token.
	api := e.Group("/api/v1", s.requireAdmin, middleware.BodyLimit(maxAPIBody))
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
	api.GET("/audit", s.listAudit)
	api.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	// The console. Only the login page and the static files are public;
	// every other page needs a session, and every write its CSRF token.
	pub := e.Group("/admin", consoleHeaders, middleware.BodyLimit(maxConsoleBody))
	pub.GET("/login", s.loginPage)
	pub.POST("/login", s.login)
	pub.GET("/static/*", s.static())

	con := e.Group("/admin", consoleHeaders, middleware.BodyLimit(maxConsoleBody), s.requireSession, s.requireCSRF)
	con.GET("", func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/admin/") })
	con.GET("/", s.overviewPage)
	con.GET("/accounts", s.accountsPage)
	con.POST("/accounts", s.consoleAddAccount)
	con.POST("/accounts/import", s.consoleImportAccount)
	con.POST("/accounts/:id/pause", s.consolePauseAccount)
	con.POST("/accounts/:id/probe", s.consoleProbeAccount)
	con.POST("/accounts/:id/resume", s.consoleResumeAccount)
	con.GET("/bindings", s.bindingsPage)
	con.POST("/bindings/reset", s.consoleResetBindings)
	con.POST("/bindings/pin", s.consolePin)
	con.GET("/lanes", s.lanesPage)
	con.GET("/diagnostics", s.diagnosticsPage)
	con.GET("/requests", s.requestsPage)
	con.GET("/keys", s.keysPage)
	con.POST("/keys", s.consoleCreateKey)
	con.POST("/keys/:id/revoke", s.consoleRevokeKey)
	con.GET("/settings", s.settingsPage)
	con.GET("/audit", s.auditPage)
	con.GET("/live/:topic", s.live)
	con.POST("/logout", s.logout)
	con.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	if s.cfg.Client != nil {
		e.Any("/backend-api/*", echo.WrapHandler(s.cfg.Client))
		e.Any("/v1/*", echo.WrapHandler(s.cfg.Client))
	}
}
