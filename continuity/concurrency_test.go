package continuity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many goroutines commit, resolve, touch, look up and sweep, each on its own
// thread and all on one shared thread, under small bounds so eviction runs
// too. Run with -race. Each own thread checks what it reads back; at the end
// the byte count matches the entries.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	const (
		workers = 16
		turns   = 150
	)
	clk := newFakeClock()
	c := New(Options{MaxEntries: workers, MaxBytes: 1 << 20, IdleTTL: time.Hour, Now: clk.Now})
	shared := Key{Thread: "shared", Scope: "s"}

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			own := Key{Thread: fmt.Sprintf("own-%d", w), Scope: "s"}
			var hist []json.RawMessage
			prev := ""
			buf := make([]byte, 0, 128) // reused across turns, as a reader's buffer would be
			for i := range turns {
				buf = fmt.Appendf(buf[:0], `{"type":"message","role":"user","content":"w%d t%d"}`, w, i)
				newItem := json.RawMessage(buf)
				out := funcCall(fmt.Sprintf("call_%d_%d", w, i), "{}")

				full, err := c.Resolve(own, prev, []json.RawMessage{newItem})
				switch {
				case prev == "":
				case errors.Is(err, ErrUnknownResponse):
					// evicted by the others: start over, as the relay would
					// with a full request
					hist = nil
					full = []json.RawMessage{newItem}
				case err != nil:
					errs <- err
					return
				default:
					if want := concat(hist, []json.RawMessage{newItem}); !assert.ObjectsAreEqual(strs(want), strs(full)) {
						errs <- fmt.Errorf("worker %d turn %d: resolved history differs", w, i)
						return
					}
				}
				if prev == "" {
					full = []json.RawMessage{newItem}
				}
				id := fmt.Sprintf("resp_%d_%d", w, i)
				c.Commit(own, Turn{ResponseID: id, Input: full, Output: []json.RawMessage{out}, AccountID: "acc", Organization: "org"})
				hist = concat(full, []json.RawMessage{out})
				hist[len(hist)-2] = bytes.Clone(hist[len(hist)-2]) // it may be buf
				prev = id

				// The shared thread: everyone branches from whatever is there.
				sharedPrev := ""
				if snap, ok := c.Lookup(shared); ok {
					sharedPrev = snap.LastResponseID
				}
				if sharedFull, err := c.Resolve(shared, sharedPrev, []json.RawMessage{newItem}); err == nil {
					c.Commit(shared, Turn{ResponseID: id, Input: sharedFull, Output: []json.RawMessage{out}, AccountID: fmt.Sprint(w)})
				} else {
					c.Commit(shared, Turn{ResponseID: id, Input: []json.RawMessage{newItem}, AccountID: fmt.Sprint(w)})
				}
				_, _ = c.OwnerOf(shared, id)
				c.Touch(own)
				if i%10 == 0 {
					c.Sweep()
					clk.Advance(time.Second)
					_, _ = c.Len()
				}
				if i%50 == 49 {
					c.Drop(shared)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	n, bytes := c.Len()
	assert.LessOrEqual(t, n, workers)
	assert.LessOrEqual(t, bytes, int64(1<<20))
	var sum int64
	var seen int
	for _, k := range append([]Key{shared}, ownKeys(workers)...) {
		if snap, ok := c.Lookup(k); ok {
			seen++
			sum += snap.HistoryBytes
		}
	}
	assert.Equal(t, n, seen)
	assert.Equal(t, sum, bytes)
}

func ownKeys(n int) []Key {
	out := make([]Key, n)
	for i := range out {
		out[i] = Key{Thread: fmt.Sprintf("own-%d", i), Scope: "s"}
	}
	return out
}
