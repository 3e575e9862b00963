package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
)

// A webhook's row keeps its secret sealed and readable only through
// WebhookSecret; deleting it takes its deliveries along.
func TestWebhooks(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		w, err := s.CreateWebhook(ctx, store.Webhook{URL: "http://127.0.0.1:9/hook", Events: []string{"account.needs_login", " pool.exhausted"}, Format: "json"}, "s3cret")
		require.NoError(t, err)
		assert.Equal(t, []string{"account.needs_login", "pool.exhausted"}, w.Events)
		list, err := s.Webhooks(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, w, list[0])
		sec, err := s.WebhookSecret(ctx, w.ID)
		require.NoError(t, err)
		assert.Equal(t, "s3cret", sec)

		require.NoError(t, s.EnqueueEvent(ctx, event("evt_1", "webhook.test", clk.Now()), w.ID))
		ds, err := s.Deliveries(ctx, w.ID, 10)
		require.NoError(t, err)
		require.Len(t, ds, 1)

		_, err = s.DeleteWebhook(ctx, w.ID)
		require.NoError(t, err)
		_, err = s.DeleteWebhook(ctx, w.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		_, err = s.Webhook(ctx, w.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		claimed, err := s.ClaimDeliveries(ctx, "r1", time.Minute, 10)
		require.NoError(t, err)
		assert.Empty(t, claimed, "a deleted webhook's deliveries went with it")
	})
}

func event(id, typ string, at time.Time) store.AlertEvent {
	return store.AlertEvent{ID: id, Type: typ, SubjectKey: "acc_1", At: at, State: "fired", Payload: json.RawMessage(`{"id":"` + id + `"}`)}
}

// Of two writers moving a condition from the same version, one wins and
// records the event; the event goes to the webhooks that asked for its
// type, enabled ones only.
func TestAlertTransitionsAndClaims(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		asked, err := s.CreateWebhook(ctx, store.Webhook{URL: "http://127.0.0.1:9/a", Events: []string{"account.needs_login"}, Format: "json"}, "a")
		require.NoError(t, err)
		_, err = s.CreateWebhook(ctx, store.Webhook{URL: "http://127.0.0.1:9/b", Events: []string{"pool.exhausted"}, Format: "slack"}, "b")
		require.NoError(t, err)
		_, err = s.CreateWebhook(ctx, store.Webhook{URL: "http://127.0.0.1:9/c", Events: []string{"account.needs_login"}, Format: "json", Disabled: true}, "c")
		require.NoError(t, err)

		next := store.AlertState{Type: "account.needs_login", SubjectKey: "acc_1", Firing: true, FiredAt: clk.Now(), Subject: json.RawMessage(`{"account_id":"acc_1"}`)}
		ev := event("evt_1", "account.needs_login", clk.Now())
		won, err := s.TransitionAlert(ctx, 0, next, &ev)
		require.NoError(t, err)
		assert.True(t, won)
		ev2 := event("evt_2", "account.needs_login", clk.Now())
		won, err = s.TransitionAlert(ctx, 0, next, &ev2)
		require.NoError(t, err)
		assert.False(t, won, "the second writer of the same change loses")

		states, err := s.AlertStates(ctx)
		require.NoError(t, err)
		require.Len(t, states, 1)
		assert.True(t, states[0].Firing)
		assert.EqualValues(t, 1, states[0].Version)
		assert.JSONEq(t, `{"account_id":"acc_1"}`, string(states[0].Subject))
		assert.JSONEq(t, `{}`, string(states[0].Data))

		c1, err := s.ClaimDeliveries(ctx, "r1", time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, c1, 1, "one delivery: to the enabled webhook that asked for the type")
		assert.Equal(t, asked.ID, c1[0].Webhook.ID)
		assert.Equal(t, "evt_1", c1[0].EventID)
		assert.JSONEq(t, `{"id":"evt_1"}`, string(c1[0].Payload))
		c2, err := s.ClaimDeliveries(ctx, "r2", time.Minute, 10)
		require.NoError(t, err)
		assert.Empty(t, c2, "claimed by r1 under a live lease")

		// A failed try is due again at its next time, for whoever claims it.
		require.NoError(t, s.FinishDelivery(ctx, c1[0].ID, "r1", store.DeliveryResult{StatusCode: 500, Latency: 12 * time.Millisecond, Err: "500", Next: clk.Now().Add(5 * time.Second)}))
		c2, err = s.ClaimDeliveries(ctx, "r2", time.Minute, 10)
		require.NoError(t, err)
		assert.Empty(t, c2, "not due yet")
		clk.Add(5 * time.Second)
		c2, err = s.ClaimDeliveries(ctx, "r2", time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, c2, 1)
		assert.Equal(t, 1, c2[0].Attempts)

		// A lease that ran out is claimed again; its old holder's finish
		// then records nothing.
		clk.Add(time.Minute + time.Millisecond)
		c3, err := s.ClaimDeliveries(ctx, "r3", time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, c3, 1)
		require.NoError(t, s.FinishDelivery(ctx, c2[0].ID, "r2", store.DeliveryResult{Delivered: true, StatusCode: 200}))
		require.NoError(t, s.FinishDelivery(ctx, c3[0].ID, "r3", store.DeliveryResult{Delivered: true, StatusCode: 204, Latency: 3 * time.Millisecond}))
		ds, err := s.Deliveries(ctx, asked.ID, 10)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		assert.Equal(t, store.DeliveryDelivered, ds[0].Status)
		assert.Equal(t, 2, ds[0].Attempts)
		assert.Equal(t, 204, ds[0].LastStatusCode)
		assert.Equal(t, 3*time.Millisecond, ds[0].LastLatency)
		assert.Equal(t, "account.needs_login", ds[0].EventType)

		// The clear moves the condition from version 1.
		cleared := next
		cleared.Firing = false
		won, err = s.TransitionAlert(ctx, 1, cleared, nil)
		require.NoError(t, err)
		assert.True(t, won)
		won, err = s.TransitionAlert(ctx, 1, cleared, nil)
		require.NoError(t, err)
		assert.False(t, won)
	})
}

// Attempts are counted by account and class within the window; attempts
// on no account are left out.
func TestAttemptCounts(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		t0 := clk.Now()
		at := func(acc, class string, ago time.Duration) store.Attempt {
			return store.Attempt{RequestID: "req", AccountID: acc, Class: class, StartedAt: t0.Add(-ago), EndedAt: t0.Add(-ago)}
		}
		require.NoError(t, s.RecordAttempts(ctx, []store.Attempt{
			at("acc_a", "server", time.Minute), at("acc_a", "server", 2*time.Minute), at("acc_a", "ok", time.Minute),
			at("acc_a", "server", 10*time.Minute), at("acc_b", "ok", time.Second), at("", "no_account", time.Second),
		}))
		got, err := s.AttemptCounts(ctx, t0.Add(-5*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, []store.AttemptCount{{AccountID: "acc_a", Class: "ok", N: 1}, {AccountID: "acc_a", Class: "server", N: 2}, {AccountID: "acc_b", Class: "ok", N: 1}}, got)
	})
}

// Finished deliveries past the retention go, with their events; pending
// ones stay whatever their age.
func TestDeleteAlertHistory(t *testing.T) {
	eachWithClock(t, func(t *testing.T, s *store.Store, clk *clock) {
		ctx := context.Background()
		w, err := s.CreateWebhook(ctx, store.Webhook{URL: "http://127.0.0.1:9/a", Events: []string{"pool.exhausted"}, Format: "json"}, "a")
		require.NoError(t, err)
		require.NoError(t, s.EnqueueEvent(ctx, event("evt_old", "webhook.test", clk.Now()), w.ID))
		require.NoError(t, s.EnqueueEvent(ctx, event("evt_pending", "webhook.test", clk.Now()), w.ID))
		c, err := s.ClaimDeliveries(ctx, "r1", time.Minute, 1)
		require.NoError(t, err)
		require.Len(t, c, 1)
		require.NoError(t, s.FinishDelivery(ctx, c[0].ID, "r1", store.DeliveryResult{Delivered: true, StatusCode: 200}))
		clk.Add(48 * time.Hour)
		n, err := s.DeleteAlertHistoryBefore(ctx, clk.Now().Add(-24*time.Hour))
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		ds, err := s.Deliveries(ctx, w.ID, 10)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		assert.Equal(t, store.DeliveryPending, ds[0].Status)
		assert.NotEqual(t, c[0].ID, ds[0].ID)
	})
}
