package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
)

func limitedKey(t *testing.T, s *store.Store, ls ...budget.Limit) store.ClientKey {
	t.Helper()
	k, _, err := s.CreateClientKey(context.Background(), store.ClientKey{Name: "limited", Limits: ls})
	require.NoError(t, err)
	require.Equal(t, ls, k.Limits, "the limits read back as written")
	return k
}

// settle writes a request's log row as the relay does when it ends: its
// use, and its reservation deleted in the same transaction.
func settle(t *testing.T, s *store.Store, k store.ClientKey, id string, at time.Time, tokens, cost int64) {
	t.Helper()
	require.NoError(t, s.RecordRequest(context.Background(), store.RequestRecord{ID: id, ClientKeyID: k.ID, Transport: "http",
		Path: "/v1/responses", Status: 200, StartedAt: at, TotalTokens: tokens, CostNanos: cost, Charged: true, Reserved: true}, nil))
}

// Concurrent admissions of one key are decided one after the other: with
// max 3 requests per minute, exactly three of many simultaneous requests
// start, on SQLite and on PostgreSQL.
func TestAdmitConcurrentReservations(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		k := limitedKey(t, s, budget.Limit{Metric: budget.Requests, Window: budget.Minute, Max: 3})
		var admitted atomic.Int32
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := s.Admit(ctx, store.Admission{Key: k, RequestID: fmt.Sprintf("req_%d", i), Replica: "r1",
					Estimate: budget.Use{Requests: 1, Tokens: 10}, Reserve: true, Location: time.UTC})
				r := a.Refused
				if !assert.NoError(t, err) {
					return
				}
				if r == nil {
					admitted.Add(1)
				} else {
					assert.Equal(t, "requests/minute", r.Limit.Name())
					assert.True(t, r.RetryAt.Equal(clk.Now().Add(time.Second)), "only reservations fill it: soon")
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, int32(3), admitted.Load())
		use, err := s.KeyBudget(ctx, k, "r1", clk.Now().Add(-15*time.Second), time.UTC)
		require.NoError(t, err)
		require.Len(t, use, 1)
		assert.Equal(t, 0.0, use[0].Used)
		assert.Equal(t, 3.0, use[0].Reserved)
	})
}

// Settling moves a request's use from its reservation to its log row at
// once: the use counts once before and once after; a rolling window
// forgets it when it leaves; a calendar window resets at its end.
func TestAdmitSettleAndWindows(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		k := limitedKey(t, s, budget.Limit{Metric: budget.Tokens, Window: budget.FiveHours, Max: 100},
			budget.Limit{Metric: budget.CostUSD, Window: budget.Day, Max: 1})
		admit := func(id string) *store.Refused {
			t.Helper()
			a, err := s.Admit(ctx, store.Admission{Key: k, RequestID: id, Replica: "r1", Estimate: budget.Use{Requests: 1, Tokens: 60},
				Reserve: true, Location: time.UTC})
			require.NoError(t, err)
			require.Len(t, a.Used, 2)
			return a.Refused
		}
		start := clk.Now() // 12:00 UTC
		require.Nil(t, admit("req_a"))
		require.Nil(t, admit("req_b"), "60 reserved is below 100")
		r := admit("req_c")
		require.NotNil(t, r, "120 reserved is not")
		assert.Equal(t, "tokens/5h", r.Limit.Name())

		// a settles 30 tokens and 0.40 USD: 30 + 60 reserved admits c.
		settle(t, s, k, "req_a", start, 30, 400_000_000)
		require.Nil(t, admit("req_c"))
		// b and c settle 40 each: 110 tokens settled.
		clk.Add(time.Hour)
		settle(t, s, k, "req_b", start.Add(time.Hour), 40, 300_000_000)
		clk.Add(time.Hour)
		settle(t, s, k, "req_c", start.Add(2*time.Hour), 40, 300_000_000)
		r = admit("req_d")
		require.NotNil(t, r)
		assert.Equal(t, "tokens/5h", r.Limit.Name())
		assert.Equal(t, 110.0, r.Used)
		// Once a (30) leaves the window, 80 is below 100: at 17:00.
		assert.True(t, r.RetryAt.Equal(start.Add(5*time.Hour)), "retry at %v", r.RetryAt)

		use, err := s.KeyBudget(ctx, k, "r1", clk.Now().Add(-15*time.Second), time.UTC)
		require.NoError(t, err)
		require.Len(t, use, 2)
		assert.Equal(t, 110.0, use[0].Used)
		assert.Equal(t, 0.0, use[0].Reserved, "every reservation settled")
		assert.True(t, use[0].ResetsAt.Equal(start.Add(5*time.Hour)))
		assert.InDelta(t, 1.0, use[1].Used, 1e-9)
		assert.True(t, use[1].ResetsAt.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), "the day's end")

		clk.Add(3*time.Hour + time.Millisecond) // 17:00:00.001: a left the 5h window
		r = admit("req_e")
		require.NotNil(t, r, "the day's cost is still at 1 USD")
		assert.Equal(t, "cost_usd/day", r.Limit.Name())
		assert.True(t, r.RetryAt.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)))

		clk.Add(7 * time.Hour) // the next day, 00:00: b and c left the day and the 5h window
		require.Nil(t, admit("req_f"))
	})
}

// A reservation counts while it is young or its replica lives: a dead
// replica's requests will never settle, so they stop holding the key's
// budget, and are then deleted. A prewarm checks without reserving.
func TestReservationsOfDeadReplicas(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		k := limitedKey(t, s, budget.Limit{Metric: budget.Concurrent, Max: 1})
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "dying", StartedAt: clk.Now()}))
		admit := func(id, replica string, reserve bool) *store.Refused {
			t.Helper()
			a, err := s.Admit(ctx, store.Admission{Key: k, RequestID: id, Replica: replica, LiveSince: clk.Now().Add(-15 * time.Second),
				Estimate: budget.Use{Requests: 1}, Reserve: reserve, Location: time.UTC})
			require.NoError(t, err)
			return a.Refused
		}
		require.Nil(t, admit("req_prewarm", "live", false))
		require.Nil(t, admit("req_1", "dying", true), "a prewarm reserved nothing")
		require.NotNil(t, admit("req_2", "live", true), "the dying replica's request is in flight")
		n, err := s.DeleteStaleReservations(ctx, "live", clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		assert.Zero(t, n, "the replica is alive")

		clk.Add(20 * time.Second) // its heartbeat is stale, but its reservation is young
		require.NotNil(t, admit("req_3", "live", true), "a young reservation counts whatever the heartbeat")
		clk.Add(time.Minute) // and now it is not
		require.Nil(t, admit("req_3", "live", true))
		n, err = s.DeleteStaleReservations(ctx, "live", clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the dead replica's reservation went; the live one's stays")
		require.NotNil(t, admit("req_4", "live", true))

		// A completed request's reservation no longer counts as in flight;
		// one whose log row never came is deleted after a grace.
		require.NoError(t, s.FinishReservation(ctx, "req_3", budget.Use{Requests: 1, Tokens: 7}))
		require.Nil(t, admit("req_5", "live", true))
		require.NoError(t, s.FinishReservation(ctx, "req_5", budget.Use{Requests: 1, Tokens: 7}))
		clk.Add(5 * time.Minute)
		n, err = s.DeleteStaleReservations(ctx, "live", clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		assert.Zero(t, n, "within the grace")
		clk.Add(10 * time.Minute)
		n, err = s.DeleteStaleReservations(ctx, "live", clk.Now().Add(-15*time.Second))
		require.NoError(t, err)
		assert.Equal(t, int64(2), n, "both completed reservations were never settled")
	})
}
