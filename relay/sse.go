package relay

import (
	"cmp"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// clientWriteTimeout bounds one write to a client, on both transports: a
// client that stops reading is let go, and its attempt, account slot and
// lane with it.
const clientWriteTimeout = 15 * time.Second

// writeDeadlineSlack is how stale the write deadline may grow before it is
// pushed forward: a deadline is set at most once per slack, not per event,
// so a write may take up to clientWriteTimeout+slack.
const writeDeadlineSlack = time.Second

// sseClient answers an HTTP request: SSE events, or an HTTP error while
// nothing was sent. The status and headers are written once, at the first
// event or keep-alive (committed).
type sseClient struct {
	s         *Server
	r         *request // set once admitted
	w         http.ResponseWriter
	rc        *http.ResponseController // its write deadlines
	flusher   http.Flusher             // nil when w cannot flush
	sw        *wire.SSEWriter
	committed bool
	// deadline is the write deadline set last (zero: none yet).
	deadline     time.Time
	writeTimeout time.Duration
}

func (s *Server) newSSEClient(w http.ResponseWriter) *sseClient {
	f, _ := w.(http.Flusher) // resolved once: the per-event path does not unwrap w
	return &sseClient{s: s, w: w, rc: http.NewResponseController(w), flusher: f, sw: wire.NewSSEWriter(flushReporting(w)),
		writeTimeout: s.cfg.ClientWriteTimeout}
}

// flushReporting is w, flushed through the writer it wraps that reports a
// flush's error, when w itself does not: a front that wraps the response
// writer (echo's Response, in serve) flushes and drops the error, so a
// flush that timed out on a client that stopped reading would be lost, and
// the request's context, which the failed write cancels, would record the
// stall as a hang-up. Writes still go through w. Resolved once per
// request, by unwrapping (http.ResponseController's way).
func flushReporting(w http.ResponseWriter) http.ResponseWriter {
	if _, ok := w.(interface{ FlushError() error }); ok {
		return w
	}
	for inner := w; ; {
		u, ok := inner.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		inner = u.Unwrap()
		if f, ok := inner.(interface{ FlushError() error }); ok {
			return errorFlusher{ResponseWriter: w, flush: f}
		}
	}
}

// errorFlusher writes to its ResponseWriter and flushes through flush.
type errorFlusher struct {
	http.ResponseWriter
	flush interface{ FlushError() error }
}

func (w errorFlusher) FlushError() error { return w.flush.FlushError() }

func (w errorFlusher) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// done clears the write deadline: the connection may serve the client's
// next request, which must not inherit it.
func (c *sseClient) done() {
	if !c.deadline.IsZero() {
		_ = c.rc.SetWriteDeadline(time.Time{})
	}
}

// armDeadline keeps a write deadline ahead of the next write (on the
// wall clock: it is the socket's).
func (c *sseClient) armDeadline() {
	now := time.Now()
	if now.Add(c.writeTimeout - writeDeadlineSlack).Before(c.deadline) {
		return
	}
	c.deadline = now.Add(c.writeTimeout)
	_ = c.rc.SetWriteDeadline(c.deadline)
}

// lane is the thread's bridge lane, or the lane that produced the
// request's previous_response_id when the pool knows it (an exact alias,
// within the client's scope). Requests without a thread, and compact
// requests, use none.
func (c *sseClient) lane(r *request) (bridge.Key, bool) {
	if r.ident.Key == "" || r.sub != "" || c.s.cfg.DisableBridge {
		return bridge.Key{}, false
	}
	if p := r.fields.PreviousResponseID; p != "" {
		if k, ok := c.s.pool.Alias(p); ok && k.Scope == r.client.scope() {
			return k, true
		}
	}
	return r.threadLane(), true
}

func (c *sseClient) commit(h *head) {
	if c.committed {
		return
	}
	c.committed = true
	hdr := c.w.Header()
	h.setHeaders(hdr)
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	c.armDeadline()
	c.w.WriteHeader(http.StatusOK)
}

func (c *sseClient) send(h *head, typ string, data []byte) error {
	if typ == wire.EventRateLimits {
		return nil // the serving account's figures: the client has its own, in the headers
	}
	if !c.committed {
		h.decideTurnState(c.r, c)
		c.commit(h)
		if h.notice != "" {
			if err := c.event(wire.EventResponseMetadata, noticeEvent(h.notice)); err != nil {
				return err
			}
		}
	}
	c.s.metrics.eventsHTTP.Inc()
	return c.event(typ, data)
}

// event writes one event and flushes it, within the write deadline.
func (c *sseClient) event(name string, data []byte) error {
	c.armDeadline()
	if err := c.sw.WriteEvent(name, data); err != nil {
		return err
	}
	c.flush()
	return nil
}

func (c *sseClient) flush() {
	if c.flusher != nil {
		c.flusher.Flush()
	}
}

func (c *sseClient) fail(h *head, f *failure) error {
	if f.status == 0 && f.event != nil {
		// A response.failed the upstream streamed before any output: the
		// answer is that stream.
		typ, _ := wire.EventType(f.event)
		return c.send(h, typ, f.event)
	}
	if c.committed {
		// Keep-alives committed the stream: its terminal event says it.
		return c.event(wire.EventResponseFailed, failedEvent("", c.r.id, f.code(), f.err.Message))
	}
	hdr := c.w.Header()
	h.setHeaders(hdr)
	for k, vs := range f.header {
		hdr[k] = vs
	}
	if hdr.Get("Content-Type") == "" {
		hdr.Set("Content-Type", "application/json")
	}
	c.committed = true
	c.w.WriteHeader(cmp.Or(f.status, http.StatusBadGateway)) // an upstream event gave none
	_, err := c.w.Write(f.httpBody())
	return err
}

func (c *sseClient) reply(h *head, status int, body []byte) error {
	hdr := c.w.Header()
	h.setHeaders(hdr)
	hdr.Set("Content-Type", "application/json")
	c.committed = true
	c.w.WriteHeader(status)
	_, err := c.w.Write(body)
	return err
}

// waiting sends an SSE comment so the client's connection stays up while
// the relay waits (for lane capacity); it commits the answer.
func (c *sseClient) waiting(h *head) {
	c.commit(h)
	c.armDeadline()
	if _, err := c.w.Write([]byte(": keep-alive\n\n")); err == nil {
		c.flush()
	}
}

// issueTurnState: over HTTP, a turn's later requests echo the turn state of
// its first answer; each turn gets its own.
func (c *sseClient) issueTurnState() string { return newTurnState() }
