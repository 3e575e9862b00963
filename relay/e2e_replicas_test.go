package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/store/storetest"
	"github.com/codexrelay/codex-relay/relay/upstreamtest"
)

// replica is one relay process of several sharing a PostgreSQL database.
type replica struct {
	relay *relay.Server
	srv   *httptest.Server
	stop  func()
}

func startReplica(t *testing.T, dbURL, name string) *replica {
	t.Helper()
	st := storetest.Open(t, dbURL, store.Options{})
	rl := relay.New(relay.Config{Store: st, Logger: testLogger(t).With("replica", name),
		Replica: relay.ReplicaConfig{Name: name, Heartbeat: 100 * time.Millisecond}})
	srv := httptest.NewServer(rl)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rl.Run(ctx) })
	var once sync.Once
	r := &replica{relay: rl, srv: srv, stop: func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			rl.Close()
			srv.Close()
		})
	}}
	t.Cleanup(r.stop)
	return r
}

// Two replicas on one PostgreSQL: each lists the other's lanes (from its
// heartbeat), a thread reset on one closes the thread's lane on the other
// and drops its continuity there, and a stopped replica's lanes leave the
// listing.
func TestReplicasShareLanesAndResets(t *testing.T) {
	dbURL := storetest.PostgresURL(t)
	sim := upstreamtest.NewServer(upstreamtest.Config{Accounts: []upstreamtest.Account{simAccount("a1", "org-a")}, Logger: testLogger(t)})
	t.Cleanup(sim.Close)
	setup := storetest.Open(t, dbURL, store.Options{})
	_, err := setup.CreateAccount(context.Background(), store.Account{Kind: store.KindChatGPT, Label: "a1", BaseURL: sim.CodexBaseURL(), ChatGPTAccountID: "a1"},
		store.Credentials{AccessToken: "at-a1", RefreshToken: "rt-a1"})
	require.NoError(t, err)

	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	h := &harness{t: t, sim: sim, store: setup, relay: b.relay, srv: b.srv}
	resp, body := h.post(sessionS, rootT, responseRequest("on replica b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, 1, b.relay.Bridge().Len(), "replica b holds the thread's bridge lane")
	require.Equal(t, 0, a.relay.Bridge().Len())
	entries, _ := b.relay.Continuity().Len()
	require.Positive(t, entries)

	laneOn := func(r *replica, replicaName string) bool {
		for _, l := range r.relay.Lanes() {
			if l.Replica == replicaName && l.Kind == "bridge" {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return laneOn(a, "replica-b") }, 10*time.Second, 20*time.Millisecond,
		"replica a lists replica b's lane")
	assert.True(t, laneOn(b, "replica-b"), "and b its own, named")

	reset, err := setup.ResetBindings(context.Background(), store.BindingReset{ThreadID: rootT})
	require.NoError(t, err)
	require.NotEmpty(t, reset)
	// The operator resets the thread on replica a. (Said again until heard:
	// b's listener subscribes in the background and may not be up yet.)
	require.Eventually(t, func() bool {
		a.relay.Forget(reset)
		time.Sleep(50 * time.Millisecond)
		return b.relay.Bridge().Len() == 0
	}, 10*time.Second, 20*time.Millisecond, "replica b closed the reset thread's lane")
	require.Eventually(t, func() bool { entries, _ := b.relay.Continuity().Len(); return entries == 0 }, 10*time.Second, 20*time.Millisecond,
		"and dropped its continuity")

	resp, body = h.post(sessionS, rootT, responseRequest("again on b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Eventually(t, func() bool { return laneOn(a, "replica-b") }, 10*time.Second, 20*time.Millisecond)
	b.stop()
	require.Eventually(t, func() bool { return !laneOn(a, "replica-b") }, 10*time.Second, 20*time.Millisecond,
		"a stopped replica's lanes leave the listing")
}
