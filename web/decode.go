package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/labstack/echo/v4"
)

// decodeJSON reads the request body into v: one JSON object, no unknown
// fields, no trailing data. Errors name the offending field where one exists.
func decodeJSON(c echo.Context, v any) error {
	ct := c.Request().Header.Get("Content-Type")
	if ct != "" && !strings.HasPrefix(strings.ToLower(ct), "application/json") {
		return &HTTPError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Msg: "send Content-Type: application/json"}
	}
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "body must hold exactly one JSON object"}
	}
	return nil
}

func jsonError(err error) error {
	if he := bodyError(err); he != nil {
		return he
	}
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "body must be a JSON object"}
		}
		return badField(field, "must be %s", jsonKind(typeErr.Type.Kind().String()))
	case errors.As(err, &syntaxErr):
		return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "malformed JSON: " + syntaxErr.Error()}
	case errors.Is(err, io.EOF):
		return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "empty body: send a JSON object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "malformed JSON: unexpected end of body"}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badField(field, "unknown field")
	}
	return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_json", Msg: "malformed JSON", Err: err}
}

// bodyError is the answer to a failure to read a request body that is not
// the body's fault as JSON or form: 413 past the size limit (limitBody),
// 408 past the read deadline (bodyDeadline). Nil for any other failure.
func bodyError(err error) *HTTPError {
	var maxErr *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &maxErr):
		return tooLarge(maxErr.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return &HTTPError{Status: http.StatusRequestTimeout, Code: "request_timeout", Msg: "the request body did not arrive in time", Err: err}
	}
	return nil
}

// tooLarge is the answer to a body over limit bytes.
func tooLarge(limit int64) *HTTPError {
	size := fmt.Sprintf("%d KiB", limit>>10)
	if limit%(1<<20) == 0 {
		size = fmt.Sprintf("%d MiB", limit>>20)
	}
	return &HTTPError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large",
		Msg: "request body too large (the limit is " + size + ")"}
}

// maxFormMemory is how much of a multipart form is kept in memory; the body
// limit is below it, so no form spills to temporary files.
const maxFormMemory = 32 << 20

// readForm parses the form of a console request with a body (urlencoded or
// multipart) before any handler or check looks at it. Echo's FormValue
// swallows read errors, so a body over the limit, or cut by its read
// deadline, would otherwise reach the CSRF check and the handlers as empty
// fields (and be answered "stale form"); here it is answered 413 or 408, and
// a form that does not parse 400.
func readForm(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			return next(c)
		}
		// ParseForm first: ParseMultipartForm answers ErrNotMultipart for a
		// urlencoded form even when reading it failed.
		err := r.ParseForm()
		if err == nil {
			err = r.ParseMultipartForm(maxFormMemory)
		}
		if err != nil && !errors.Is(err, http.ErrNotMultipart) {
			if he := bodyError(err); he != nil {
				return he
			}
			return &HTTPError{Status: http.StatusBadRequest, Code: "invalid_form", Msg: "the form could not be read", Err: err}
		}
		return next(c)
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64", "int32", "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "of another type"
}
