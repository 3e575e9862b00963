package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// usageIDs reads the thread ids of the rows f selects, in the order given.
func usageIDs(t *testing.T, s *store.Store, f store.UsageFilter) []string {
	t.Helper()
	var out []string
	require.NoError(t, s.EachUsageRow(context.Background(), f, func(r store.UsageRow) error {
		out = append(out, r.ThreadID)
		return nil
	}))
	return out
}

func TestEachUsageRow(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		full := store.RequestRecord{ID: "req_full", ClientKeyID: "key_a", AccountID: "acc_1", ThreadID: "t_full",
			Transport: "http", Path: "/v1/responses", Model: "gpt-alias", ModelServed: "gpt-5.5", ServiceTier: "priority",
			Status: 200, StartedAt: t0.Add(1500 * time.Millisecond), FirstEvent: 80 * time.Millisecond,
			FirstOutput: 250 * time.Millisecond, Duration: 3 * time.Second, InputTokens: 1000, CachedTokens: 600,
			OutputTokens: 40, ReasoningTokens: 12, TotalTokens: 1040, CostNanos: 1_234_567, Charged: true}
		recs := []store.RequestRecord{
			full,
			// From is inclusive: exactly at t0.
			{ThreadID: "t_at_from", ClientKeyID: "key_b", AccountID: "acc_2", Model: "gpt-5.4", Transport: "ws", Path: "/x",
				Status: 429, ErrorCode: "usage_limit_reached", StartedAt: t0},
			{ThreadID: "t_before", ClientKeyID: "key_a", Model: "m", Transport: "ws", Path: "/x", Status: 200,
				StartedAt: t0.Add(-time.Millisecond)},
			// To is exclusive.
			{ThreadID: "t_at_to", ClientKeyID: "key_a", Model: "m", Transport: "ws", Path: "/x", Status: 200,
				StartedAt: t0.Add(time.Hour)},
			{ThreadID: "t_last", ClientKeyID: "key_b", AccountID: "acc_1", Model: "gpt-5.5", Transport: "ws", Path: "/x",
				Status: 499, StartedAt: t0.Add(time.Hour - time.Millisecond)},
		}
		for _, r := range recs {
			require.NoError(t, s.RecordRequest(ctx, r, nil))
		}
		window := store.UsageFilter{From: t0, To: t0.Add(time.Hour)}

		var got []store.UsageRow
		require.NoError(t, s.EachUsageRow(ctx, window, func(r store.UsageRow) error {
			got = append(got, r)
			return nil
		}))
		require.Len(t, got, 3, "from inclusive, to exclusive")
		assert.Equal(t, []string{"t_at_from", "t_full", "t_last"}, []string{got[0].ThreadID, got[1].ThreadID, got[2].ThreadID},
			"oldest first")
		out := int64(250)
		ev := int64(80)
		assert.Equal(t, store.UsageRow{StartedAt: t0.Add(1500 * time.Millisecond), KeyID: "key_a", AccountID: "acc_1",
			ThreadID: "t_full", Model: "gpt-alias", ModelServed: "gpt-5.5", ServiceTier: "priority", Status: 200,
			InputTokens: 1000, CachedTokens: 600, OutputTokens: 40, ReasoningTokens: 12, TotalTokens: 1040,
			CostNanos: 1_234_567, Charged: true, FirstEventMS: &ev, FirstOutputMS: &out, DurationMS: 3000}, got[1],
			"every column is read")
		assert.Nil(t, got[0].FirstOutputMS, "no output: null, not zero")
		assert.Nil(t, got[0].FirstEventMS)
		assert.Equal(t, "usage_limit_reached", got[0].ErrorCode)
		assert.Equal(t, 429, got[0].Status)

		for _, tc := range []struct {
			name string
			f    store.UsageFilter
			want []string
		}{
			{"no bounds", store.UsageFilter{}, []string{"t_before", "t_at_from", "t_full", "t_last", "t_at_to"}},
			{"from only", store.UsageFilter{From: t0.Add(time.Second)}, []string{"t_full", "t_last", "t_at_to"}},
			{"to only", store.UsageFilter{To: t0.Add(time.Second)}, []string{"t_before", "t_at_from"}},
			{"key", store.UsageFilter{KeyID: "key_b"}, []string{"t_at_from", "t_last"}},
			{"account", store.UsageFilter{AccountID: "acc_1"}, []string{"t_full", "t_last"}},
			{"thread", store.UsageFilter{ThreadID: "t_full"}, []string{"t_full"}},
			{"model served", store.UsageFilter{Model: "gpt-5.5"}, []string{"t_full", "t_last"}},
			{"model asked", store.UsageFilter{Model: "gpt-alias"}, []string{"t_full"}},
			{"filters combine", store.UsageFilter{From: t0, To: t0.Add(time.Hour), KeyID: "key_a", Model: "gpt-5.5"}, []string{"t_full"}},
			{"nothing matches", store.UsageFilter{KeyID: "key_none"}, nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				assert.Equal(t, tc.want, usageIDs(t, s, tc.f))
			})
		}

		// An error from fn stops the iteration at once and comes back as is.
		stop := errors.New("stop")
		calls := 0
		err := s.EachUsageRow(ctx, store.UsageFilter{}, func(store.UsageRow) error {
			calls++
			return stop
		})
		assert.ErrorIs(t, err, stop)
		assert.Equal(t, 1, calls)

		// A cancelled context fails the read.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		assert.Error(t, s.EachUsageRow(cctx, store.UsageFilter{}, func(store.UsageRow) error { return nil }))
	})
}
