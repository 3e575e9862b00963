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

func TestRequestLogAndAttempts(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		for i := range 3 {
			require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ThreadID: "t1", SessionID: "s1", AccountID: "acc_a",
				Transport: "http", Path: "/v1/responses", Model: "m", Status: 200, StartedAt: start.Add(time.Duration(i) * time.Second),
				FirstEvent: 120 * time.Millisecond, Duration: 2 * time.Second, InputTokens: 10, OutputTokens: 5}))
		}
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ThreadID: "t2", Transport: "ws", Path: "/x", Status: 429, ErrorCode: "usage_limit_reached", StartedAt: start}))
		rows, total, err := s.Requests(ctx, store.RequestFilter{ThreadID: "t1", Limit: 2})
		require.NoError(t, err)
		assert.Equal(t, 3, total)
		require.Len(t, rows, 2)
		assert.Equal(t, start.Add(2*time.Second), rows[0].StartedAt, "newest first")
		assert.Equal(t, 120*time.Millisecond, rows[0].FirstEvent)
		assert.Equal(t, 2*time.Second, rows[0].Duration)
		rows, _, err = s.Requests(ctx, store.RequestFilter{Transport: "ws"})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		assert.Equal(t, "usage_limit_reached", rows[0].ErrorCode)
		assert.Zero(t, rows[0].FirstEvent)

		require.NoError(t, s.RecordAttempts(ctx, []store.Attempt{
			{RequestID: "req_1", Seq: 1, AccountID: "acc_a", Class: "usage_limit", Action: "next_account", Status: 429, StartedAt: start, EndedAt: start},
			{RequestID: "req_1", Seq: 2, AccountID: "acc_b", FromAccountID: "acc_a", Class: "ok", Recovery: "failover", Action: "done", Status: 200, StartedAt: start, EndedAt: start.Add(time.Second), FirstEvent: time.Second},
		}))
		atts, total, err := s.Attempts(ctx, store.AttemptFilter{Recovery: "failover"})
		require.NoError(t, err)
		assert.Equal(t, 1, total)
		assert.Equal(t, "acc_a", atts[0].FromAccountID)
		atts, total, err = s.Attempts(ctx, store.AttemptFilter{RequestID: "req_1"})
		require.NoError(t, err)
		assert.Equal(t, 2, total)
		assert.Equal(t, 2, atts[0].Seq)
	})
}

func TestUpdateUsage(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "w"}, store.Credentials{AccessToken: "t"})
		require.NoError(t, err)
		reset := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		require.NoError(t, s.UpdateUsage(ctx, a.ID, store.Window{UsedPercent: 42.5, WindowMinutes: 300, ResetAt: reset, Known: true}, store.Window{}))
		got, err := s.Account(ctx, a.ID)
		require.NoError(t, err)
		assert.True(t, got.Primary.Known)
		assert.InDelta(t, 42.5, got.Primary.UsedPercent, 0.001)
		assert.Equal(t, 300, got.Primary.WindowMinutes)
		assert.True(t, reset.Equal(got.Primary.ResetAt))
		assert.False(t, got.Secondary.Known, "an unreported window stays unknown")
		assert.False(t, got.UsageUpdatedAt.IsZero())
		assert.ErrorIs(t, s.UpdateUsage(ctx, "acc_nope", store.Window{Known: true}, store.Window{}), store.ErrNotFound)
	})
}

// A request's log row and its attempts are written together, or not at all.
func TestRecordRequestIsOneTransaction(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		rec := store.RequestRecord{ID: "req_tx", ThreadID: "t1", Transport: "http", Path: "/v1/responses", Status: 200, StartedAt: start}
		atts := []store.Attempt{
			{RequestID: "req_tx", Seq: 1, ThreadID: "t1", AccountID: "acc_a", Class: "usage_limit", Action: "next_account", StartedAt: start, EndedAt: start},
			{RequestID: "req_tx", Seq: 2, ThreadID: "t1", AccountID: "acc_b", FromAccountID: "acc_a", Class: "ok", Action: "done", StartedAt: start, EndedAt: start},
		}
		require.NoError(t, s.RecordRequest(ctx, rec, atts))
		_, n, err := s.Requests(ctx, store.RequestFilter{ThreadID: "t1"})
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		_, n, err = s.Attempts(ctx, store.AttemptFilter{RequestID: "req_tx"})
		require.NoError(t, err)
		assert.Equal(t, 2, n)

		// The same request id again (a retried write): the row stays as it
		// was, and the attempts of the second write are not added.
		again := []store.Attempt{{ID: "att_again", RequestID: "req_tx", Seq: 3, ThreadID: "t1", AccountID: "acc_c", Class: "ok", StartedAt: start, EndedAt: start}}
		changed := rec
		changed.Status = 502
		require.NoError(t, s.RecordRequest(ctx, changed, again))
		rows, _, err := s.Requests(ctx, store.RequestFilter{ThreadID: "t1"})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		assert.Equal(t, 200, rows[0].Status)

		if s.Dialect() != store.Postgres {
			return
		}
		// A batch with a row PostgreSQL refuses (text cannot hold a NUL
		// byte) is written not at all: the other request's row and
		// attempts are not there either.
		ok := store.LoggedRequest{Request: store.RequestRecord{ID: "req_ok", ThreadID: "t2", Transport: "ws", StartedAt: start},
			Attempts: []store.Attempt{{ID: "att_ok", RequestID: "req_ok", Seq: 1, ThreadID: "t2", Class: "ok", StartedAt: start, EndedAt: start}}}
		bad := store.LoggedRequest{Request: store.RequestRecord{ID: "req_bad", ThreadID: "t2\x00", Transport: "ws", StartedAt: start}}
		require.Error(t, s.RecordRequests(ctx, []store.LoggedRequest{ok, bad}))
		_, n, err = s.Requests(ctx, store.RequestFilter{ThreadID: "t2"})
		require.NoError(t, err)
		assert.Zero(t, n)
		_, n, err = s.Attempts(ctx, store.AttemptFilter{RequestID: "req_ok"})
		require.NoError(t, err)
		assert.Zero(t, n, "nothing of the failed write remains")
	})
}

// Many requests finishing at once on a fresh store (no statement prepared
// yet) all get logged: no transaction waits on a connection another holds.
func TestRecordRequestUnderLoad(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		const n = 48
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				id := fmt.Sprintf("req_load_%d", i)
				errs <- s.RecordRequest(ctx, store.RequestRecord{ID: id, ThreadID: "load", Transport: "http", Path: "/v1/responses", Status: 200, StartedAt: start},
					[]store.Attempt{{RequestID: id, Seq: 1, ThreadID: "load", AccountID: "acc_a", Class: "ok", StartedAt: start, EndedAt: start}})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		_, total, err := s.Requests(context.Background(), store.RequestFilter{ThreadID: "load"})
		require.NoError(t, err)
		assert.Equal(t, n, total)
	})
}

// Records older than the retention go, in batches; newer ones stay. The
// request log keeps the budget horizon (32 days) whatever the retention:
// monthly budgets count its rows.
func TestDeleteRecordsBefore(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		now := clk.Now()
		for i, ago := range []time.Duration{40 * 24 * time.Hour, 31 * 24 * time.Hour, 29 * 24 * time.Hour, time.Hour} {
			id := fmt.Sprintf("req_%d", i)
			at := now.Add(-ago)
			require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ID: id, ThreadID: "t", Transport: "http", Path: "/v1/responses", Status: 200, StartedAt: at},
				[]store.Attempt{{RequestID: id, Seq: 1, ThreadID: "t", Class: "ok", StartedAt: at, EndedAt: at}}))
		}
		n, err := s.DeleteRecordsBefore(ctx, now.Add(-30*24*time.Hour), 10)
		require.NoError(t, err)
		assert.Equal(t, int64(3), n, "one request (past the horizon) and two attempts")
		rows, total, err := s.Requests(ctx, store.RequestFilter{})
		require.NoError(t, err)
		assert.Equal(t, 3, total)
		for _, r := range rows {
			assert.True(t, r.StartedAt.After(now.Add(-store.BudgetHorizon)))
		}
		_, total, err = s.Attempts(ctx, store.AttemptFilter{})
		require.NoError(t, err)
		assert.Equal(t, 2, total)
	})
}

// Many requests go in one transaction; written again (a retry after a
// commit whose answer was lost), nothing is added twice and nothing fails.
func TestRecordRequestsBatchOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		var batch []store.LoggedRequest
		for i := range 5 {
			id := fmt.Sprintf("req_batch_%d", i)
			batch = append(batch, store.LoggedRequest{
				Request: store.RequestRecord{ID: id, ThreadID: "tb", Transport: "ws", Path: "/x", Status: 200, StartedAt: start, OutputTokens: int64(i)},
				Attempts: []store.Attempt{
					{ID: id + "_a1", RequestID: id, Seq: 1, AccountID: "acc_a", Class: "server", Action: "next_account", StartedAt: start, EndedAt: start},
					{ID: id + "_a2", RequestID: id, Seq: 2, AccountID: "acc_b", Class: "ok", Action: "done", StartedAt: start, EndedAt: start},
				}})
		}
		require.NoError(t, s.RecordRequests(ctx, batch))
		require.NoError(t, s.RecordRequests(ctx, batch), "written again")
		rows, total, err := s.Requests(ctx, store.RequestFilter{ThreadID: "tb"})
		require.NoError(t, err)
		assert.Equal(t, 5, total)
		var out int64
		for _, r := range rows {
			out += r.OutputTokens
		}
		assert.Equal(t, int64(0+1+2+3+4), out)
		_, total, err = s.Attempts(ctx, store.AttemptFilter{ThreadID: ""})
		require.NoError(t, err)
		assert.Equal(t, 10, total)
	})
}

// RequestAttempts pages the requests an attempt filter finds and returns
// each whole: every attempt of a request, matched or not, newest request
// first.
func TestRequestAttemptsAreWholeTimelines(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		var atts []store.Attempt
		for i, req := range []string{"req_a", "req_b", "req_c"} {
			at := start.Add(time.Duration(i) * time.Minute)
			atts = append(atts,
				store.Attempt{RequestID: req, Seq: 1, AccountID: "acc_1", Class: "usage_limit", Action: "next_account", StartedAt: at, EndedAt: at.Add(time.Second)},
				store.Attempt{RequestID: req, Seq: 2, AccountID: "acc_2", Class: "ok", Recovery: "failover", Action: "done", StartedAt: at.Add(time.Second), EndedAt: at.Add(2 * time.Second)})
		}
		atts = append(atts, store.Attempt{RequestID: "req_d", Seq: 1, AccountID: "acc_2", Class: "ok", Action: "done", StartedAt: start.Add(time.Hour), EndedAt: start.Add(time.Hour)})
		require.NoError(t, s.RecordAttempts(ctx, atts))

		got, total, err := s.RequestAttempts(ctx, store.AttemptFilter{Class: "usage_limit", Limit: 2})
		require.NoError(t, err)
		assert.Equal(t, 3, total, "three requests had a usage limit")
		var seen []string
		classes := map[string][]string{}
		for _, a := range got {
			if len(classes[a.RequestID]) == 0 {
				seen = append(seen, a.RequestID)
			}
			classes[a.RequestID] = append(classes[a.RequestID], a.Class)
		}
		assert.Equal(t, []string{"req_c", "req_b"}, seen, "the newest two requests")
		for _, req := range seen {
			assert.ElementsMatch(t, []string{"usage_limit", "ok"}, classes[req], "%s whole", req)
		}
		got, total, err = s.RequestAttempts(ctx, store.AttemptFilter{Class: "usage_limit", Limit: 2, Offset: 2})
		require.NoError(t, err)
		assert.Equal(t, 3, total)
		require.Len(t, got, 2)
		assert.Equal(t, "req_a", got[0].RequestID)
		got, total, err = s.RequestAttempts(ctx, store.AttemptFilter{Class: "quota"})
		require.NoError(t, err)
		assert.Zero(t, total)
		assert.Empty(t, got)
	})
}
