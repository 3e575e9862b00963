package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/klauspost/compress/zstd"

	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// probe is one request at or over a limit, and the answer it must get.
type probe struct {
	name, expect string
	run          func(ctx context.Context) (got string, ok bool)
}

// probes sends every limit probe, one after another (the largest hold tens
// of MiB each), and reports their answers.
func (e *hostileEnv) probes(ctx context.Context) []hostileProbe {
	var out []hostileProbe
	for _, p := range e.probeList() {
		pctx, cancel := context.WithTimeout(ctx, e.h.probeTimeout)
		start := time.Now()
		got, ok := p.run(pctx)
		took := time.Since(start)
		cancel()
		out = append(out, hostileProbe{Name: p.name, Expect: p.expect, Got: clipText(got, 300), OK: ok, Ms: ms(took)})
	}
	return out
}

func (e *hostileEnv) probeList() []probe {
	limit, maxMsg := e.h.maxBody, e.h.maxMessage
	const headerLimit = app.MaxHeaderBytes
	completed := "200 and response.completed"
	tooLarge := "413 request_too_large"
	return []probe{
		{"body at the limit", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, paddedRequest(e.probeSession(), int(limit)), "", http.StatusOK, "")
		}},
		{"body one byte over", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, paddedRequest(e.probeSession(), int(limit)+1), "", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"zstd body inflating to the limit", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, zstdOf(paddedRequest(e.probeSession(), int(limit))), "zstd", http.StatusOK, "")
		}},
		{"zstd bomb (inflates to 16x the limit)", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, zstdOf(paddedRequest(e.probeSession(), int(16*limit))), "zstd", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"gzip bomb (inflates to 16x the limit)", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, gzipOf(paddedRequest(e.probeSession(), int(16*limit))), "gzip", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"headers filling the limit (64 of 16 KiB)", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(64, headerLimit/64-64), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"headers 8 KiB over the limit", "431", func(ctx context.Context) (string, bool) {
			// net/http reads 4 KiB past MaxHeaderBytes before it refuses: the
			// flood is 12 KiB over the setting, 8 KiB over what is read.
			return e.httpProbe(ctx, floodHeaders(76, headerLimit/64), paddedRequest(e.probeSession(), 0), "", http.StatusRequestHeaderFieldsTooLarge, "")
		}},
		{"2,000 headers", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(2000, 8), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"one header of the limit less 4 KiB", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(1, headerLimit-4<<10), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"one header of twice the limit", "431", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(1, 2*headerLimit), paddedRequest(e.probeSession(), 0), "", http.StatusRequestHeaderFieldsTooLarge, "")
		}},
		{"Session-Id of 257 bytes", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Session-Id": {strings.Repeat("s", 257)}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"Thread-Id with a tab", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Thread-Id": {"thread\t" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"Thread-Id with a control byte (refused by the HTTP server)", "400", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Thread-Id": {"thread\x01" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "")
		}},
		{"Session-Id of bytes that are not UTF-8", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Session-Id": {"\xff\xfe" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"WebSocket message at the limit", "response.completed", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)), false, 0)
		}},
		{"WebSocket message one byte over", "close 1009", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)+1), false, websocket.StatusMessageTooBig)
		}},
		{"WebSocket deflate bomb (inflates past the limit)", "close 1009", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)+1), true, websocket.StatusMessageTooBig)
		}},
		{"WebSocket handshake with twice the limit of headers", "431", func(ctx context.Context) (string, bool) {
			return e.wsHandshakeProbe(ctx, floodHeaders(1, 2*headerLimit), http.StatusRequestHeaderFieldsTooLarge)
		}},
		{"WebSocket handshake with a Session-Id of 257 bytes", "400", func(ctx context.Context) (string, bool) {
			return e.wsHandshakeProbe(ctx, http.Header{"Session-Id": {strings.Repeat("s", 257)}}, http.StatusBadRequest)
		}},
	}
}

func (e *hostileEnv) probeSession() string { return store.NewID("probe", time.Now()) }

// paddedRequest is a short Responses request padded with trailing JSON
// whitespace to exactly size bytes (when size is larger than it).
func paddedRequest(session string, size int) []byte {
	req := map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "probe [[sim:words 3]]"}}}}}
	if session != "" {
		req["prompt_cache_key"] = session
	}
	b, _ := json.Marshal(req)
	return padTo(b, size)
}

// paddedCreate is paddedRequest as a response.create message.
func paddedCreate(size int) []byte {
	b, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "probe [[sim:words 3]]"}}}}})
	return padTo(b, size)
}

func padTo(b []byte, size int) []byte {
	if size <= len(b) {
		return b
	}
	out := make([]byte, size)
	copy(out, b)
	for i := len(b); i < size; i++ {
		out[i] = ' '
	}
	return out
}

func zstdOf(b []byte) []byte {
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

func gzipOf(b []byte) []byte {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

// floodHeaders is n headers of size bytes each (name included).
func floodHeaders(n, size int) http.Header {
	h := http.Header{}
	for i := range n {
		name := "X-Flood-" + strconv.Itoa(i)
		h[name] = []string{strings.Repeat("f", max(size-len(name)-4, 1))}
	}
	return h
}

// httpProbe sends body with extra headers on a connection of its own (hand
// written, so hostile values go as they are) and checks the answer: status,
// and the JSON error's code, or for 200 a stream that completes.
func (e *hostileEnv) httpProbe(ctx context.Context, extra http.Header, body []byte, encoding string, status int, code string) (string, bool) {
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", e.addr)
	if err != nil {
		return err.Error(), false
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := e.target.header(0)
	if extra.Get("Session-Id") == "" && extra.Get("Thread-Id") == "" {
		h.Set("Session-Id", e.probeSession())
	}
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "text/event-stream")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Connection", "close")
	if encoding != "" {
		h.Set("Content-Encoding", encoding)
	}
	// Write while reading: a relay that refuses the headers answers before
	// taking the body.
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		_, _ = io.WriteString(w, requestHead(http.MethodPost, "/backend-api/codex/responses", e.addr, h)+"\r\n")
		_, _ = w.Write(body)
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if floodRefused(err, status) {
			return "the connection closed on the header flood (its 431 lost to the reset): " + err.Error(), true
		}
		return "no answer: " + err.Error(), false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	got := fmt.Sprintf("%d %s", resp.StatusCode, cmpOr(jsonErrorCode(b), clipText(string(b), 120)))
	if resp.StatusCode != status {
		return got, false
	}
	if status == http.StatusOK {
		if err != nil || !bytes.Contains(b, []byte("event: "+wire.EventResponseCompleted)) {
			return fmt.Sprintf("200 without response.completed (%v): %s", err, clipText(string(b), 200)), false
		}
		return "200 and response.completed", true
	}
	if code != "" && jsonErrorCode(b) != code {
		return got, false
	}
	return got, true
}

// wsProbe sends msg on a WebSocket of its own (compressed when deflate) and
// checks the answer: a completed response when want is 0, else the close
// code want.
func (e *hostileEnv) wsProbe(ctx context.Context, msg []byte, deflate bool, want websocket.StatusCode) (string, bool) {
	mode := websocket.CompressionDisabled
	if deflate {
		mode = websocket.CompressionNoContextTakeover
	}
	h := e.target.header(0)
	h.Set("Session-Id", e.probeSession())
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPHeader: h, CompressionMode: mode, CompressionThreshold: 1})
	if err != nil {
		if resp != nil {
			return fmt.Sprintf("dial: HTTP %d", resp.StatusCode), false
		}
		return "dial: " + err.Error(), false
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20)
	// Read while writing: a relay that refuses the message closes the
	// connection before taking all of it.
	type result struct {
		typ string
		err error
	}
	read := make(chan result, 1)
	go func() {
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				read <- result{err: err}
				return
			}
			typ, _ := wire.EventType(data)
			if wire.IsTerminal(typ) || typ == "error" {
				read <- result{typ: typ + " " + clipText(string(data), 200)}
				return
			}
		}
	}()
	werr := conn.Write(ctx, websocket.MessageText, msg)
	msg = nil
	r := <-read
	got := r.typ
	if r.err != nil {
		got = fmt.Sprintf("close %d (%v)", websocket.CloseStatus(r.err), r.err)
		if st := websocket.CloseStatus(r.err); st == -1 && werr != nil {
			got += fmt.Sprintf("; write: %v", werr)
		}
	}
	if want == 0 {
		return got, strings.HasPrefix(got, wire.EventResponseCompleted)
	}
	return got, websocket.CloseStatus(r.err) == want
}

// wsHandshakeProbe sends a WebSocket handshake with extra headers and
// checks its status.
func (e *hostileEnv) wsHandshakeProbe(ctx context.Context, extra http.Header, status int) (string, bool) {
	c := &hostileConn{e: e, session: e.probeSession()}
	conn, err := c.rawConn(ctx)
	if err != nil {
		return err.Error(), false
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := c.headers()
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Upgrade", "websocket")
	h.Set("Connection", "Upgrade")
	h.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	h.Set("Sec-WebSocket-Version", "13")
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		_, _ = io.WriteString(w, requestHead(http.MethodGet, "/backend-api/codex/responses", e.addr, h)+"\r\n")
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if floodRefused(err, status) {
			return "the connection closed on the header flood (its 431 lost to the reset): " + err.Error(), true
		}
		return "no answer: " + err.Error(), false
	}
	resp.Body.Close()
	return fmt.Sprintf("HTTP %d", resp.StatusCode), resp.StatusCode == status
}

// floodRefused reports a header flood refused without its answer read:
// the server answers 431 and closes while the flood is still coming, and
// when the client has not read the answer by then (a loaded machine), the
// reset discards it. Refused either way.
func floodRefused(err error, status int) bool {
	return status == http.StatusRequestHeaderFieldsTooLarge &&
		(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
}
