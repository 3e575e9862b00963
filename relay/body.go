package relay

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

// zstdMaxWindow is the largest zstd window a body may declare when its
// limit is smaller (a 1 MiB route still takes a frame declaring 8 MiB).
const zstdMaxWindow = 8 << 20

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
		// The decoder's memory bounds the window a frame may declare: at
		// least what libzstd declares at its usual levels, whatever the
		// body's own limit, to which the decoded output is held anyway.
		dec, err := zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderMaxMemory(uint64(max(limit+1, zstdMaxWindow))), zstd.WithDecoderConcurrency(1))
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

// bodyError maps a readBody error to the client's answer.
func bodyError(err error) *requestError {
	var enc *unsupportedEncodingError
	switch {
	case errors.Is(err, errBodyTooLarge):
		return refuse(http.StatusRequestEntityTooLarge, "request_too_large", "request body too large")
	case errors.As(err, &enc):
		return refuse(http.StatusUnsupportedMediaType, "unsupported_encoding", err.Error())
	case errors.Is(err, os.ErrDeadlineExceeded):
		return refuse(http.StatusRequestTimeout, "request_timeout", "the request body did not arrive in time")
	}
	return refuse(http.StatusBadRequest, "invalid_body", "could not read the request body")
}

// readRequestBody reads a client route's request body (see readBody) within
// Config.BodyReadTimeout, so a client that sends its body slowly cannot hold
// a connection. Once the body is in, the deadline is lifted (one that passed
// later would cancel the request while it streams its answer); when it is
// not, the deadline stays, so the server's own read of what is left before
// it answers fails at once too and the connection closes.
func (s *Server) readRequestBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rc := http.NewResponseController(w)
	armed := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)) == nil
	b, err := readBody(r, limit)
	if err != nil {
		return nil, bodyError(err)
	}
	if armed {
		_ = rc.SetReadDeadline(time.Time{})
	}
	w.Header().Del("Connection") // the body is in: the connection may serve the next request (see ServeHTTP)
	if !utf8.Valid(b) {
		// JSON is UTF-8 (RFC 8259). Forwarded, an upstream would read other
		// text than the relay (encoding/json reads such bytes as U+FFFD), as
		// over a WebSocket, whose text frame is closed with 1007 for it.
		return nil, refuse(http.StatusBadRequest, "invalid_json", "the request body is not valid UTF-8")
	}
	return b, nil
}
