package relay

import (
	"context"
	"slices"
	"sync"
	"time"
)

// writeBehind gathers items and writes them in batches: a group commit.
// With inline, the first item that finds no write under way is written by
// its caller, at once (a lone request's log row is there by the time its
// client has the answer, as when each request wrote its own); without,
// by a writer goroutine started for it. Items that arrive while a write
// runs are queued, their callers go on, and the writer writes them, up to
// batch items in one go, until none are left. Under load a request waits
// for one write at most (inline) or none, and many share one write. Items the write hands back (the database did not take them)
// are tried again after a pause that doubles up to 5 s. At most max items
// wait; past that new ones are dropped and counted. Safe for concurrent
// use.
type writeBehind[T any] struct {
	batch, max int
	inline     bool
	// write writes a batch and returns the items to try again.
	write func(batch []T) (retry []T)
	// dropped is told of items given up (the queue was full, or the
	// database still refused them when the relay closed).
	dropped func(n int)

	mu       sync.Mutex
	pending  []T       // guarded by mu
	writing  bool      // guarded by mu: a write is under way
	closeBy  time.Time // guarded by mu: set by close: retries end then
	done     sync.WaitGroup
	closeNow chan struct{} // closed by close: a writer's pause ends
	// idle are closed when writing next ends with nothing pending (see
	// endWriting); guarded by mu. Nil unless someone waits for it.
	idle []chan struct{}
}

// endWriting notes that writing is over, and tells those waiting for it.
// Called with mu held.
func (w *writeBehind[T]) endWriting() {
	w.writing = false
	for _, c := range w.idle {
		close(c)
	}
	w.idle = nil
}

// add queues one item, and writes it when no write is under way.
func (w *writeBehind[T]) add(item T) {
	w.mu.Lock()
	if w.max > 0 && len(w.pending) >= w.max {
		w.mu.Unlock()
		w.dropped(1)
		return
	}
	w.pending = append(w.pending, item)
	if w.writing {
		w.mu.Unlock()
		return
	}
	w.writing = true
	if !w.closeBy.IsZero() {
		// Closed: no writer goroutine may start; the caller writes, and
		// gives up what the database refuses.
		for len(w.pending) > 0 {
			batch := w.pending
			w.pending = nil
			w.mu.Unlock()
			if retry := w.write(batch); len(retry) > 0 {
				w.dropped(len(retry))
			}
			w.mu.Lock()
		}
		w.endWriting()
		w.mu.Unlock()
		return
	}
	w.done.Add(1)
	w.mu.Unlock()
	if !w.inline {
		go w.run()
		return
	}
	if _, more := w.step(); more {
		go w.run()
		return
	}
	w.done.Done()
}

// step writes one batch of the pending items. more reports that items
// are left for the writer (retried: the batch came back among them);
// without any, writing is over.
func (w *writeBehind[T]) step() (retried, more bool) {
	w.mu.Lock()
	n := min(len(w.pending), w.batch)
	batch := slices.Clone(w.pending[:n])
	w.pending = slices.Delete(w.pending, 0, n)
	w.mu.Unlock()
	retry := w.write(batch)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = append(retry, w.pending...)
	if len(w.pending) == 0 {
		w.endWriting()
		return false, false
	}
	return len(retry) > 0, true
}

// run writes until nothing is left, or close's grace has passed.
func (w *writeBehind[T]) run() {
	defer w.done.Done()
	var pause time.Duration
	for {
		w.mu.Lock()
		if !w.closeBy.IsZero() && time.Now().After(w.closeBy) {
			n := len(w.pending)
			w.pending = nil
			w.endWriting()
			w.mu.Unlock()
			w.dropped(n)
			return
		}
		closing := w.closeNow
		w.mu.Unlock()
		retried, more := w.step()
		switch {
		case !more:
			return
		case !retried:
			pause = 0
			continue
		}
		pause = min(max(2*pause, 100*time.Millisecond), 5*time.Second)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-closing:
			t.Stop()
		}
	}
}

// close lets the running writer finish, retrying what the database
// refuses for at most grace, and waits for it; later items are written by
// the caller of add.
func (w *writeBehind[T]) close(grace time.Duration) {
	w.mu.Lock()
	if w.closeBy.IsZero() {
		w.closeBy = time.Now().Add(grace)
		if w.closeNow != nil {
			close(w.closeNow)
		}
	}
	w.mu.Unlock()
	w.done.Wait()
}

// keyUse counts the requests made with each client key, one for each of
// its request log rows (HTTP requests and WebSocket turns alike, see
// attempts), written in batches behind the requests (never by the request
// itself: it is counted before its answer): a batch's counts are summed
// into one write.
type keyUse = writeBehind[string]

// newKeyUse returns the counter that writes key use through s's store.
func (s *Server) newKeyUse() *keyUse {
	return &keyUse{batch: 4096, max: 1 << 20, closeNow: make(chan struct{}),
		write: func(ids []string) []string {
			counts := map[string]int64{}
			for _, id := range ids {
				counts[id]++
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.cfg.Store.AddClientKeyUse(ctx, counts, s.cfg.Now()); err != nil {
				// A count is not worth a retry that could count twice.
				s.log.Warn("record client key use", "keys", len(counts), "err", err)
			}
			return nil
		},
		dropped: func(n int) {},
	}
}

// countKeyUse notes one request made with key id.
func (s *Server) countKeyUse(id string) { s.keyUse.add(id) }

// written is what came of writing a batch item by item.
type written[T any] struct {
	wrote  int
	late   []T     // left unwritten when the write's deadline passed
	failed []T     // the database answered with an error
	errs   []error // failed's errors, in its order
}

// writeEach writes batch with write, item by item, under ctx.
func writeEach[T any](ctx context.Context, batch []T, write func(context.Context, T) error) written[T] {
	var w written[T]
	for _, it := range batch {
		if ctx.Err() != nil {
			w.late = append(w.late, it)
			continue
		}
		switch err := write(ctx, it); {
		case err == nil:
			w.wrote++
		case ctx.Err() != nil:
			// Slow, not refused: it may even have gone through; the writes
			// are made so that writing one again is harmless.
			w.late = append(w.late, it)
		default:
			w.failed, w.errs = append(w.failed, it), append(w.errs, err)
		}
	}
	return w
}

// lastErr is the last error the database answered with; the deadline's
// when it answered none.
func (w written[T]) lastErr() error {
	if len(w.errs) == 0 {
		return context.DeadlineExceeded
	}
	return w.errs[len(w.errs)-1]
}

// sort says which items to try again: those the deadline left unwritten
// (the database was slow: under load a whole batch may not fit in one
// deadline), and every failed one when none went through (the database is
// away). When some went through, the failed ones were refused for what
// they hold, and are to be dropped.
func (w written[T]) sort() (retry, refused []T) {
	retry = w.late
	if w.wrote > 0 {
		return retry, w.failed
	}
	return append(retry, w.failed...), nil
}
