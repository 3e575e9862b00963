package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// HTTPError is an error with the answer the client sees kept apart from the
// cause that is logged: Code and Msg are shown, Err is not.
type HTTPError struct {
	Status int    // HTTP status
	Type   string // the kind of refusal, e.g. "forbidden"; "" for none
	Code   string // machine-readable code, e.g. "invalid_field"
	Msg    string // shown to the client
	Field  string // the offending input field, for 400s
	Err    error  // the cause; logged, never shown
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Code, e.Msg, e.Err)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Msg)
}

func (e *HTTPError) Unwrap() error { return e.Err }

// badField is a 400 naming the field that is wrong.
func badField(field, format string, args ...any) *HTTPError {
	return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_field", Field: field,
		Msg: field + ": " + fmt.Sprintf(format, args...)}
}

// errorBody is the one JSON error shape of the API.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Type    string `json:"type,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// toHTTPError maps any error a handler returns to what the client sees.
func toHTTPError(err error) *HTTPError {
	var he *HTTPError
	if errors.As(err, &he) {
		return he
	}
	var ee *echo.HTTPError
	if errors.As(err, &ee) {
		msg := http.StatusText(ee.Code)
		if m, ok := ee.Message.(string); ok && m != "" {
			msg = m
		}
		code := "http_error"
		switch ee.Code {
		case http.StatusNotFound:
			code = "not_found"
		case http.StatusMethodNotAllowed:
			code = "method_not_allowed"
		case http.StatusRequestEntityTooLarge:
			code = "request_too_large"
		case http.StatusRequestTimeout:
			code = "request_timeout"
		case http.StatusUnauthorized:
			code = "unauthorized"
		case http.StatusForbidden:
			code = "forbidden"
		}
		return &HTTPError{Status: ee.Code, Code: code, Msg: msg, Err: ee.Internal}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &HTTPError{Status: http.StatusNotFound, Code: "not_found", Msg: "no such object", Err: err}
	case errors.Is(err, store.ErrInvalid):
		return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_field", Msg: err.Error(), Err: err}
	case errors.Is(err, store.ErrConflict):
		return &HTTPError{Status: http.StatusConflict, Code: "conflict", Msg: "an object with that identity exists", Err: err}
	}
	return &HTTPError{Status: http.StatusInternalServerError, Code: "internal_error", Msg: "internal error", Err: err}
}

// statusClientClosed is the status of a request whose client went away
// before it was answered. HTTP has none; 499 is nginx's, which dashboards
// know.
const statusClientClosed = 499

// answerTo is what a request that failed with err is answered and counted
// as: toHTTPError's answer, except that a server fault caused by the client
// going away (its request context cancelled, or err wrapping
// context.Canceled) is the client's doing, not a 500. Answers below 500
// stand: a body cut by its read deadline also cancels the context, and is
// still a 408.
func answerTo(c echo.Context, err error) *HTTPError {
	he := toHTTPError(err)
	if he.Status >= 500 && (errors.Is(err, context.Canceled) || clientGone(c)) {
		return &HTTPError{Status: statusClientClosed, Code: "client_closed_request", Msg: "the client closed the request", Err: err}
	}
	return he
}

// clientGone reports whether the request's context was cancelled: net/http
// does that when the client hangs up (or the server is closed under it).
func clientGone(c echo.Context) bool {
	return errors.Is(c.Request().Context().Err(), context.Canceled)
}

// handleError renders every error in one place: the console gets an error
// page, everything else the one JSON shape. The shown message (Msg) is kept
// apart from the cause (Err), which is logged for server faults; a request
// the client abandoned is routine, logged at debug level only.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	he := answerTo(c, err)
	switch {
	case he.Status == statusClientClosed:
		s.log.Debug("request cancelled by the client", "method", c.Request().Method, "path", c.Path(), "err", err)
	case he.Status >= 500:
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(he.Status)
		return
	}
	if isConsole(c.Request().URL.Path) {
		page := ui.ErrorPage(ui.ErrorView{Status: he.Status, Title: errorTitle(he.Status), Message: he.Msg})
		if rerr := s.render(c, he.Status, page); rerr == nil {
			return
		}
	}
	_ = c.JSON(he.Status, errorBody{Error: errorDetail{Type: he.Type, Code: he.Code, Message: he.Msg, Field: he.Field}})
}

func isConsole(path string) bool { return path == "/admin" || strings.HasPrefix(path, "/admin/") }

func errorTitle(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "That did not work"
	case http.StatusUnauthorized:
		return "Log in first"
	case http.StatusForbidden:
		return "Refused"
	case http.StatusNotFound:
		return "Not found"
	case http.StatusTooManyRequests:
		return "Too many requests"
	case http.StatusRequestEntityTooLarge:
		return "Request too large"
	case http.StatusRequestTimeout:
		return "Request took too long"
	}
	if status >= 500 {
		return "Something went wrong"
	}
	return http.StatusText(status)
}
