package web

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
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
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return &HTTPError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Msg: "request body too large"}
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
