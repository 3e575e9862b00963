package relay

import (
	"net/http"

	"github.com/codexrelay/codex-relay/relay/wire"
)

// sseOut is a client's SSE answer across the attempts of one request: the
// status and headers are written once, at the first event or keep-alive.
type sseOut struct {
	w         http.ResponseWriter
	sw        *wire.SSEWriter
	flusher   http.Flusher
	committed bool
}

func newSSEOut(w http.ResponseWriter) *sseOut {
	f, _ := w.(http.Flusher)
	return &sseOut{w: w, sw: wire.NewSSEWriter(w), flusher: f}
}

// commit writes 200 and the event-stream headers, after set has added the
// answer's own (turn state, rate limits, recovery).
func (o *sseOut) commit(set func(h http.Header)) {
	if o.committed {
		return
	}
	o.committed = true
	h := o.w.Header()
	if set != nil {
		set(h)
	}
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
}

// event writes one event and flushes it.
func (o *sseOut) event(name string, data []byte) error {
	if err := o.sw.WriteEvent(name, data); err != nil {
		return err
	}
	if o.flusher != nil {
		o.flusher.Flush()
	}
	return nil
}

// keepAlive sends an SSE comment so the client's connection stays up while
// the relay waits (for lane capacity); it commits the answer.
func (o *sseOut) keepAlive(set func(h http.Header)) {
	o.commit(set)
	_, _ = o.w.Write([]byte(": keep-alive\n\n"))
	if o.flusher != nil {
		o.flusher.Flush()
	}
}
