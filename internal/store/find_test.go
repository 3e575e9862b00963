package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// One request log row by id, and whether the log has any.
func TestRequestByID(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		logged, err := s.AnyRequest(ctx)
		require.NoError(t, err)
		assert.False(t, logged, "a fresh log is empty")
		_, err = s.Request(ctx, "req_none")
		assert.ErrorIs(t, err, store.ErrNotFound)

		at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_one", ThreadID: "t1", Transport: "http", Path: "/v1/responses",
			Model: "gpt-x", Status: 200, StartedAt: at, CostNanos: 1234, Unpriced: true, TotalTokens: 9}))
		logged, err = s.AnyRequest(ctx)
		require.NoError(t, err)
		assert.True(t, logged)
		r, err := s.Request(ctx, "req_one")
		require.NoError(t, err)
		assert.Equal(t, "t1", r.ThreadID)
		assert.Equal(t, at, r.StartedAt)
		assert.True(t, r.Unpriced)
		assert.EqualValues(t, 1234, r.CostNanos)
	})
}

// FindIDs finds request ids, thread and session ids and derived keys, in
// the bindings and in the request log, exactly or by prefix.
func TestFindIDs(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "tk_bound", SessionKey: "sk_bound", ThreadID: "thread-bound-1",
			SessionID: "session-bound-1", AccountID: "acc_a", Source: "admission:balancer", TTL: time.Hour, SeedSession: true}))
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_aaaa1111", ThreadKey: "tk_logged", ThreadID: "thread-logged-1",
			SessionID: "session-logged-1", Transport: "http", Status: 200, StartedAt: at}))
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_aaaa2222", ThreadKey: "tk_bound", ThreadID: "thread-bound-1",
			SessionID: "session-bound-1", Transport: "http", Status: 200, StartedAt: at}))
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_sessiononly", ThreadKey: "tk_sessiononly", SessionID: "session-only",
			Transport: "http", Status: 200, StartedAt: at}))

		for _, c := range []struct {
			name, q  string
			prefix   bool
			requests []string
			threads  []store.FoundID
			sessions []store.FoundID
		}{
			{name: "a request id", q: "req_aaaa1111", requests: []string{"req_aaaa1111"}},
			{name: "requests by prefix", q: "req_aaaa", prefix: true, requests: []string{"req_aaaa1111", "req_aaaa2222"}},
			{name: "a prefix is not an exact match", q: "req_aaaa"},
			{name: "a bound thread", q: "thread-bound-1", threads: []store.FoundID{{ID: "thread-bound-1", Bound: true}}},
			{name: "a thread only the log names", q: "thread-logged-1", threads: []store.FoundID{{ID: "thread-logged-1"}}},
			{name: "threads by prefix", q: "thread-", prefix: true,
				threads: []store.FoundID{{ID: "thread-bound-1", Bound: true}, {ID: "thread-logged-1"}}},
			{name: "a bound session", q: "session-bound-1", sessions: []store.FoundID{{ID: "session-bound-1", Bound: true}}},
			{name: "a logged session", q: "session-only", sessions: []store.FoundID{{ID: "session-only"}}},
			{name: "a bound thread key is its thread", q: "tk_bound", threads: []store.FoundID{{ID: "thread-bound-1", Bound: true}}},
			{name: "a session key is its session", q: "sk_bound", sessions: []store.FoundID{{ID: "session-bound-1", Bound: true}}},
			{name: "a logged thread key is its thread", q: "tk_logged", threads: []store.FoundID{{ID: "thread-logged-1"}}},
			{name: "the key of a client without thread ids is its session", q: "tk_sessiononly", sessions: []store.FoundID{{ID: "session-only"}}},
			{name: "case matters", q: "THREAD-BOUND-1"},
			{name: "a LIKE pattern is text", q: "thread-%", prefix: true},
			{name: "nothing", q: "nothing-here", prefix: true},
		} {
			got, err := s.FindIDs(ctx, c.q, c.prefix)
			require.NoError(t, err, c.name)
			assert.Equal(t, c.requests, got.Requests, c.name)
			assert.Equal(t, c.threads, nilIfEmpty(got.Threads), c.name)
			assert.Equal(t, c.sessions, nilIfEmpty(got.Sessions), c.name)
		}
	})
}

func nilIfEmpty(ids []store.FoundID) []store.FoundID {
	if len(ids) == 0 {
		return nil
	}
	return ids
}
