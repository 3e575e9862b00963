package relay

import (
	"context"
	"sync"
	"time"
)

// keyUse counts the requests made with each client key (HTTP requests and
// WebSocket turns alike) and writes them in batches: one writer at a time,
// started by the first use it finds idle, writing whatever gathered while
// the previous write ran, and ending when nothing is left. A request never
// waits for the write; under load many requests share one. Safe for
// concurrent use.
type keyUse struct {
	mu      sync.Mutex
	pending map[string]int64 // guarded by mu
	writing bool             // guarded by mu: a writer goroutine runs
	closed  bool             // guarded by mu: Server.Close ran; no writer starts
	done    sync.WaitGroup   // the writer; Server.Close waits for it
}

// countKeyUse notes one request made with key id.
func (s *Server) countKeyUse(id string) {
	u := &s.keyUse
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pending == nil {
		u.pending = map[string]int64{}
	}
	u.pending[id]++
	if !u.writing && !u.closed {
		u.writing = true
		u.done.Add(1)
		go s.writeKeyUse()
	}
}

// writeKeyUse writes the pending counts until none are left.
func (s *Server) writeKeyUse() {
	u := &s.keyUse
	defer u.done.Done()
	for {
		u.mu.Lock()
		batch := u.pending
		u.pending = nil
		if len(batch) == 0 {
			u.writing = false
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.cfg.Store.AddClientKeyUse(ctx, batch, s.cfg.Now()); err != nil {
			s.log.Warn("record client key use", "keys", len(batch), "err", err)
		}
		cancel()
	}
}

// close lets the running writer finish and starts no other.
func (u *keyUse) close() {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	u.done.Wait()
}
