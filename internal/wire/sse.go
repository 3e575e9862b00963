package wire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Limits of the SSE reader, sized for Responses streams: an event carries one
// JSON document, and a response.completed event repeats every output item, so
// a single event can be large, but a line or event past these sizes is taken
// as a broken or hostile upstream rather than buffered without end.
const (
	// DefaultMaxSSELine is the longest line NewSSEReader accepts.
	DefaultMaxSSELine = 16 << 20
	// DefaultMaxSSEEvent is the largest event (the sum of its data lines)
	// NewSSEReader accepts.
	DefaultMaxSSEEvent = 16 << 20
)

// ErrSSELineTooLong and ErrSSEEventTooLarge report a stream that exceeded the
// reader's limits. The reader cannot continue after either.
var (
	ErrSSELineTooLong   = errors.New("sse: line too long")
	ErrSSEEventTooLarge = errors.New("sse: event too large")
)

// SSEEvent is one server-sent event. Name is the value of its "event:" field,
// empty when the stream sent none (it is optional for Responses streams: the
// type is also inside the data). Data is the event's data lines joined by
// "\n".
type SSEEvent struct {
	Name string
	Data []byte
}

// SSEReader decodes a text/event-stream body as the WHATWG specification
// describes: lines end in "\n", "\r\n" or "\r"; "data:" lines accumulate;
// "event:" names the event; lines starting with ":" are comments; a blank
// line dispatches the event, unless it has no data. "id:" and "retry:" are
// read and ignored. It is not safe for concurrent use.
type SSEReader struct {
	sc       *bufio.Scanner
	maxEvent int
	name     string
	lastName string // the last event name read, reused while it repeats
	data     []byte
	hasData  bool
	pending  bool // some field of an undispatched event has been read
}

// NewSSEReader returns a reader of r that refuses lines longer than maxLine
// and events larger than maxEvent bytes; zero or negative limits select
// DefaultMaxSSELine and DefaultMaxSSEEvent.
func NewSSEReader(r io.Reader, maxLine, maxEvent int) *SSEReader {
	if maxLine <= 0 {
		maxLine = DefaultMaxSSELine
	}
	if maxEvent <= 0 {
		maxEvent = DefaultMaxSSEEvent
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(maxLine, 64<<10)), maxLine)
	sc.Split(scanSSELines)
	return &SSEReader{sc: sc, maxEvent: maxEvent, data: make([]byte, 0, 512)}
}

// Next returns the next event. At the end of the stream it returns io.EOF,
// or io.ErrUnexpectedEOF when the stream ended inside an event (a field was
// read but no blank line followed): a cut stream, whose partial event is
// dropped. The returned Data is valid until the next call.
func (r *SSEReader) Next() (SSEEvent, error) {
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if len(line) == 0 {
			if !r.hasData {
				r.reset()
				continue
			}
			ev := SSEEvent{Name: r.name, Data: r.data}
			r.reset()
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		r.pending = true
		switch string(field) {
		case "data":
			if r.hasData {
				r.data = append(r.data, '\n')
			}
			if len(r.data)+len(value) > r.maxEvent {
				return SSEEvent{}, ErrSSEEventTooLarge
			}
			r.data = append(r.data, value...)
			r.hasData = true
		case "event":
			// Streams repeat a few names: the last one is reused rather
			// than allocated again for every event.
			if string(value) != r.lastName {
				r.lastName = string(value)
			}
			r.name = r.lastName
		}
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return SSEEvent{}, ErrSSELineTooLong
		}
		return SSEEvent{}, fmt.Errorf("sse: read: %w", err)
	}
	if r.pending {
		r.reset()
		return SSEEvent{}, io.ErrUnexpectedEOF
	}
	return SSEEvent{}, io.EOF
}

func (r *SSEReader) reset() {
	r.name = ""
	r.data = r.data[:0]
	r.hasData = false
	r.pending = false
}

// scanSSELines splits at "\n", "\r\n" or a lone "\r", without the terminator.
func scanSSELines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	i := bytes.IndexAny(data, "\r\n")
	if i < 0 {
		if atEOF && len(data) > 0 {
			// A final line without terminator is not a complete line: the
			// event it belongs to was cut. Hand it over so the caller sees a
			// pending field, then EOF.
			return len(data), data, nil
		}
		return 0, nil, nil
	}
	if data[i] == '\n' {
		return i + 1, data[:i], nil
	}
	// data[i] == '\r': a "\r\n" pair or a lone "\r". At the buffer's end we
	// cannot tell yet, unless the stream ended.
	if i+1 < len(data) {
		if data[i+1] == '\n' {
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	}
	if atEOF {
		return i + 1, data[:i], nil
	}
	return 0, nil, nil
}

// SSEWriter encodes events as text/event-stream and flushes after each one,
// so a client sees every event as soon as it is written. It is not safe for
// concurrent use.
type SSEWriter struct {
	w   io.Writer
	buf []byte
}

// NewSSEWriter returns a writer to w. When w has a Flush method, or a
// FlushError method (as http.ResponseWriter implementations do), it is
// called after every event.
func NewSSEWriter(w io.Writer) *SSEWriter { return &SSEWriter{w: w} }

// WriteEvent writes one event: an "event:" line when name is not empty, one
// "data:" line per line of data, and the blank line that dispatches it.
func (s *SSEWriter) WriteEvent(name string, data []byte) error {
	b := s.buf[:0]
	if name != "" {
		b = append(b, "event: "...)
		b = append(b, name...)
		b = append(b, '\n')
	}
	for {
		i := bytes.IndexAny(data, "\r\n")
		line := data
		if i >= 0 {
			line = data[:i]
		}
		b = append(b, "data: "...)
		b = append(b, line...)
		b = append(b, '\n')
		if i < 0 {
			break
		}
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b = append(b, '\n')
	s.buf = b
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("sse: write: %w", err)
	}
	return s.Flush()
}

// Flush flushes the underlying writer when it can be flushed.
func (s *SSEWriter) Flush() error {
	switch f := s.w.(type) {
	case interface{ FlushError() error }:
		if err := f.FlushError(); err != nil {
			return fmt.Errorf("sse: flush: %w", err)
		}
	case interface{ Flush() error }:
		if err := f.Flush(); err != nil {
			return fmt.Errorf("sse: flush: %w", err)
		}
	case interface{ Flush() }:
		f.Flush()
	}
	return nil
}
