package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// Replicas register by heartbeat, are listed while it is fresh, and are
// deleted once it stopped; a stopping replica removes itself.
func TestReplicaHeartbeats(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		start := clk.Now()
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "r1", Name: "host:1", StartedAt: start}))
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "r2", Name: "host:2", StartedAt: start.Add(time.Second), Lanes: json.RawMessage(`[{"kind":"bridge"}]`)}))
		list, err := s.Replicas(ctx, clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		require.Len(t, list, 2)
		assert.Equal(t, "r1", list[0].ID)
		assert.JSONEq(t, `[]`, string(list[0].Lanes))
		assert.JSONEq(t, `[{"kind":"bridge"}]`, string(list[1].Lanes))
		assert.True(t, list[1].StartedAt.Equal(start.Add(time.Second)))

		clk.Add(20 * time.Second)
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "r2", Name: "host:2", StartedAt: start.Add(time.Second), Lanes: json.RawMessage(`[]`)}))
		list, err = s.Replicas(ctx, clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		require.Len(t, list, 1, "r1 stopped beating")
		assert.Equal(t, "r2", list[0].ID)
		assert.True(t, list[0].HeartbeatAt.Equal(clk.Now()))
		assert.True(t, list[0].StartedAt.Equal(start.Add(time.Second)), "a heartbeat keeps the start time")

		deps, err := s.ReplicaDepartures(ctx)
		require.NoError(t, err)
		require.Len(t, deps, 1, "r1's lapse is recorded as it is deleted")
		assert.Equal(t, "r1", deps[0].ID)
		assert.Equal(t, "host:1", deps[0].Name)
		assert.True(t, deps[0].HeartbeatAt.Equal(start), "its last heartbeat")
		assert.True(t, deps[0].DepartedAt.Equal(clk.Now()))

		require.NoError(t, s.RemoveReplica(ctx, "r2"))
		list, err = s.Replicas(ctx, time.Time{})
		require.NoError(t, err)
		assert.Empty(t, list)
		deps, err = s.ReplicaDepartures(ctx)
		require.NoError(t, err)
		assert.Len(t, deps, 1, "a clean stop is no departure")

		clk.Add(25 * time.Hour)
		_, err = s.Replicas(ctx, clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		deps, err = s.ReplicaDepartures(ctx)
		require.NoError(t, err)
		assert.Empty(t, deps, "kept a day")
	})
}

// On PostgreSQL, an announcement reaches every listening replica, an
// account written by one replica is seen by another at once (not after the
// listing's second: the clock here never moves), and a forget too large for
// one NOTIFY arrives whole in parts.
func TestAnnouncementsReachOtherReplicas(t *testing.T) {
	url := storetest.PostgresURL(t)
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	one := storetest.Open(t, url, store.Options{Now: clk.Now})
	other := storetest.Open(t, url, store.Options{Now: clk.Now})
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu  sync.Mutex
		got []store.Announcement
	)
	done := make(chan error, 1)
	go func() {
		done <- other.Listen(ctx, slog.New(slog.DiscardHandler), func(a store.Announcement) {
			mu.Lock()
			got = append(got, a)
			mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("Listen did not end with its context")
		}
	})
	received := func(kind string) []store.Announcement {
		mu.Lock()
		defer mu.Unlock()
		var out []store.Announcement
		for _, a := range got {
			if a.Kind == kind {
				out = append(out, a)
			}
		}
		return out
	}

	// The listener subscribes in the background: say hello until it hears.
	require.Eventually(t, func() bool {
		require.NoError(t, one.Announce(ctx, store.Announcement{From: "r1", Kind: "hello"}))
		time.Sleep(20 * time.Millisecond)
		return len(received("hello")) > 0
	}, time.Minute, 10*time.Millisecond, "the listener is up")

	a, err := one.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(received(store.AnnounceAccounts)) > 0 }, time.Minute, 10*time.Millisecond,
		"account writes are announced")
	list, err := other.Accounts(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	_, err = one.SetAccountStatus(ctx, a.ID, store.StatusPaused, "", time.Time{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, err := other.Accounts(ctx)
		return err == nil && len(list) == 1 && list[0].Status == store.StatusPaused
	}, time.Minute, 10*time.Millisecond, "the other replica's listing was dropped by the announcement")

	// A key revoked through one replica stops at once on the other: its
	// cached read is dropped by the announcement, not left to expire.
	k, secret, err := one.CreateClientKey(ctx, store.ClientKey{Name: "shared"})
	require.NoError(t, err)
	got2, err := other.CurrentClientKey(ctx, k.ID)
	require.NoError(t, err)
	require.True(t, got2.Usable(time.Now()), "read, and cached, on the other replica")
	_, err = other.AuthenticateClientKey(ctx, secret)
	require.NoError(t, err, "found by its secret, and cached, on the other replica")
	_, err = one.RevokeClientKey(ctx, k.ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		k2, err := other.CurrentClientKey(ctx, k.ID)
		return err == nil && !k2.Usable(time.Now())
	}, time.Minute, 10*time.Millisecond, "the revocation reached the other replica's cache")
	// Its secret too (the check above may have been satisfied by the late
	// announcement of the key's creation, before the revocation's came).
	require.Eventually(t, func() bool {
		_, err := other.AuthenticateClientKey(ctx, secret)
		return errors.Is(err, store.ErrKeyRejected)
	}, time.Minute, 10*time.Millisecond, "the revocation reached the key found by its secret")

	var threads []store.ThreadRef
	for i := range 300 {
		threads = append(threads, store.ThreadRef{Key: fmt.Sprintf("v1:thread:%s%03d", strings.Repeat("x", 40), i), Scope: "key_1"})
	}
	require.NoError(t, one.Announce(ctx, store.Announcement{From: "r1", Kind: store.AnnounceForget, Threads: threads}))
	require.Eventually(t, func() bool {
		n := 0
		for _, a := range received(store.AnnounceForget) {
			n += len(a.Threads)
		}
		return n == len(threads)
	}, time.Minute, 10*time.Millisecond)
	parts := received(store.AnnounceForget)
	assert.Greater(t, len(parts), 1, "split under the payload limit")
	for _, p := range parts {
		assert.Equal(t, "r1", p.From)
	}
}

// On SQLite (one process) announcing does nothing and listening only waits.
func TestAnnouncementsOnSQLite(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.NoError(t, s.Announce(ctx, store.Announcement{Kind: store.AnnounceForget}))
	called := false
	require.NoError(t, s.Listen(ctx, slog.New(slog.DiscardHandler), func(store.Announcement) { called = true }))
	assert.False(t, called)
}

// replicaClock gives a lease test its replicas' heartbeats on s, each
// replica at http://<id>, and the liveness bound LeaseLane is given: a
// replica is live while it beat in the last 15 seconds of clk.
func replicaClock(t *testing.T, s *store.Store, clk *clock) (beat func(id string), live func() time.Time) {
	beat = func(id string) {
		t.Helper()
		require.NoError(t, s.Heartbeat(context.Background(), store.Replica{ID: id, Name: id, Address: "http://" + id, StartedAt: clk.Now()}))
	}
	live = func() time.Time { return clk.Now().Add(-15 * time.Second) }
	return beat, live
}

// A thread's lease stays with a live holder (others are told where to
// forward), is renewed by its holder, and is taken over with the next epoch
// once the holder's heartbeat stopped or its row is gone.
func TestLaneLeases(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		beat, live := replicaClock(t, s, clk)
		beat("r1")
		beat("r2")

		l, err := s.LeaseLane(ctx, "v1:thread:t", "key_1", "r1", live())
		require.NoError(t, err)
		assert.Equal(t, store.LaneLease{ThreadKey: "v1:thread:t", ClientScope: "key_1", ReplicaID: "r1", Address: "http://r1", Epoch: 1}, l)
		l, err = s.LeaseLane(ctx, "v1:thread:t", "key_1", "r2", live())
		require.NoError(t, err)
		assert.Equal(t, "r1", l.ReplicaID, "a live holder keeps its thread")
		assert.Equal(t, "http://r1", l.Address, "where r2 forwards to")
		other, err := s.LeaseLane(ctx, "v1:thread:t", "key_2", "r2", live())
		require.NoError(t, err)
		assert.Equal(t, "r2", other.ReplicaID, "another client scope is another lease")

		clk.Add(10 * time.Second)
		l, err = s.LeaseLane(ctx, "v1:thread:t", "key_1", "r1", live())
		require.NoError(t, err)
		assert.Equal(t, int64(1), l.Epoch, "a renewal keeps the epoch")

		clk.Add(20 * time.Second) // r1 stopped beating
		beat("r2")
		l, err = s.LeaseLane(ctx, "v1:thread:t", "key_1", "r2", live())
		require.NoError(t, err)
		assert.Equal(t, "r2", l.ReplicaID, "a dead holder's lease is taken over")
		assert.Equal(t, int64(2), l.Epoch)

		require.NoError(t, s.RemoveReplica(ctx, "r2"))
		beat("r3")
		l, err = s.LeaseLane(ctx, "v1:thread:t", "key_1", "r3", live())
		require.NoError(t, err)
		assert.Equal(t, "r3", l.ReplicaID, "so is a vanished holder's")
		assert.Equal(t, int64(3), l.Epoch)

		clk.Add(time.Minute)
		n, err := s.DeleteStaleLeases(ctx, clk.Now().Add(-30*time.Second))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
	})
}

// Leases taken while a lease write is under way share the next write, and
// each comes out as it would alone: a new thread's at epoch 1, a live
// holder's left to it (with its address to forward to), a dead holder's
// taken over, this replica's own renewed; a thread asked for twice in one
// batch is written once, and another replica's asks are its own.
func TestLeasesTakenTogetherShareOneWrite(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		beat, live := replicaClock(t, s, clk)
		lease := func(thread, scope, me string) store.LaneLease {
			t.Helper()
			l, err := s.LeaseLane(ctx, thread, scope, me, live())
			require.NoError(t, err)
			return l
		}
		beat("r1")
		beat("r2")
		beat("gone")
		lease("v1:thread:live", "key_1", "r2")
		lease("v1:thread:dead", "key_1", "gone")
		lease("v1:thread:mine", "key_1", "r1")
		clk.Add(20 * time.Second) // "gone" stops beating
		beat("r1")
		beat("r2")

		gate := store.GateBatches(s)
		lead := make(chan store.LaneLease, 1)
		go func() { lead <- lease("v1:thread:first", "key_1", "r1") }()
		require.Eventually(t, func() bool { return len(gate.Sizes()) == 1 }, time.Minute, time.Millisecond)
		type ask struct{ thread, scope, me string }
		asks := []ask{
			{"v1:thread:new", "key_1", "r1"},
			{"v1:thread:new", "key_1", "r1"},
			{"v1:thread:live", "key_1", "r1"},
			{"v1:thread:dead", "key_1", "r1"},
			{"v1:thread:mine", "key_1", "r1"},
			{"v1:thread:other", "key_1", "r2"},
			{"v1:thread:new", "key_2", "r1"},
		}
		got := make([]store.LaneLease, len(asks))
		var wg sync.WaitGroup
		for i, a := range asks {
			wg.Go(func() {
				l, err := s.LeaseLane(ctx, a.thread, a.scope, a.me, live())
				assert.NoError(t, err)
				got[i] = l
			})
		}
		require.Eventually(t, func() bool { return gate.Queued() == len(asks) }, time.Minute, time.Millisecond)
		gate.Open()
		wg.Wait()
		assert.Equal(t, store.LaneLease{ThreadKey: "v1:thread:first", ClientScope: "key_1", ReplicaID: "r1", Address: "http://r1", Epoch: 1}, <-lead)
		assert.Equal(t, []int{1, len(asks)}, gate.Sizes(), "one write for the first, one for all that came meanwhile")
		held := func(thread, scope, holder string, epoch int64) store.LaneLease {
			return store.LaneLease{ThreadKey: thread, ClientScope: scope, ReplicaID: holder, Address: "http://" + holder, Epoch: epoch}
		}
		assert.Equal(t, []store.LaneLease{
			held("v1:thread:new", "key_1", "r1", 1),
			held("v1:thread:new", "key_1", "r1", 1),
			held("v1:thread:live", "key_1", "r2", 1),
			held("v1:thread:dead", "key_1", "r1", 2),
			held("v1:thread:mine", "key_1", "r1", 1),
			held("v1:thread:other", "key_1", "r2", 1),
			held("v1:thread:new", "key_2", "r1", 1),
		}, got)

		// What was written is what the next lone calls find.
		assert.Equal(t, held("v1:thread:dead", "key_1", "r1", 2), lease("v1:thread:dead", "key_1", "r2"))
		assert.Equal(t, held("v1:thread:other", "key_1", "r2", 1), lease("v1:thread:other", "key_1", "r1"))
		assert.Equal(t, held("v1:thread:new", "key_2", "r1", 1), lease("v1:thread:new", "key_2", "r2"))
	})
}

// Two replicas that lease the same threads at the same moment, each in one
// statement, never deadlock: each statement takes its rows in key order,
// whatever order its requests came in. Here each replica's batch comes in
// the other's order, and both statements are held at the first row one of
// them needs, so without that order they would lock each other's rows.
func TestBatchedLeasesOfTwoReplicasDoNotDeadlock(t *testing.T) {
	url := storetest.PostgresURL(t)
	one, two := storetest.Open(t, url, store.Options{}), storetest.Open(t, url, store.Options{})
	ctx := context.Background()
	live := func() time.Time { return time.Now().Add(-15 * time.Second) }
	threads := make([]string, 20)
	for i := range threads {
		threads[i] = fmt.Sprintf("v1:thread:%02d", i)
	}
	for _, me := range []string{"r1", "r2"} {
		require.NoError(t, one.Heartbeat(ctx, store.Replica{ID: me, Name: me, StartedAt: time.Now()}))
	}
	for _, th := range threads {
		_, err := one.LeaseLane(ctx, th, "key_1", "r1", live())
		require.NoError(t, err)
	}

	hold := holdRow(t, url, `SELECT 1 FROM lane_leases WHERE thread_key = $1 FOR UPDATE`, threads[0])

	var wg sync.WaitGroup
	errs := make(chan error, 2*len(threads)+2)
	var gates []*store.BatchGate
	for i, s := range []*store.Store{one, two} {
		me := []string{"r1", "r2"}[i]
		g := store.GateBatches(s)
		gates = append(gates, g)
		wg.Go(func() {
			_, err := s.LeaseLane(ctx, "v1:thread:lead-"+me, "key_1", me, live())
			errs <- err
		})
		require.Eventually(t, func() bool { return len(g.Sizes()) == 1 }, time.Minute, time.Millisecond)
		for j := range threads {
			th := threads[j]
			if i == 1 {
				th = threads[len(threads)-1-j] // the other order
			}
			wg.Go(func() {
				_, err := s.LeaseLane(ctx, th, "key_1", me, live())
				errs <- err
			})
			// Queued one by one: the batch keeps this order.
			require.Eventually(t, func() bool { return g.Queued() == j+1 }, time.Minute, 100*time.Microsecond)
		}
	}
	for _, g := range gates {
		g.Open()
	}
	// Both batches wait for the row held here, having locked what they
	// locked before it.
	hold.releaseOnceWaited(t, 2, "INSERT INTO lane_leases")
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// Two replicas recording the use of the same keys at the same moment never
// deadlock (PostgreSQL would abort one transaction, and its counts with
// it): each updates the keys in the order of their ids. Both are held
// here at the first key, having locked what they locked before it.
func TestKeyUseOfTwoReplicasDoesNotDeadlock(t *testing.T) {
	url := storetest.PostgresURL(t)
	one, two := storetest.Open(t, url, store.Options{}), storetest.Open(t, url, store.Options{})
	ctx := context.Background()
	uses := map[string]int64{}
	for i := range 150 { // Go's random map order: without the fix, a deadlock in all but a few percent of runs
		k, _, err := one.CreateClientKey(ctx, store.ClientKey{Name: fmt.Sprint("key ", i)})
		require.NoError(t, err)
		uses[k.ID] = 1
	}
	first := slices.Min(slices.Collect(maps.Keys(uses)))

	hold := holdRow(t, url, `SELECT 1 FROM client_keys WHERE id = $1 FOR UPDATE`, first)

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, s := range []*store.Store{one, two} {
		wg.Go(func() { errs <- s.AddClientKeyUse(ctx, uses, time.Now()) })
	}
	hold.releaseOnceWaited(t, 2, "UPDATE client_keys")
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for id := range uses {
		k, err := one.ClientKey(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, int64(2), k.RequestCount, "both replicas' use counted")
	}
}

// rowHold is a row lock held by a transaction of the test's own on a
// PostgreSQL database.
type rowHold struct {
	db *sqlx.DB
	tx *sqlx.Tx
}

// holdRow runs lock (a SELECT ... FOR UPDATE of arg's row) in a
// transaction on the database at url, and keeps it until
// releaseOnceWaited.
func holdRow(t *testing.T, url, lock string, arg any) *rowHold {
	t.Helper()
	db, err := sqlx.Open("postgres", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTxx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	_, err = tx.Exec(lock, arg)
	require.NoError(t, err)
	return &rowHold{db: db, tx: tx}
}

// releaseOnceWaited waits until n of the database's sessions wait for a
// lock in a statement that begins with prefix, then commits the holding
// transaction: the waiters go on.
func (h *rowHold) releaseOnceWaited(t *testing.T, n int, prefix string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := h.db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND starts_with(query, $1)`, prefix)
		return err == nil && waiting == n
	}, time.Minute, 5*time.Millisecond)
	require.NoError(t, h.tx.Commit())
}

// A heartbeat the database does not answer within its deadline (here its
// replica's row is held by another transaction; in production, a link that
// drops packets or a frozen server) marks writes refused, as an error would:
// requests are refused at once instead of each waiting out a deadline of its
// own. The next heartbeat that goes through clears it. A heartbeat cancelled
// (its replica stopping) says nothing of the database.
func TestAHeartbeatTheDatabaseDoesNotAnswerRefusesWrites(t *testing.T) {
	url := storetest.PostgresURL(t)
	s := storetest.Open(t, url, store.Options{})
	ctx := context.Background()
	r := store.Replica{ID: "r1", Name: "r1", StartedAt: time.Now()}
	require.NoError(t, s.Heartbeat(ctx, r))
	require.NoError(t, s.WritesRefused())

	hold := holdRow(t, url, `SELECT 1 FROM replicas WHERE id = $1 FOR UPDATE`, r.ID)
	cctx, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(50*time.Millisecond, cancel) // the replica stopping
	err := s.Heartbeat(cctx, r)
	stop.Stop()
	cancel()
	require.Error(t, err)
	assert.NoError(t, s.WritesRefused(), "a heartbeat cancelled says nothing of the database")

	hctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = s.Heartbeat(hctx, r)
	cancel()
	require.Error(t, err)
	refused := s.WritesRefused()
	require.Error(t, refused, "the heartbeat's deadline passed: the database did not answer")
	assert.Contains(t, refused.Error(), "did not answer")

	hold.releaseOnceWaited(t, 0, "INSERT INTO replicas")
	require.NoError(t, s.Heartbeat(ctx, r))
	assert.NoError(t, s.WritesRefused(), "the next heartbeat that goes through readmits requests")
}
