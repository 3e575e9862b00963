package relay

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
)

// maxModelField bounds the "model" field of a multipart upload the relay
// reads; a longer value names no model a key lists.
const maxModelField = 256

// errModelDecided ends the multipart reader's input once the model is
// known: the rest of the body only passes through.
var errModelDecided = errors.New("multipart model decided")

// modelWatch streams a multipart upload (an image edit, a transcription)
// upstream as it comes, while a parser reads it alongside to find its
// "model" field and check it against the client key's models. The body is
// not held: each chunk goes to the parser and on upstream, but for its
// last few bytes (hold, the length of the closing delimiter), which go
// only once the model is allowed. Without them the upstream has no whole
// request (a multipart body ends with its delimiter), so a refused model,
// no model for a key that lists models, or a body that is not multipart
// fails the read before the upstream could act, and the client is told why
// (see refused). The parser is the watch's: it ends when the model is
// decided, when the body ends, or on close.
type modelWatch struct {
	r    io.Reader
	pw   *io.PipeWriter
	done chan struct{} // closed once the model is decided (err set before)
	err  error         // the refusal, read after done
	once sync.Once
	// hold is the tail of what was read, kept back until the model is
	// allowed; keep is how long it is while undecided.
	hold []byte
	keep int
	eof  bool
}

// watchModel starts the watch of body, a multipart upload with boundary,
// for the model check. check is the key's verdict on a model ("" when the
// body names none).
func watchModel(body io.Reader, boundary string, check func(model string) error) *modelWatch {
	pr, pw := io.Pipe()
	w := &modelWatch{r: body, pw: pw, done: make(chan struct{}), keep: len(boundary) + 8} // "\r\n--" boundary "--\r\n"
	go func() {
		err := decideModel(multipart.NewReader(pr, boundary), check)
		w.err = err
		close(w.done)
		pr.CloseWithError(errModelDecided) // the body's writes to the parser end here
	}()
	return w
}

// decideModel reads parts until the "model" field and returns check's
// verdict on it, or on "" when the body ends without one; a body that is
// not valid multipart cannot show its model and is refused.
func decideModel(mr *multipart.Reader, check func(string) error) error {
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return check("")
		}
		if err != nil {
			return refuse(http.StatusBadRequest, "invalid_multipart", "the request body is not valid multipart/form-data")
		}
		if part.FormName() != "model" || part.FileName() != "" {
			continue
		}
		value, err := io.ReadAll(io.LimitReader(part, maxModelField+1))
		if err != nil {
			return refuse(http.StatusBadRequest, "invalid_multipart", "the request body is not valid multipart/form-data")
		}
		if len(value) > maxModelField {
			return refuse(http.StatusBadRequest, "invalid_request", "the \"model\" field is too long")
		}
		return check(strings.TrimSpace(string(value)))
	}
}

// Read passes the body on, a copy to the parser first, keeping its tail
// back while the model is undecided; at the body's end it waits for the
// verdict (the parser has all there is by then), and a refusal fails the
// read instead of ending the body.
func (w *modelWatch) Read(p []byte) (int, error) {
	for {
		decided := false
		select {
		case <-w.done:
			if w.err != nil {
				return 0, w.err
			}
			decided = true
		default:
		}
		if decided && len(w.hold) > 0 {
			n := copy(p, w.hold)
			w.hold = w.hold[n:]
			return n, nil
		}
		if w.eof {
			return 0, io.EOF
		}
		if decided {
			return w.r.Read(p)
		}
		n, err := w.r.Read(p)
		if n > 0 {
			// A write error is the parser done with its input: the body
			// goes on without it.
			_, _ = w.pw.Write(p[:n])
		}
		all := append(w.hold, p[:n]...)
		out := max(len(all)-w.keep, 0)
		copy(p, all[:out])
		w.hold = append([]byte(nil), all[out:]...)
		switch {
		case err == io.EOF:
			w.eof = true
			w.close()
			<-w.done
			if w.err != nil {
				return 0, w.err
			}
		case err != nil:
			return out, err
		}
		if out > 0 {
			return out, nil
		}
	}
}

// close ends the parser's input: at the body's end, or when the request
// ends before it (the upstream stopped reading).
func (w *modelWatch) close() { w.once.Do(func() { _ = w.pw.Close() }) }

// refused is the model check's refusal once the body was read through or
// cut by it, nil otherwise.
func (w *modelWatch) refused() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// multipartBoundary is the boundary of a multipart/form-data Content-Type,
// "" for any other.
func multipartBoundary(contentType string) string {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" {
		return ""
	}
	return params["boundary"]
}
