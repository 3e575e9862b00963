package web

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDoc describes /api/v1. A test checks that it and the routes agree.
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/json", openAPIDoc)
}
