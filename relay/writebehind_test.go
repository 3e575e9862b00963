package relay

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// fakeWrites records the batches a writeBehind writes; it refuses the
// first refuse of them and blocks each while gate is held.
type fakeWrites struct {
	mu      sync.Mutex
	batches [][]int
	refuse  int
	dropped int
	gate    sync.RWMutex
}

func (f *fakeWrites) write(batch []int) []int {
	f.gate.RLock()
	defer f.gate.RUnlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse > 0 {
		f.refuse--
		return batch
	}
	f.batches = append(f.batches, slices.Clone(batch))
	return nil
}

func (f *fakeWrites) written() (items []int, batches int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.batches {
		items = append(items, b...)
	}
	return items, len(f.batches)
}

func newFakeWriter(f *fakeWrites, batch, max int) *writeBehind[int] {
	return &writeBehind[int]{batch: batch, max: max, inline: true, write: f.write, closeNow: make(chan struct{}),
		dropped: func(n int) { f.mu.Lock(); f.dropped += n; f.mu.Unlock() }}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// The first item is written by its caller; what gathers while that write
// runs goes in the next ones, up to the batch size each, in the order
// added, and its callers do not wait.
func TestWriteBehindBatches(t *testing.T) {
	f := &fakeWrites{}
	w := newFakeWriter(f, 100, 0)
	f.gate.Lock()
	first := make(chan struct{})
	go func() { defer close(first); w.add(0) }() // its caller writes it, and waits at the gate
	require.Eventually(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.writing && len(w.pending) == 0 }, time.Minute, time.Millisecond)
	for i := 1; i < 1000; i++ {
		w.add(i) // queued: returns at once
	}
	f.gate.Unlock()
	<-first
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.flush(ctx))
	items, batches := f.written()
	assert.Equal(t, seq(0, 1000), items)
	assert.LessOrEqual(t, batches, 11, "one write for the first, then batches of 100")
	w.add(1000)
	items, _ = f.written()
	assert.Contains(t, items, 1000, "a lone item is written by the time add returns")
	w.close(time.Second)
}

// A batch the database refuses is tried again, first in line, until it
// goes through.
func TestWriteBehindRetries(t *testing.T) {
	f := &fakeWrites{refuse: 2}
	w := newFakeWriter(f, 10, 0)
	for i := range 5 {
		w.add(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.flush(ctx))
	items, _ := f.written()
	assert.Equal(t, seq(0, 5), items)
	assert.Zero(t, f.dropped)
	w.close(time.Second)
}

// Past max waiting, new items are dropped and counted; closing gives up
// what the database still refuses when the grace ends; after close, add
// writes in the caller.
func TestWriteBehindBoundsAndClose(t *testing.T) {
	f := &fakeWrites{}
	w := newFakeWriter(f, 10, 3)
	f.gate.Lock()
	go w.add(0) // written by its caller, which waits at the gate
	require.Eventually(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.writing && len(w.pending) == 0 }, time.Minute, time.Millisecond)
	w.add(1)
	w.add(2)
	w.add(3)
	w.add(4) // the fourth waiting: dropped
	f.mu.Lock()
	assert.Equal(t, 1, f.dropped)
	f.refuse = 1 << 30 // from now on the database refuses everything
	f.mu.Unlock()
	f.gate.Unlock()

	closed := make(chan struct{})
	go func() { w.close(200 * time.Millisecond); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("close did not end while the writes were refused")
	}
	f.mu.Lock()
	assert.Equal(t, 1+4, f.dropped, "the four left (the one at the gate refused too) when the grace ended")
	f.refuse = 0
	f.mu.Unlock()

	w.add(5)
	items, _ := f.written()
	assert.Contains(t, items, 5, "written by add itself once closed")
	assert.NotContains(t, items, 4)
}

// The relay's request log: a batch with one row the database refuses for
// what it holds loses only that row; a database that takes nothing keeps
// them all for a retry.
func TestRequestLogRefusedRow(t *testing.T) {
	st := storetest.Open(t, storetest.PostgresURL(t), store.Options{})
	reg := prometheus.NewRegistry()
	s := New(Config{Store: st, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	row := func(id, thread string) store.LoggedRequest {
		return store.LoggedRequest{Request: store.RequestRecord{ID: id, ThreadID: thread, Transport: "ws", StartedAt: start}}
	}
	retry := s.writeRequestLog([]store.LoggedRequest{row("req_a", "t-refused"), row("req_nul", "t\x00"), row("req_b", "t-refused")})
	assert.Empty(t, retry, "the refused row is dropped, not retried")
	_, n, err := st.Requests(context.Background(), store.RequestFilter{ThreadID: "t-refused"})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the other rows are written")
	var m dto.Metric
	require.NoError(t, s.metrics.logDropped.Write(&m))
	assert.Equal(t, 1.0, m.GetCounter().GetValue())

	st.Close()
	retry = s.writeRequestLog([]store.LoggedRequest{row("req_c", "t-later"), row("req_d", "t-later")})
	assert.Len(t, retry, 2, "a database that takes nothing: every row kept")
}

// Without inline, even a lone item is written by the writer goroutine:
// add never waits for the database (the key-use counter, on the way in).
func TestWriteBehindNotInline(t *testing.T) {
	f := &fakeWrites{}
	w := newFakeWriter(f, 10, 0)
	w.inline = false
	f.gate.Lock()
	added := make(chan struct{})
	go func() { defer close(added); w.add(1) }()
	select {
	case <-added:
	case <-time.After(time.Minute):
		t.Fatal("add waited for the write")
	}
	f.gate.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.flush(ctx))
	items, _ := f.written()
	assert.Equal(t, []int{1}, items)
	w.close(time.Second)
}

// A batch of usage reports is folded into one per account, each window as
// last reported, accounts in the order they first reported.
func TestLatestUsage(t *testing.T) {
	w := func(pct float64) store.Window { return store.Window{UsedPercent: pct, WindowMinutes: 300, Known: true} }
	none := store.Window{}
	for _, tc := range []struct {
		name  string
		batch []usageReport
		want  []usageReport
	}{
		{"empty", nil, nil},
		{"one", []usageReport{{"a", w(1), none}}, []usageReport{{"a", w(1), none}}},
		{"the latest wins", []usageReport{{"a", w(1), w(10)}, {"a", w(2), w(20)}}, []usageReport{{"a", w(2), w(20)}}},
		{"an unreported window keeps the last reported", []usageReport{{"a", w(1), w(10)}, {"a", w(2), none}, {"a", none, none}},
			[]usageReport{{"a", w(2), w(10)}}},
		{"accounts apart, in first-report order", []usageReport{{"b", w(5), none}, {"a", w(1), none}, {"b", w(6), none}},
			[]usageReport{{"b", w(6), none}, {"a", w(1), none}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, latestUsage(tc.batch))
		})
	}
}

// Usage windows an answer reports are written behind it: folding them
// never waits for the database (here SQLite's write lock, held by another
// connection, which would hold a write for its 10 s busy timeout), and
// they reach the account once the database takes writes again.
func TestUsageIsWrittenBehind(t *testing.T) {
	url := storetest.SQLiteURL(t)
	st := storetest.Open(t, url, store.Options{})
	ctx := context.Background()
	a, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "w"}, store.Credentials{AccessToken: "t"})
	require.NoError(t, err)
	s := New(Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close()

	locker, err := sql.Open("sqlite", strings.TrimPrefix(url, "sqlite:"))
	require.NoError(t, err)
	defer locker.Close()
	conn, err := locker.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)

	folded := make(chan struct{})
	go func() {
		defer close(folded)
		s.foldLimits(a.ID, wire.RateLimits{Primary: &wire.RateLimitWindow{UsedPercent: 61, WindowMinutes: 300}})
	}()
	select {
	case <-folded:
	case <-time.After(time.Minute):
		t.Fatal("folding usage waited for the database")
	}
	_, err = conn.ExecContext(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := st.Account(ctx, a.ID)
		return err == nil && got.Primary.Known && got.Primary.UsedPercent == 61
	}, time.Minute, 10*time.Millisecond, "the windows were written once the lock was gone")
}

// A batch written item by item sorts its items: those the write's deadline
// left unwritten are tried again (the database was slow, not refusing:
// under load a batch of bindings or log rows may not fit in one deadline,
// and dropping them lost bindings in a soak); failed ones are dropped as
// refused for what they hold when others went through, and tried again
// when none did (the database is away).
func TestWriteEachSortsWhatToTryAgain(t *testing.T) {
	refusal := errors.New("violates foreign key constraint")
	away := errors.New("connection refused")
	for _, tc := range []struct {
		name          string
		outcome       []string // per item: ok, refused, away, slow (the deadline passes during it)
		retry, refuse []int
	}{
		{"all written", []string{"ok", "ok", "ok"}, nil, nil},
		{"the deadline passes midway", []string{"ok", "slow", "ok", "ok"}, []int{1, 2, 3}, nil},
		{"the deadline passes at once", []string{"slow", "ok"}, []int{0, 1}, nil},
		{"one refused among writes", []string{"ok", "refused", "ok"}, nil, []int{1}},
		{"refused, then the deadline passes", []string{"ok", "refused", "slow", "ok"}, []int{2, 3}, []int{1}},
		{"nothing goes through: the database is away", []string{"away", "away", "away"}, []int{0, 1, 2}, nil},
		{"away, then the deadline passes", []string{"away", "slow", "ok"}, []int{1, 2, 0}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			items := make([]int, len(tc.outcome))
			for i := range items {
				items[i] = i
			}
			w := writeEach(ctx, items, func(ctx context.Context, i int) error {
				switch tc.outcome[i] {
				case "refused":
					return refusal
				case "away":
					return away
				case "slow":
					cancel()
					return ctx.Err()
				}
				return nil
			})
			retry, refused := w.sort()
			assert.Equal(t, tc.retry, retry, "tried again")
			assert.Equal(t, tc.refuse, refused, "dropped as refused")
			if len(refused) > 0 {
				assert.Equal(t, []error{refusal}, w.errs)
			}
		})
	}
}

// flush waits until every item queued so far is written (or dropped), or
// ctx ends: until a write under way ends with nothing left pending.
func (w *writeBehind[T]) flush(ctx context.Context) error {
	for {
		w.mu.Lock()
		if !w.writing && len(w.pending) == 0 {
			w.mu.Unlock()
			return nil
		}
		idle := make(chan struct{})
		w.idle = append(w.idle, idle)
		w.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
