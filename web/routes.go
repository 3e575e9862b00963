package web

import (
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// maxAPIBody bounds every admin API request body.
const maxAPIBody = "1M"

// routes is the one place every route of the server is declared.
func (s *Server) routes() {
	e := s.echo
	e.Use(middleware.Recover())
	e.Use(s.metrics.middleware)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metricsHandler())

	api := e.Group("/api/v1", s.requireAdmin, middleware.BodyLimit(maxAPIBody))
	api.GET("/openapi.json", s.openAPI)
	api.GET("/accounts", s.listAccounts)
	api.POST("/accounts", s.createAccount)
	api.GET("/accounts/:id", s.getAccount)
	api.PATCH("/accounts/:id", s.patchAccount)
	api.DELETE("/accounts/:id", s.deleteAccount)
	api.POST("/accounts/:id/pause", s.pauseAccount)
	api.POST("/accounts/:id/resume", s.resumeAccount)
	api.GET("/keys", s.listKeys)
	api.POST("/keys", s.createKey)
	api.GET("/keys/:id", s.getKey)
	api.DELETE("/keys/:id", s.revokeKey)
	api.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	if s.cfg.Client != nil {
		e.Any("/backend-api/*", echo.WrapHandler(s.cfg.Client))
		e.Any("/v1/*", echo.WrapHandler(s.cfg.Client))
	}
}
