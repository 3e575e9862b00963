package relay

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func TestHopSignature(t *testing.T) {
	t.Parallel()
	key := []byte("shared hop key")
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	body := []byte(`{"input":[]}`)
	good := signHop(key, "rep_a", at, "POST", "/v1/responses", body)
	for _, tc := range []struct {
		name         string
		key          []byte
		header, path string
		body         []byte
		now          time.Time
		ok           bool
	}{
		{"valid", key, good, "/v1/responses", body, at.Add(5 * time.Second), true},
		{"clock a little behind", key, good, "/v1/responses", body, at.Add(-30 * time.Second), true},
		{"too old: a replayed hop", key, good, "/v1/responses", body, at.Add(2 * time.Minute), false},
		{"another key", []byte("other"), good, "/v1/responses", body, at, false},
		{"no key here", nil, good, "/v1/responses", body, at, false},
		{"body changed", key, good, "/v1/responses", []byte(`{"input":[1]}`), at, false},
		{"path changed", key, good, "/backend-api/codex/responses", body, at, false},
		{"replica changed", key, "rep_b" + good[len("rep_a"):], "/v1/responses", body, at, false},
		{"missing", key, "", "/v1/responses", body, at, false},
		{"garbage", key, "a.b.c", "/v1/responses", body, at, false},
		{"too few parts", key, "rep_a.123", "/v1/responses", body, at, false},
	} {
		from, ok := verifyHop(tc.key, tc.header, "POST", tc.path, tc.body, tc.now)
		assert.Equal(t, tc.ok, ok, tc.name)
		if ok {
			assert.Equal(t, "rep_a", from, tc.name)
		}
	}
}

// A lease this replica holds was taken over from another when its epoch is
// not the one this replica last wrote, or, never held here, past its first.
func TestTookOver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before leaseSeen
		held   bool
		epoch  int64
		want   bool
	}{
		{"a new lease", leaseSeen{}, false, 1, false},
		{"another replica's, never held here", leaseSeen{}, false, 2, true},
		{"renewed here", leaseSeen{epoch: 3}, true, 3, false},
		{"lost and taken back", leaseSeen{epoch: 3}, true, 5, true},
	} {
		assert.Equal(t, tc.want, tookOver(tc.before, tc.held, tc.epoch), tc.name)
	}
}

// A request that takes its thread's lane lease has its bindings read
// meanwhile, and its first choice takes them; later choices read afresh.
func TestBindingsAreReadWhileTheLeaseIsTaken(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	s := New(Config{Store: st, Logger: slog.New(slog.DiscardHandler),
		Replica: ReplicaConfig{ID: "rep_a", Address: "http://127.0.0.1:1", HopKey: []byte("hop key")}})
	defer s.Close()
	ctx := context.Background()
	place := func(account string) {
		require.NoError(t, st.Place(ctx, store.Placement{ClientScope: "key_1", ThreadKey: "v1:thread:t", ThreadID: "t",
			AccountID: account, Source: "admission", TTL: time.Hour}))
	}
	place("acc_a")
	req := &request{client: client{key: store.ClientKey{ID: "key_1"}, keyed: true}, ident: Identity{Key: "v1:thread:t", Thread: "t"}}
	served := s.forward(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/responses", nil), req)
	require.False(t, served, "the lease is this replica's: served here")
	require.NotNil(t, req.bindingsAhead, "the bindings are read while the lease is taken")

	rows, err := s.bindingsOf(ctx, req)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, "acc_a", rows[0].AccountID)
	assert.Nil(t, req.bindingsAhead, "taken once")

	place("acc_b")
	rows, err = s.bindingsOf(ctx, req)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, "acc_b", rows[0].AccountID, "a later choice reads afresh")
}

// A replica whose heartbeat fails may be counted gone and its threads
// taken over, with the announcements lost on the way: it drops the leases
// it holds in memory, so each thread's next request reads its lease afresh
// instead of being served here on the strength of a renewal the database
// may no longer honour (the race TestReplicaCutOffFromItsDatabase caught
// once: /readyz ready again before the listener's resync).
func TestAFailedHeartbeatDropsTheLeasesHeld(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	s := New(Config{Store: st, Logger: slog.New(slog.DiscardHandler),
		Replica: ReplicaConfig{ID: "rep_a", Address: "http://127.0.0.1:1", HopKey: []byte("hop key"), Heartbeat: 20 * time.Millisecond}})
	defer s.Close()
	req := &request{client: client{key: store.ClientKey{ID: "key_1"}, keyed: true}, ident: Identity{Key: "v1:thread:t", Thread: "t"}}
	require.False(t, s.forward(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/responses", nil), req), "served here")
	_, held := s.leased.Load(leaseKey(req))
	require.True(t, held, "the lease taken is held in memory")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.heartbeat(ctx) }()
	// While the heartbeat goes through, the lease stays held.
	time.Sleep(100 * time.Millisecond)
	_, held = s.leased.Load(leaseKey(req))
	assert.True(t, held, "a heartbeat that goes through keeps the leases")

	require.NoError(t, st.Close()) // every heartbeat from now on fails
	assert.Eventually(t, func() bool { _, held := s.leased.Load(leaseKey(req)); return !held },
		time.Minute, 10*time.Millisecond, "a failed heartbeat drops the leases held")
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the heartbeat did not end with its context")
	}
}
