package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The database counts a window per minute, per class and per thread; rows
// outside the window do not count.
func TestTraffic(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		n := 0
		req := func(thread, account string, ago time.Duration, status int) {
			n++
			require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: fmt.Sprintf("req_%d", n), ThreadID: thread, SessionID: "s-" + thread,
				AccountID: account, Transport: "http", Path: "/v1/responses", StartedAt: now.Add(-ago), Status: status}))
		}
		req("t1", "acc_a", 10*time.Second, 200)
		req("t1", "acc_b", 30*time.Second, 200)
		req("t1", "acc_c", 90*time.Second, 429)
		req("t2", "acc_a", 59*time.Minute, 200)
		req("t3", "acc_a", 61*time.Minute, 200) // outside
		req("t4", "acc_a", 60*time.Minute, 200) // on the window's open edge: outside
		req("", "acc_a", 5*time.Minute, 200)
		req("t5", "acc_a", -time.Second, 200) // after the window's end
		att := func(seq int, thread, account, from, class string, ago time.Duration) store.Attempt {
			return store.Attempt{RequestID: fmt.Sprintf("r%d", seq), Seq: 1, ThreadID: thread, AccountID: account, FromAccountID: from,
				Class: class, StartedAt: now.Add(-ago), EndedAt: now.Add(-ago)}
		}
		require.NoError(t, s.RecordAttempts(ctx, []store.Attempt{
			att(1, "t1", "acc_a", "acc_b", "ok", 10*time.Second),
			att(2, "t1", "acc_b", "", "usage_limit", 11*time.Second),
			att(3, "t1", "acc_a", "acc_a", "usage_limit", 90*time.Second), // same account: no switch
			att(4, "t2", "acc_a", "", "transport", 59*time.Minute),
			att(5, "t3", "acc_a", "acc_b", "server", 2*time.Hour), // outside
		}))

		tr, err := s.Traffic(ctx, now, 60, 8)
		require.NoError(t, err)
		require.Len(t, tr.Requests, 60)
		assert.Equal(t, 2, tr.Requests[59], "the newest minute")
		assert.Equal(t, 1, tr.Requests[58])
		assert.Equal(t, 1, tr.Failed[58])
		assert.Equal(t, 1, tr.Requests[54], "five minutes ago, no thread")
		assert.Equal(t, 1, tr.Requests[0], "59 minutes ago")
		total := 0
		for _, v := range tr.Requests {
			total += v
		}
		assert.Equal(t, 5, total)
		assert.Equal(t, 1, tr.Switches[59])
		assert.Equal(t, 1, tr.FailedAttempts[59])
		assert.Equal(t, 1, tr.FailedAttempts[58])
		assert.Equal(t, 1, tr.FailedAttempts[0])
		assert.Equal(t, map[string]int{"usage_limit": 2, "transport": 1}, tr.Classes)

		require.Len(t, tr.Threads, 2, "threads of the window; requests without a thread are left out")
		assert.Equal(t, store.ThreadTraffic{ThreadID: "t1", SessionID: "s-t1", AccountID: "acc_a", Requests: 3, Errors: 1, Switches: 1,
			LastAt: now.Add(-10 * time.Second)}, tr.Threads[0])
		assert.Equal(t, "t2", tr.Threads[1].ThreadID)

		one, err := s.Traffic(ctx, now, 60, 1)
		require.NoError(t, err)
		require.Len(t, one.Threads, 1, "the busiest only")
		assert.Equal(t, "t1", one.Threads[0].ThreadID)

		empty, err := s.Traffic(ctx, now.Add(-24*time.Hour), 60, 8)
		require.NoError(t, err)
		assert.Empty(t, empty.Threads)
		assert.Empty(t, empty.Classes)
	})
}
