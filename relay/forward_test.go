package relay

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// A hop verifies for exactly the request it signed, sent by its replica to
// its replica within hopSkew, under the key: changing any one part the
// signature covers (issue 36.7: the method, the path, the query, the body,
// each bound header, the replicas, the time, the nonce) fails, and so does a
// hop addressed to another replica or too old.
func TestHopSignature(t *testing.T) {
	t.Parallel()
	key := []byte("shared hop key")
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	nonce := strings.Repeat("ab", hopNonceLen/2)
	// The headers the receiver decides on (and the identity headers it sends
	// upstream), each of which the hop must cover, and two it need not.
	bound := http.Header{"Authorization": {"Bearer crk_secret"}, "Session-Id": {"s-1"}, "Thread-Id": {"t-1"},
		"X-Codex-Turn-State": {"ts-1"}, "X-Codex-Turn-Metadata": {`{"turn":1}`}, "X-Codex-Parent-Thread-Id": {"p-1"},
		"X-Openai-Subagent": {"review"}, "X-Codex-Window-Id": {"w-1"}, "X-Client-Request-Id": {"c-1"},
		"Originator": {"codex_cli_rs"}, "Openai-Beta": {"b-1"}, "User-Agent": {"codex_cli_rs/0.130.0"},
		"Session_id": {"s-2"}, "X-Codex-Session-Id": {"s-3"}, "X-Codex-Conversation-Id": {"s-4"}}
	header := bound.Clone()
	header.Set("Accept", "text/event-stream")
	header.Set("X-Forwarded-For", "10.0.0.1")
	req := hopRequest{method: "POST", path: "/v1/responses", query: "a=1", header: header, body: []byte(`{"input":[]}`)}
	good := signHop(key, "rep_a", "rep_b", at, nonce, req)
	h, err := verifyHop(key, good, "rep_b", req, at.Add(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, hop{from: "rep_a", to: "rep_b", at: at, nonce: nonce}, hop{from: h.from, to: h.to, at: h.at.UTC(), nonce: h.nonce})

	with := func(change func(*hopRequest)) hopRequest {
		c := req
		c.header = req.header.Clone()
		change(&c)
		return c
	}
	type variant struct {
		name   string
		key    []byte
		header string
		self   string
		req    hopRequest
		now    time.Time
		want   error
	}
	variants := []variant{
		{"clock a little behind", key, good, "rep_b", req, at.Add(-hopSkew), nil},
		{"at the window's end", key, good, "rep_b", req, at.Add(hopSkew), nil},
		{"too old", key, good, "rep_b", req, at.Add(hopSkew + time.Second), hopStale},
		{"from the future", key, good, "rep_b", req, at.Add(-hopSkew - time.Second), hopStale},
		{"received by another replica", key, good, "rep_c", req, at, hopMisdirected},
		{"received by its sender", key, good, "rep_a", req, at, hopMisdirected},
		{"another key", []byte("other"), good, "rep_b", req, at, hopBadMAC},
		{"no key here", nil, good, "rep_b", req, at, hopMalformed},
		{"method changed", key, good, "rep_b", with(func(r *hopRequest) { r.method = "PUT" }), at, hopBadMAC},
		{"path changed", key, good, "rep_b", with(func(r *hopRequest) { r.path = "/backend-api/codex/responses" }), at, hopBadMAC},
		{"query changed", key, good, "rep_b", with(func(r *hopRequest) { r.query = "a=2" }), at, hopBadMAC},
		{"query gone", key, good, "rep_b", with(func(r *hopRequest) { r.query = "" }), at, hopBadMAC},
		{"body changed", key, good, "rep_b", with(func(r *hopRequest) { r.body = []byte(`{"input":[1]}`) }), at, hopBadMAC},
		{"body longer", key, good, "rep_b", with(func(r *hopRequest) { r.body = append(r.body, ' ') }), at, hopBadMAC},
		{"a second User-Agent (not sent)", key, good, "rep_b", with(func(r *hopRequest) { r.header.Add("User-Agent", "x") }), at, nil},
		{"an unbound header added", key, good, "rep_b", with(func(r *hopRequest) { r.header.Set("X-Trace", "1") }), at, nil},
	}
	for name := range header {
		if _, ok := bound[name]; !ok {
			variants = append(variants, variant{name + " (not bound) changed", key, good, "rep_b",
				with(func(r *hopRequest) { r.header.Set(name, "changed") }), at, nil})
			continue
		}
		variants = append(variants,
			variant{name + " changed", key, good, "rep_b", with(func(r *hopRequest) { r.header.Set(name, header.Get(name)+"x") }), at, hopBadMAC},
			variant{name + " gone", key, good, "rep_b", with(func(r *hopRequest) { r.header.Del(name) }), at, hopBadMAC},
			variant{name + " empty", key, good, "rep_b", with(func(r *hopRequest) { r.header.Set(name, "") }), at, hopBadMAC})
		if name != "User-Agent" {
			variants = append(variants, variant{name + " given twice", key, good, "rep_b",
				with(func(r *hopRequest) { r.header.Add(name, header.Get(name)) }), at, hopBadMAC})
		}
	}
	for _, name := range hopBoundHeaders {
		if _, set := bound[name]; !set {
			t.Errorf("the hop covers %s, which this test does not check", name)
		}
	}
	parts := strings.Split(good, ".")
	require.Len(t, parts, 5)
	field := func(i int, v string) string {
		p := slices.Clone(parts)
		p[i] = v
		return strings.Join(p, ".")
	}
	variants = append(variants,
		variant{"sender changed", key, field(0, "rep_x"), "rep_b", req, at, hopBadMAC},
		variant{"destination changed to the receiver", key, field(1, "rep_c"), "rep_c", req, at, hopBadMAC},
		variant{"time changed", key, field(2, strconv.FormatInt(at.Unix()+1, 10)), "rep_b", req, at, hopBadMAC},
		variant{"time written otherwise", key, field(2, "+"+parts[2]), "rep_b", req, at, hopBadMAC},
		variant{"nonce changed", key, field(3, strings.Repeat("cd", hopNonceLen/2)), "rep_b", req, at, hopBadMAC},
		variant{"nonce shorter", key, field(3, parts[3][2:]), "rep_b", req, at, hopMalformed},
		variant{"signature changed", key, field(4, strings.Repeat("0", len(parts[4]))), "rep_b", req, at, hopBadMAC},
		variant{"the former format", key, "rep_a." + parts[2] + "." + parts[4], "rep_b", req, at, hopMalformed},
		variant{"missing", key, "", "rep_b", req, at, hopMalformed},
		variant{"garbage", key, "a.b.c.d.e", "rep_b", req, at, hopMalformed},
		variant{"a field more", key, good + ".x", "rep_b", req, at, hopMalformed},
	)
	for _, v := range variants {
		_, err := verifyHop(v.key, v.header, v.self, v.req, v.now)
		if v.want == nil {
			assert.NoError(t, err, v.name)
		} else {
			assert.Equal(t, v.want, err, v.name)
		}
	}
}

// A replica accepts a hop's nonce once while the hop is within its window,
// forgets it after, and remembers no more than its bound, refusing hops
// while it is full of nonces still valid.
func TestHopNonces(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	n := &hopNonces{bound: 3}
	until := at.Add(hopSkew)
	require.NoError(t, n.accept("n1", until, at))
	assert.Equal(t, hopReplayed, n.accept("n1", until, at.Add(time.Second)), "once")
	assert.Equal(t, hopReplayed, n.accept("n1", until, until), "until the hop's window ends")
	require.NoError(t, n.accept("n2", until, at))
	require.NoError(t, n.accept("n3", until.Add(time.Second), at))
	assert.Equal(t, hopNoRoom, n.accept("n4", until, at.Add(time.Second)), "full")
	assert.Equal(t, hopReplayed, n.accept("n2", until, at.Add(time.Second)), "a replay is still one when full")

	// Past n1's and n2's window, they are forgotten, and there is room.
	later := until.Add(time.Millisecond)
	require.NoError(t, n.accept("n4", later.Add(hopSkew), later))
	require.NoError(t, n.accept("n5", later.Add(hopSkew), later))
	assert.Equal(t, hopReplayed, n.accept("n3", until.Add(time.Second), later), "n3's window has not ended")
	assert.Len(t, n.seen, 3)
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
