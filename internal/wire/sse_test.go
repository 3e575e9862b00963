package wire

import (
	"bytes"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readAll(t *testing.T, r *SSEReader) ([]SSEEvent, error) {
	t.Helper()
	var out []SSEEvent
	for {
		ev, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, SSEEvent{Name: ev.Name, Data: bytes.Clone(ev.Data)})
	}
}

func TestSSEReader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    []SSEEvent
		wantErr error
	}{
		{"data only", "data: {\"a\":1}\n\n", []SSEEvent{{Data: []byte(`{"a":1}`)}}, io.EOF},
		{"named", "event: response.created\ndata: x\n\n", []SSEEvent{{Name: "response.created", Data: []byte("x")}}, io.EOF},
		{"crlf", "event: e\r\ndata: x\r\n\r\n", []SSEEvent{{Name: "e", Data: []byte("x")}}, io.EOF},
		{"lone cr", "data: x\r\rdata: y\r\r", []SSEEvent{{Data: []byte("x")}, {Data: []byte("y")}}, io.EOF},
		{"multi line data", "data: a\ndata: b\n\n", []SSEEvent{{Data: []byte("a\nb")}}, io.EOF},
		{"no space after colon", "data:x\n\n", []SSEEvent{{Data: []byte("x")}}, io.EOF},
		{"only first space stripped", "data:  x\n\n", []SSEEvent{{Data: []byte(" x")}}, io.EOF},
		{"comments and ids ignored", ": ping\nid: 7\nretry: 10\ndata: x\n\n", []SSEEvent{{Data: []byte("x")}}, io.EOF},
		{"event without data skipped", "event: e\n\ndata: x\n\n", []SSEEvent{{Data: []byte("x")}}, io.EOF},
		{"empty data kept", "data\n\n", []SSEEvent{{Data: []byte("")}}, io.EOF},
		{"blank lines between", "\n\n\ndata: x\n\n\n", []SSEEvent{{Data: []byte("x")}}, io.EOF},
		{"cut inside event", "data: x\n\ndata: y\n", []SSEEvent{{Data: []byte("x")}}, io.ErrUnexpectedEOF},
		{"cut without newline", "data: x\n\ndata: {\"par", []SSEEvent{{Data: []byte("x")}}, io.ErrUnexpectedEOF},
		{"trailing comment is not a cut", "data: x\n\n: bye", []SSEEvent{{Data: []byte("x")}}, io.EOF},
		{"empty stream", "", nil, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := readAll(t, NewSSEReader(strings.NewReader(tt.in), 0, 0))
			assert.ErrorIs(t, err, tt.wantErr)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestSSEReaderLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		in                string
		maxLine, maxEvent int
		wantErr           error
		wantEvents        int
	}{
		{"line within limit", "data: 12345\n\n", 16, 16, io.EOF, 1},
		{"line too long", "data: 1234567890123456789\n\n", 16, 1024, ErrSSELineTooLong, 0},
		{"event too large across lines", "data: 12345\ndata: 12345\ndata: 12345\n\n", 64, 12, ErrSSEEventTooLarge, 0},
		{"event at limit", "data: 12345\ndata: 12345\n\n", 64, 11, io.EOF, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := readAll(t, NewSSEReader(strings.NewReader(tt.in), tt.maxLine, tt.maxEvent))
			assert.ErrorIs(t, err, tt.wantErr)
			assert.Len(t, got, tt.wantEvents)
		})
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestSSEReaderPropagatesReadError(t *testing.T) {
	t.Parallel()
	_, err := NewSSEReader(errReader{}, 0, 0).Next()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "boom")
}

func TestSSEWriterRoundTrip(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	w := NewSSEWriter(rec)
	events := []SSEEvent{
		{Name: EventResponseCreated, Data: []byte(`{"type":"response.created"}`)},
		{Data: []byte("two\nlines")},
		{Name: "crlf", Data: []byte("a\r\nb\rc")},
		{Data: []byte("")},
	}
	for _, ev := range events {
		require.NoError(t, w.WriteEvent(ev.Name, ev.Data))
	}
	assert.True(t, rec.Flushed, "writer must flush after each event")
	assert.True(t, strings.HasPrefix(rec.Body.String(), "event: response.created\ndata: {\"type\":\"response.created\"}\n\n"))

	got, err := readAll(t, NewSSEReader(rec.Body, 0, 0))
	assert.ErrorIs(t, err, io.EOF)
	want := []SSEEvent{events[0], events[1], {Name: "crlf", Data: []byte("a\nb\nc")}, events[3]}
	assert.Equal(t, want, got)
}

// FuzzSSEReader checks that the reader never panics, honours its limits, and
// that whatever it decodes survives a write and a second read unchanged.
func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{
		"data: x\n\n", "event: a\r\ndata: b\r\n\r\n", "data: a\rdata: b\r\r", ":c\n\ndata\n\n",
		"data: {\"type\":\"response.completed\"}\n\n", "data: x", "\r", "data: \r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		const maxLine, maxEvent = 256, 512
		r := NewSSEReader(bytes.NewReader(in), maxLine, maxEvent)
		var events []SSEEvent
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			if len(ev.Data) > maxEvent {
				t.Fatalf("event of %d bytes exceeds limit %d", len(ev.Data), maxEvent)
			}
			events = append(events, SSEEvent{Name: ev.Name, Data: bytes.Clone(ev.Data)})
		}
		var buf bytes.Buffer
		w := NewSSEWriter(&buf)
		for _, ev := range events {
			if strings.ContainsAny(ev.Name, "\r\n") {
				t.Fatalf("event name %q holds a line break", ev.Name)
			}
			if err := w.WriteEvent(ev.Name, ev.Data); err != nil {
				t.Fatal(err)
			}
		}
		again, err := readAll(t, NewSSEReader(&buf, 0, 0))
		if !errors.Is(err, io.EOF) {
			t.Fatalf("re-read: %v", err)
		}
		if len(again) != len(events) {
			t.Fatalf("re-read %d events, want %d", len(again), len(events))
		}
		for i := range events {
			if again[i].Name != events[i].Name || !bytes.Equal(again[i].Data, events[i].Data) {
				t.Fatalf("event %d: got %q/%q, want %q/%q", i, again[i].Name, again[i].Data, events[i].Name, events[i].Data)
			}
		}
	})
}
