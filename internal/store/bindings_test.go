package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func eachWithClock(t *testing.T, f func(t *testing.T, s *store.Store, c *clock)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
			f(t, storetest.Open(t, b.URL(t), store.Options{Now: c.Now}), c)
		})
	}
}

func byKind(bs []store.Binding) map[store.BindingKind]store.Binding {
	m := map[store.BindingKind]store.Binding{}
	for _, b := range bs {
		m[b.Kind] = b
	}
	return m
}

func TestPlaceSeedsSessionOnceAndMovesOnlyTheThread(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		root := store.Placement{ClientScope: "key_1", ThreadKey: "v1:st:root", SessionKey: "v1:s:sess", SessionID: "sess", ThreadID: "root",
			AccountID: "acc_a", Source: "admission", TTL: time.Hour, SeedSession: true}
		require.NoError(t, s.Place(ctx, root))
		got, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:st:root", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		m := byKind(got)
		require.Len(t, got, 2)
		assert.Equal(t, "acc_a", m[store.BindThread].AccountID)
		assert.Equal(t, "acc_a", m[store.BindSession].AccountID)
		assert.Equal(t, store.Soft, m[store.BindThread].Strength)
		assert.Equal(t, "root", m[store.BindThread].ThreadID)

		// A sibling admitted elsewhere (say its preference was not eligible)
		// does not rewrite the existing process preference.
		child := root
		child.ThreadKey, child.ThreadID, child.AccountID = "v1:st:child", "child", "acc_b"
		require.NoError(t, s.Place(ctx, child))
		got, err = s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:st:child", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		m = byKind(got)
		assert.Equal(t, "acc_b", m[store.BindThread].AccountID)
		assert.Equal(t, "acc_a", m[store.BindSession].AccountID, "insert-if-absent: the process preference stays")

		// Moving the root rewrites only its own row.
		move := root
		move.AccountID, move.Source, move.SeedSession = "acc_c", "move", false
		require.NoError(t, s.Place(ctx, move))
		got, err = s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:st:root", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		m = byKind(got)
		assert.Equal(t, "acc_c", m[store.BindThread].AccountID)
		assert.Equal(t, "move", m[store.BindThread].Source)
		assert.Equal(t, "acc_a", m[store.BindSession].AccountID)
		sib, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:st:child"})
		require.NoError(t, err)
		assert.Equal(t, "acc_b", sib[0].AccountID, "a sibling's row is untouched")

		// Another client scope sees none of it.
		none, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_2", ThreadKey: "v1:st:root", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		assert.Empty(t, none)

		// Soft rows expire after the TTL without activity; touching keeps them.
		c.Add(50 * time.Minute)
		require.NoError(t, s.TouchBindings(ctx, []string{m[store.BindThread].ID}, time.Hour))
		c.Add(20 * time.Minute)
		got, err = s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:st:root", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		m = byKind(got)
		assert.Contains(t, m, store.BindThread, "the touched thread row lives on")
		assert.NotContains(t, m, store.BindSession, "the untouched session row expired")

		// An expired process preference is replaced by the next seeding.
		fresh := root
		fresh.ThreadKey, fresh.ThreadID, fresh.AccountID = "v1:st:third", "third", "acc_d"
		require.NoError(t, s.Place(ctx, fresh))
		got, err = s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", SessionKey: "v1:s:sess"})
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, "acc_d", got[0].AccountID)

		n, err := s.DeleteExpiredBindings(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "the child's row expired")
	})
}

// A placement written late (retried after the database refused it)
// carries when it was decided: it lands on a row nobody wrote since, and
// never undoes a placement or a touch that came after it. One written now
// (At zero) takes whatever the row holds, as before.
func TestLatePlacementNeverUndoesALaterOne(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		thread := func() store.Binding {
			got, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "k", ThreadKey: "v1:st:t"})
			require.NoError(t, err)
			require.Len(t, got, 1)
			return got[0]
		}
		p := store.Placement{ClientScope: "k", ThreadKey: "v1:st:t", ThreadID: "t", AccountID: "acc_a", Source: "admission", TTL: time.Hour}
		require.NoError(t, s.Place(ctx, p))

		late := p
		late.AccountID, late.Source, late.At = "acc_b", "move", c.Now().Add(-time.Minute)
		require.NoError(t, s.Place(ctx, late))
		assert.Equal(t, "acc_a", thread().AccountID, "decided before the row was written: left as it is")

		c.Add(time.Minute)
		late.At = c.Now().Add(-time.Second)
		require.NoError(t, s.Place(ctx, late))
		assert.Equal(t, "acc_b", thread().AccountID, "decided after the row was written: it lands")
		assert.Equal(t, late.At.UnixMilli(), thread().LastSeenAt.UnixMilli(), "as of its decision")

		c.Add(time.Minute)
		require.NoError(t, s.TouchBindings(ctx, []string{thread().ID}, time.Hour))
		older := late
		older.AccountID, older.At = "acc_c", c.Now().Add(-30*time.Second)
		require.NoError(t, s.Place(ctx, older))
		assert.Equal(t, "acc_b", thread().AccountID, "a touch after it counts as a later write")

		now := older
		now.At = time.Time{}
		require.NoError(t, s.Place(ctx, now))
		assert.Equal(t, "acc_c", thread().AccountID, "a placement written now takes the row")
	})
}

// Siblings admitted at the same moment on different accounts agree on one
// process preference, and each keeps its own thread row.
func TestConcurrentFirstAdmissions(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Place(ctx, store.Placement{ThreadKey: fmt.Sprintf("v1:st:t%d", i), SessionKey: "v1:s:tree",
					SessionID: "tree", ThreadID: fmt.Sprintf("t%d", i), AccountID: fmt.Sprintf("acc_%d", i), TTL: time.Hour, SeedSession: true})
			}()
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		rows, total, err := s.Bindings(ctx, store.BindingFilter{SessionID: "tree"})
		require.NoError(t, err)
		assert.Equal(t, n+1, total)
		sessions := 0
		for _, b := range rows {
			if b.Kind == store.BindSession {
				sessions++
			}
		}
		assert.Equal(t, 1, sessions, "one process preference")
	})
}

func TestPinsResetsAndListing(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		pin, err := s.Pin(ctx, store.BindRawSession, "sess-1", "acc_a", "pin")
		require.NoError(t, err)
		assert.Equal(t, store.Hard, pin.Strength)
		assert.True(t, pin.ExpiresAt.IsZero(), "pins do not expire")
		again, err := s.Pin(ctx, store.BindRawSession, "sess-1", "acc_b", "pin")
		require.NoError(t, err)
		assert.Equal(t, pin.ID, again.ID, "re-pinning replaces the pin")
		assert.Equal(t, "acc_b", again.AccountID)
		_, err = s.Pin(ctx, store.BindThread, "x", "acc_a", "pin")
		assert.Error(t, err, "only raw keys are pinned")
		tpin, err := s.Pin(ctx, store.BindRawThread, "thread-9", "acc_c", "pin")
		require.NoError(t, err)

		found, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "any-scope", RawSession: "sess-1", RawThread: "thread-9"})
		require.NoError(t, err)
		assert.Len(t, found, 2, "pins apply whatever the client scope")

		c.Add(365 * 24 * time.Hour)
		found, err = s.BindingsFor(ctx, store.BindingLookup{RawSession: "sess-1"})
		require.NoError(t, err)
		assert.Len(t, found, 1, "a pin is still there a year later")

		for i := range 5 {
			require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: fmt.Sprintf("k%d", i), SessionID: "sess-2",
				ThreadID: fmt.Sprintf("th%d", i), AccountID: "acc_a", TTL: time.Hour}))
			c.Add(time.Second)
		}
		page, total, err := s.Bindings(ctx, store.BindingFilter{AccountID: "acc_a", Limit: 2, Offset: 1})
		require.NoError(t, err)
		assert.Equal(t, 5, total)
		require.Len(t, page, 2)
		assert.Equal(t, "th3", page[0].ThreadID, "most recently seen first")

		got, err := s.Binding(ctx, tpin.ID)
		require.NoError(t, err)
		assert.Equal(t, "thread-9", got.ThreadID)
		_, err = s.Binding(ctx, "bnd_missing")
		assert.ErrorIs(t, err, store.ErrNotFound)

		reset, err := s.ResetBindings(ctx, store.BindingReset{ThreadID: "th0"})
		require.NoError(t, err)
		assert.Len(t, reset, 1)
		reset, err = s.ResetBindings(ctx, store.BindingReset{AccountID: "acc_a"})
		require.NoError(t, err)
		assert.Len(t, reset, 4)
		reset, err = s.ResetBindings(ctx, store.BindingReset{BindingID: tpin.ID})
		require.NoError(t, err)
		assert.Len(t, reset, 1)
		reset, err = s.ResetBindings(ctx, store.BindingReset{SessionID: "sess-1"})
		require.NoError(t, err)
		assert.Len(t, reset, 1)
		_, err = s.ResetBindings(ctx, store.BindingReset{})
		assert.Error(t, err)
		_, err = s.ResetBindings(ctx, store.BindingReset{ThreadID: "a", SessionID: "b"})
		assert.Error(t, err)
		_, total, err = s.Bindings(ctx, store.BindingFilter{IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, total)
	})
}

func TestDeleteAccountDropsItsBindings(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a"}, store.Credentials{APIKey: "k"})
		require.NoError(t, err)
		require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "k1", ThreadID: "t1", AccountID: a.ID, TTL: time.Hour}))
		_, err = s.Pin(ctx, store.BindRawSession, "s1", a.ID, "pin")
		require.NoError(t, err)
		require.NoError(t, s.DeleteAccount(ctx, a.ID))
		_, total, err := s.Bindings(ctx, store.BindingFilter{AccountID: a.ID, IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, total)
	})
}

// Lookups made while a read of bindings is under way share the next read,
// and each gets exactly what a read of its own gives: its thread and
// session rows in its own client scope only, the pins of its raw ids in
// any, nothing expired.
func TestLookupsMadeTogetherShareOneRead(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, c *clock) {
		ctx := context.Background()
		place := func(scope, thread, session, acct string, ttl time.Duration) {
			t.Helper()
			require.NoError(t, s.Place(ctx, store.Placement{ClientScope: scope, ThreadKey: thread, SessionKey: session,
				SessionID: "raw-" + session, ThreadID: "raw-" + thread, AccountID: acct, Source: "admission", TTL: ttl, SeedSession: session != ""}))
		}
		for i := range 6 {
			place("key_1", fmt.Sprint("v1:thread:t", i), fmt.Sprint("v1:s:s", i%2), fmt.Sprint("acc_", i), time.Hour)
		}
		place("key_2", "v1:thread:t0", "v1:s:s0", "acc_other", time.Hour) // the same keys in another scope
		place("key_1", "v1:thread:old", "", "acc_old", time.Minute)
		_, err := s.Pin(ctx, store.BindRawSession, "pinned-session", "acc_pin", "operator")
		require.NoError(t, err)
		_, err = s.Pin(ctx, store.BindRawThread, "pinned-thread", "acc_pint", "operator")
		require.NoError(t, err)
		c.Add(2 * time.Minute) // v1:thread:old expires

		lookups := []store.BindingLookup{
			{ClientScope: "key_1", ThreadKey: "v1:thread:t0", SessionKey: "v1:s:s0"},
			{ClientScope: "key_2", ThreadKey: "v1:thread:t0", SessionKey: "v1:s:s0"},
			{ClientScope: "key_1", ThreadKey: "v1:thread:t1", SessionKey: "v1:s:s1", RawSession: "pinned-session"},
			{ClientScope: "key_1", ThreadKey: "v1:thread:old"},
			{ClientScope: "key_1", ThreadKey: "v1:thread:t5", RawThread: "pinned-thread"},
			{ClientScope: "key_3", ThreadKey: "v1:thread:t2"},
			{ClientScope: "key_1", ThreadKey: "v1:thread:new", SessionKey: "v1:s:s0"},
			{RawThread: "pinned-thread"},
			{ClientScope: "key_1", ThreadKey: "v1:thread:t0", SessionKey: "v1:s:s0"},
		}
		want := []map[store.BindingKind]string{
			{store.BindThread: "acc_0", store.BindSession: "acc_0"},
			{store.BindThread: "acc_other", store.BindSession: "acc_other"},
			{store.BindThread: "acc_1", store.BindSession: "acc_1", store.BindRawSession: "acc_pin"},
			{},
			{store.BindThread: "acc_5", store.BindRawThread: "acc_pint"},
			{},
			{store.BindSession: "acc_0"},
			{store.BindRawThread: "acc_pint"},
			{store.BindThread: "acc_0", store.BindSession: "acc_0"},
		}
		accounts := func(bs []store.Binding) map[store.BindingKind]string {
			m := map[store.BindingKind]string{}
			for _, b := range bs {
				m[b.Kind] = b.AccountID
			}
			return m
		}
		alone := make([][]store.Binding, len(lookups))
		for i, l := range lookups {
			alone[i], err = s.BindingsFor(ctx, l)
			require.NoError(t, err)
		}

		gate := store.GateBatches(s)
		lead := make(chan error, 1)
		go func() {
			_, err := s.BindingsFor(ctx, store.BindingLookup{ClientScope: "key_1", ThreadKey: "v1:thread:t3"})
			lead <- err
		}()
		require.Eventually(t, func() bool { return len(gate.Sizes()) == 1 }, time.Minute, time.Millisecond)
		together := make([][]store.Binding, len(lookups))
		var wg sync.WaitGroup
		for i, l := range lookups {
			wg.Go(func() {
				var err error
				together[i], err = s.BindingsFor(ctx, l)
				assert.NoError(t, err)
			})
		}
		require.Eventually(t, func() bool { return gate.Queued() == len(lookups) }, time.Minute, time.Millisecond)
		gate.Open()
		wg.Wait()
		require.NoError(t, <-lead)
		assert.Equal(t, []int{1, len(lookups)}, gate.Sizes(), "one read for the first, one for all that came meanwhile")
		for i := range lookups {
			assert.Equal(t, want[i], accounts(together[i]), "lookup %d", i)
			assert.ElementsMatch(t, alone[i], together[i], "lookup %d: read together as alone", i)
			assert.Len(t, together[i], len(want[i]), "lookup %d: each row once", i)
		}
	})
}
