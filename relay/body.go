package relay

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// errBodyTooLarge is a body over the limit, before or after decompression.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads a request body up to limit bytes after decompression.
// Content-Encoding zstd and gzip are decoded; anything else is refused.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(raw)) > limit {
		return nil, errBodyTooLarge
	}
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity":
		return raw, nil
	case "zstd":
		dec, err := zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderMaxMemory(uint64(limit)+1), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("zstd body: %w", err)
		}
		defer dec.Close()
		return readDecoded(dec, limit, "zstd")
	case "gzip":
		gz, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("gzip body: %w", err)
		}
		defer gz.Close()
		return readDecoded(gz, limit, "gzip")
	}
	return nil, &unsupportedEncodingError{enc}
}

func readDecoded(r io.Reader, limit int64, name string) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
		return nil, errBodyTooLarge
	}
	if err != nil {
		return nil, fmt.Errorf("%s body: %w", name, err)
	}
	if int64(len(out)) > limit {
		return nil, errBodyTooLarge
	}
	return out, nil
}

type unsupportedEncodingError struct{ enc string }

func (e *unsupportedEncodingError) Error() string {
	return fmt.Sprintf("unsupported Content-Encoding %q (send identity, zstd or gzip)", e.enc)
}

// bodyAnswer maps a readBody error to the client's answer.
func bodyAnswer(err error) answer {
	var enc *unsupportedEncodingError
	switch {
	case errors.Is(err, errBodyTooLarge):
		return answer{Status: http.StatusRequestEntityTooLarge, Err: apiError{Type: "invalid_request_error", Code: "request_too_large", Message: "request body too large"}}
	case errors.As(err, &enc):
		return answer{Status: http.StatusUnsupportedMediaType, Err: apiError{Type: "invalid_request_error", Code: "unsupported_encoding", Message: err.Error()}}
	}
	return answer{Status: http.StatusBadRequest, Err: apiError{Type: "invalid_request_error", Code: "invalid_body", Message: "could not read the request body: " + err.Error()}}
}
