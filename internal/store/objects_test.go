package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

// Objects: recorded once per scope and id (the first record stands), read
// only in their scope and before their expiry, listed by thread, settled
// exactly once, deleted, and swept once expired.
func TestObjects(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		t0 := clk.Now()
		f := store.Object{Scope: "sc1", ID: "file-1", Kind: store.ObjectFile, AccountID: "a", Organization: "org-1",
			ClientKeyID: "k1", ThreadKey: "th1", RequestID: "req1", Created: t0, Expires: t0.Add(time.Hour)}
		require.NoError(t, s.PutObject(ctx, f))
		moved := f
		moved.AccountID = "b"
		require.NoError(t, s.PutObject(ctx, moved), "a retry is no error")
		resp := store.Object{Scope: "sc1", ID: "resp_1", Kind: store.ObjectResponse, AccountID: "b", ThreadKey: "th1", Created: t0.Add(time.Second)}
		require.NoError(t, s.PutObject(ctx, resp))
		require.NoError(t, s.PutObject(ctx, store.Object{Scope: "sc2", ID: "file-1", Kind: store.ObjectFile, AccountID: "c", Created: t0}),
			"the same id in another scope is another record")
		assert.Error(t, s.PutObject(ctx, store.Object{Scope: "sc1", ID: "x", Kind: store.ObjectFile}), "an object without an account")

		got, err := s.Object(ctx, "sc1", "file-1", t0)
		require.NoError(t, err)
		assert.Equal(t, f, got, "the first record stands")
		got, err = s.Object(ctx, "sc2", "file-1", t0)
		require.NoError(t, err)
		assert.Equal(t, "c", got.AccountID)
		_, err = s.Object(ctx, "sc3", "file-1", t0)
		assert.ErrorIs(t, err, store.ErrNotFound, "another scope never sees it")
		_, err = s.Object(ctx, "sc1", "file-1", t0.Add(time.Hour))
		assert.ErrorIs(t, err, store.ErrNotFound, "expired")

		list, err := s.Objects(ctx, store.ObjectFilter{ThreadKey: "th1"})
		require.NoError(t, err)
		require.Len(t, list, 2)
		assert.Equal(t, []string{"resp_1", "file-1"}, []string{list[0].ID, list[1].ID}, "newest first")
		list, err = s.Objects(ctx, store.ObjectFilter{Scope: "sc1", Kind: store.ObjectFile})
		require.NoError(t, err)
		require.Len(t, list, 1)

		ok, err := s.SettleObject(ctx, "sc1", "resp_1", t0.Add(time.Minute))
		require.NoError(t, err)
		assert.True(t, ok, "the first settle")
		ok, err = s.SettleObject(ctx, "sc1", "resp_1", t0.Add(2*time.Minute))
		require.NoError(t, err)
		assert.False(t, ok, "settled once only")
		got, err = s.Object(ctx, "sc1", "resp_1", t0)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(time.Minute), got.Settled)

		require.NoError(t, s.DeleteObject(ctx, "sc1", "resp_1"))
		require.NoError(t, s.DeleteObject(ctx, "sc1", "resp_1"), "deleting twice is no error")
		_, err = s.Object(ctx, "sc1", "resp_1", t0)
		assert.ErrorIs(t, err, store.ErrNotFound)

		n, err := s.DeleteExpiredObjects(ctx, t0.Add(time.Hour))
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "file-1 in sc1 expired; the one without an expiry stays")
		_, err = s.Object(ctx, "sc2", "file-1", t0.Add(48*time.Hour))
		assert.NoError(t, err)
	})
}

// A request log row keeps its route and the object it named.
func TestRequestRoute(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_r1", StartedAt: clk.Now(), Route: "files.get", ObjectID: "file-9", Status: 200}))
		got, err := s.Request(ctx, "req_r1")
		require.NoError(t, err)
		assert.Equal(t, "files.get", got.Route)
		assert.Equal(t, "file-9", got.ObjectID)
	})
}
