package store_test

import (
	"context"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// behindLink is a fresh PostgreSQL database's URL through a Link of its
// own.
func behindLink(t *testing.T) (*storetest.Link, string) {
	u, err := url.Parse(storetest.PostgresURL(t))
	require.NoError(t, err)
	link := storetest.NewLink(t, u.Host)
	u.Host = link.Addr()
	return link, u.String()
}

// PostgreSQL that does not answer at all (the link to it drops every
// packet; its connections stay open): every call returns when its context
// ends, whatever it was doing (a query, a write, a transaction, a prepared
// statement, a ping), instead of waiting for an answer that never comes.
// lib/pq alone only sends a cancel request, which the same link never
// carries. Once the link is back the pool serves again: the connections
// the calls gave up on are let go.
func TestACallThePostgresServerDoesNotAnswerEndsWithItsContext(t *testing.T) {
	link, via := behindLink(t)
	s := storetest.Open(t, via, store.Options{})
	ctx := context.Background()
	r := store.Replica{ID: "r1", Name: "r1", StartedAt: time.Now()}
	require.NoError(t, s.Heartbeat(ctx, r))
	acc, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	live := time.Now().Add(-time.Minute)
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"ping", func(ctx context.Context) error { return s.Ping(ctx) }},
		{"prepared write", func(ctx context.Context) error {
			_, err := s.LeaseLane(ctx, "v1:thread:a", "key_1", r.ID, live)
			return err
		}},
		{"write", func(ctx context.Context) error { return s.Heartbeat(ctx, r) }},
		{"query", func(ctx context.Context) error { _, err := s.Replicas(ctx, live); return err }},
		{"transaction", func(ctx context.Context) error {
			_, err := s.Pin(ctx, store.BindRawThread, "thread-a", acc.ID, "pin")
			return err
		}},
	}
	for _, c := range calls {
		require.NoError(t, c.call(ctx), "%s, before the partition", c.name)
	}
	// Open enough connections that every call below finds one idle in the
	// pool: a connection made during the partition is bound by lib/pq's
	// own connect deadline, an established one is not.
	for i := 0; s.OpenConnections() < 2*len(calls); i++ {
		require.Less(t, i, 100, "the pool opens connections: %d open", s.OpenConnections())
		var wg sync.WaitGroup
		for range 4 * len(calls) {
			wg.Go(func() { _, _ = s.Replicas(ctx, live) })
		}
		wg.Wait()
	}

	link.Partition()
	for _, c := range calls {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- c.call(cctx) }()
		select {
		case err := <-done:
			assert.Error(t, err, "%s: nothing answered", c.name)
		case <-time.After(time.Minute):
			t.Fatalf("%s: the call outlived its context by a minute", c.name)
		}
		cancel()
	}

	link.Heal()
	for _, c := range calls {
		require.Eventually(t, func() bool {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return c.call(cctx) == nil
		}, time.Minute, 50*time.Millisecond, "%s, once the link is back", c.name)
	}
}

// A store closed while PostgreSQL does not answer closes at once: the
// prepared statements of its connections are not closed one by one at a
// server that will never answer (the server drops them with the session).
func TestAStoreClosesWhileThePostgresServerDoesNotAnswer(t *testing.T) {
	link, via := behindLink(t)
	loc, err := store.ParseLocation(via)
	require.NoError(t, err)
	s, err := store.Open(context.Background(), loc, store.Options{SecretKey: storetest.SecretKey})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.Migrate(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "r1", Name: "r1", StartedAt: time.Now()}))
	live := time.Now().Add(-time.Minute)
	// Many connections, each with prepared statements of its own.
	for i := 0; s.OpenConnections() < 8; i++ {
		require.Less(t, i, 100, "the pool opens connections: %d open", s.OpenConnections())
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() { _, _ = s.Replicas(ctx, live) })
		}
		wg.Wait()
	}

	link.Partition()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("closing the store waited on the server")
	}
}

// The announcement listener, started while PostgreSQL does not answer,
// ends when its context does: lib/pq's listener waits to connect and to
// subscribe without a context, and a replica's shutdown waits for it.
func TestListenEndsWithItsContextWhileThePostgresServerDoesNotAnswer(t *testing.T) {
	link, via := behindLink(t)
	s := storetest.Open(t, via, store.Options{})

	link.Partition()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, slog.New(slog.DiscardHandler), func(store.Announcement) {}) }()
	time.Sleep(300 * time.Millisecond) // connecting, with nothing coming back
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Listen outlived its context")
	}
	link.Heal()
}
