package web

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/web/ui"
)

// render is the one way a console page is answered: the component is
// rendered to a buffer first, so a failure becomes a proper error page
// instead of half a page.
func (s *Server) render(c echo.Context, status int, page templ.Component) error {
	var buf bytes.Buffer
	if err := page.Render(c.Request().Context(), &buf); err != nil {
		return fmt.Errorf("render %s: %w", c.Path(), err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}

// contentSecurityPolicy allows the console's own script, stylesheet and
// event streams and nothing else: no inline script or style, no frames, no
// other origins.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// consoleHeaders sets the console's security headers on every answer.
func consoleHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(c.Request().URL.Path, "/admin/static/") {
			h.Set("Cache-Control", "no-store")
		}
		return next(c)
	}
}

// static serves the console's stylesheet and script. Their URLs carry a
// content version, so browsers may keep them.
func (s *Server) static() echo.HandlerFunc {
	files := http.StripPrefix("/admin/static/", http.FileServer(http.FS(ui.Static())))
	return func(c echo.Context) error {
		if strings.HasSuffix(c.Request().URL.Path, "/") {
			return echo.ErrNotFound // no folder listings
		}
		c.Response().Header().Set("Cache-Control", "public, max-age=86400")
		files.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}
