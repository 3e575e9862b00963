package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// receiver is a webhook receiver on loopback: every delivery it gets goes
// to got, and the first failFirst are answered 503.
type receiver struct {
	srv       *httptest.Server
	got       chan delivered
	done      chan struct{} // closed as the test ends: a handler no longer waits to hand over
	failFirst atomic.Int32
	calls     atomic.Int32
}

type delivered struct {
	header http.Header
	body   []byte
	event  alert.Event
	status int // what the receiver answered
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{got: make(chan delivered, 64), done: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		d := delivered{header: req.Header.Clone(), body: body, status: http.StatusNoContent}
		_ = json.Unmarshal(body, &d.event)
		if r.calls.Add(1) <= r.failFirst.Load() {
			d.status = http.StatusServiceUnavailable
		}
		w.WriteHeader(d.status)
		select {
		case r.got <- d:
		case <-r.done:
		}
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { close(r.done) })
	return r
}

// next waits for the receiver's next delivery.
func (r *receiver) next(t *testing.T) delivered {
	t.Helper()
	select {
	case d := <-r.got:
		return d
	case <-time.After(30 * time.Second):
		require.FailNow(t, "no webhook delivery within 30s")
		return delivered{}
	}
}

// fastAlerts are alert loops that check and deliver at once, with a
// retry schedule of milliseconds (the real one is TestDefaultSchedule's).
func fastAlerts() *alert.Options {
	ms := time.Millisecond
	return &alert.Options{Interval: 10 * ms, Poll: 10 * ms, Schedule: []time.Duration{ms, ms, ms, ms, ms}, Timeout: 5 * time.Second}
}

// runRelay runs the relay's background loops (alerts among them) until
// the test ends.
func runRelay(t *testing.T, rl *relay.Server) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rl.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func addWebhook(t *testing.T, st *store.Store, url, secret string, events ...string) store.Webhook {
	t.Helper()
	w, err := st.CreateWebhook(context.Background(), store.Webhook{URL: url, Events: events, Format: alert.FormatJSON}, secret)
	require.NoError(t, err)
	return w
}

// An account whose refresh token is refused fires account.needs_login
// once, signed with the webhook's secret and saying how to log in again;
// a new login clears it, and the clear is the next event.
func TestAlertNeedsLoginOnceAndCleared(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	h := newHarnessWith(t, func(h *harness, c *relay.Config) { withRefresher(h, c); c.Alerts = fastAlerts() },
		simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	addWebhook(t, h.store, rcv.srv.URL+"/hook", "hook-secret", alert.AccountNeedsLogin)
	runRelay(t, h.relay)

	// a1 holds a stale access token and a refresh token the auth server
	// refuses; the request is served by a2.
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a1"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-revoked"}, time.Time{}))
	h.setUsed("a2", 90)
	resp, body := h.post(sessionS, rootT, responseRequest("hello"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, store.StatusReauthRequired, statusOf(t, h, "a1"))

	d := rcv.next(t)
	assert.True(t, alert.Verify("hook-secret", d.body, d.header.Get(alert.SignatureHeader)), "signed with the webhook's secret")
	assert.False(t, alert.Verify("another", d.body, d.header.Get(alert.SignatureHeader)))
	assert.Equal(t, alert.AccountNeedsLogin, d.event.Type)
	assert.Equal(t, h.ids["a1"], d.event.Subject["account_id"])
	assert.Equal(t, alert.Fired, d.event.Data["state"])
	assert.Contains(t, d.event.Data["login"], "codex-relay accounts login", "the event says how to log in again")
	assert.NotEmpty(t, d.event.ID)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(d.body, &raw))
	assert.ElementsMatch(t, []string{"id", "type", "at", "subject", "data"}, fieldNames(raw), "the generic event's shape")

	// A new login: the account serves again, and the condition clears.
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a1"], store.Credentials{AccessToken: "at-a1", RefreshToken: "rt-a1"}, time.Time{}))
	_, err := h.store.SetAccountStatus(ctx, h.ids["a1"], store.StatusActive, "signed in again", time.Time{})
	require.NoError(t, err)
	c := rcv.next(t)
	assert.Equal(t, alert.AccountNeedsLogin, c.event.Type, "the next event is the clear: the condition fired once")
	assert.Equal(t, alert.Cleared, c.event.Data["state"])
	assert.Equal(t, h.ids["a1"], c.event.Subject["account_id"])
	assert.NotEqual(t, d.event.ID, c.event.ID)
	assert.EqualValues(t, 2, rcv.calls.Load())
}

func fieldNames(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A receiver that fails three times gets the event on the fourth try,
// the same event (id and body) every time, and the delivery records its
// four tries.
func TestAlertRetriedUntilDelivered(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	rcv.failFirst.Store(3)
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Alerts = fastAlerts() }, simAccount("a1", "org-a"))
	ctx := context.Background()
	w := addWebhook(t, h.store, rcv.srv.URL, "s", alert.AccountExhausted)
	runRelay(t, h.relay)

	resets := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	_, err := h.store.SetAccountStatus(ctx, h.ids["a1"], store.StatusRateLimited, "usage limit reached", resets)
	require.NoError(t, err)
	var tries []delivered
	for range 4 {
		tries = append(tries, rcv.next(t))
	}
	for i, d := range tries {
		assert.Equal(t, tries[0].event.ID, d.event.ID, "try %d carries the same event id", i+1)
		assert.Equal(t, string(tries[0].body), string(d.body), "and the same body")
		assert.Equal(t, fmt.Sprint(i+1), d.header.Get("X-Codex-Relay-Attempt"))
	}
	assert.Equal(t, []int{503, 503, 503, 204}, []int{tries[0].status, tries[1].status, tries[2].status, tries[3].status})
	assert.Equal(t, alert.AccountExhausted, tries[3].event.Type)
	assert.Equal(t, resets.Format(time.RFC3339Nano), tries[3].event.Data["resets_at"])

	require.Eventually(t, func() bool {
		ds, err := h.store.Deliveries(ctx, w.ID, 10)
		return err == nil && len(ds) == 1 && ds[0].Status == store.DeliveryDelivered
	}, 30*time.Second, 10*time.Millisecond)
	ds, err := h.store.Deliveries(ctx, w.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, 4, ds[0].Attempts)
	assert.Equal(t, http.StatusNoContent, ds[0].LastStatusCode)
}

// A key's limit fires key.limit_threshold at 80% and again at 100% of its
// window, each once, with the threshold and the key's id.
func TestAlertKeyLimitThresholds(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Alerts = fastAlerts() }, simAccount("a1", "org-a"))
	ctx := context.Background()
	w := addWebhook(t, h.store, rcv.srv.URL, "s", alert.KeyLimitThreshold, alert.AccountExhausted)
	runRelay(t, h.relay)
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "five a day",
		Limits: []budget.Limit{{Metric: budget.Requests, Window: budget.Day, Max: 5}}})
	require.NoError(t, err)

	spend := func(n int) {
		for i := range n {
			resp, body := h.post(sessionS, "", spendRequest(fmt.Sprint("spend ", i)), bearer(secret))
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
		}
	}
	spend(4)
	d := rcv.next(t)
	assert.Equal(t, alert.KeyLimitThreshold, d.event.Type)
	assert.Equal(t, k.ID, d.event.Subject["key_id"])
	assert.EqualValues(t, 80, d.event.Data["threshold"])
	assert.Equal(t, "requests/day", d.event.Data["limit"])
	spend(1)
	d = rcv.next(t)
	assert.Equal(t, alert.KeyLimitThreshold, d.event.Type)
	assert.EqualValues(t, 100, d.event.Data["threshold"])

	// A later event as a barrier: the watcher has checked the key since,
	// and recorded no other threshold event.
	_, err = h.store.SetAccountStatus(ctx, h.ids["a1"], store.StatusRateLimited, "usage limit reached", time.Now().Add(time.Hour))
	require.NoError(t, err)
	d = rcv.next(t)
	assert.Equal(t, alert.AccountExhausted, d.event.Type)
	ds, err := h.store.Deliveries(ctx, w.ID, 10)
	require.NoError(t, err)
	var types []string
	for _, x := range ds {
		types = append(types, x.EventType)
	}
	assert.ElementsMatch(t, []string{alert.KeyLimitThreshold, alert.KeyLimitThreshold, alert.AccountExhausted}, types, "80 and 100 once each")
}

// Two replicas watching one database deliver one event per change, the
// fired one and then its clear, not one per replica.
func TestAlertReplicasDeliverOnce(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	dbURL, _, setup := replicaDatabase(t, "a1")
	w := addWebhook(t, setup, rcv.srv.URL, "s", alert.AccountNeedsLogin)
	startReplicaWith(t, dbURL, "replica-a", replicaOptions{alerts: fastAlerts()})
	startReplicaWith(t, dbURL, "replica-b", replicaOptions{alerts: fastAlerts()})
	ctx := context.Background()
	accts, err := setup.Accounts(ctx)
	require.NoError(t, err)
	id := accts[0].ID

	_, err = setup.SetAccountStatus(ctx, id, store.StatusReauthRequired, "token refresh rejected: invalid_grant", time.Time{})
	require.NoError(t, err)
	fired := rcv.next(t)
	assert.Equal(t, alert.Fired, fired.event.Data["state"])
	_, err = setup.SetAccountStatus(ctx, id, store.StatusActive, "signed in again", time.Time{})
	require.NoError(t, err)
	cleared := rcv.next(t)
	assert.Equal(t, alert.Cleared, cleared.event.Data["state"], "the clear came next: the fired event was delivered once")
	// Each try is recorded after its answer: wait for the second's.
	var ds []store.Delivery
	require.Eventually(t, func() bool {
		ds, err = setup.Deliveries(ctx, w.ID, 10)
		return err == nil && len(ds) == 2 && ds[0].Status == store.DeliveryDelivered && ds[1].Status == store.DeliveryDelivered
	}, 30*time.Second, 10*time.Millisecond)
	require.Len(t, ds, 2, "one delivery per change")
	for _, d := range ds {
		assert.Equal(t, 1, d.Attempts)
	}
	assert.EqualValues(t, 2, rcv.calls.Load())
}

// An account whose attempts of the last five minutes mostly failed fires
// upstream.errors; once those attempts are older than the window, it
// clears.
func TestAlertUpstreamErrors(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	clk := newTestClock(time.Now())
	h := newHarnessWith(t, func(_ *harness, c *relay.Config) { c.Now = clk.Now; c.Alerts = fastAlerts() }, simAccount("a1", "org-a"))
	ctx := context.Background()
	addWebhook(t, h.store, rcv.srv.URL, "s", alert.UpstreamErrors)
	runRelay(t, h.relay)

	var atts []store.Attempt
	for i := range 12 {
		class := "server"
		if i%4 == 0 {
			class = "ok"
		}
		at := clk.Now().Add(-time.Duration(i) * time.Second)
		atts = append(atts, store.Attempt{RequestID: fmt.Sprint("req_", i), AccountID: h.ids["a1"], Class: class, StartedAt: at, EndedAt: at})
	}
	require.NoError(t, h.store.RecordAttempts(ctx, atts))
	d := rcv.next(t)
	assert.Equal(t, alert.UpstreamErrors, d.event.Type)
	assert.Equal(t, alert.Fired, d.event.Data["state"])
	assert.Equal(t, h.ids["a1"], d.event.Subject["account_id"])
	// The attempts are written one by one: the watcher may have counted
	// from the tenth on, when the share passed the threshold already.
	attempts, _ := d.event.Data["attempts"].(float64)
	failed, _ := d.event.Data["failed"].(float64)
	assert.True(t, attempts >= 10 && attempts <= 12, "attempts %v", attempts)
	assert.GreaterOrEqual(t, failed, attempts/2, "failed %v of %v", failed, attempts)

	clk.Add(alert.ErrorWindow + time.Second)
	d = rcv.next(t)
	assert.Equal(t, alert.UpstreamErrors, d.event.Type)
	assert.Equal(t, alert.Cleared, d.event.Data["state"])
}

// A replica whose heartbeat lapses without a clean stop (here: one that
// renews its row once an hour) is recorded as departed by the replica that
// finds it gone, which fires replica.lost once; a replica started after it
// takes its place, and the clear follows. A clean stop is no loss.
func TestAlertReplicaLost(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t)
	dbURL, _, setup := replicaDatabase(t, "a1")
	addWebhook(t, setup, rcv.srv.URL, "s", alert.ReplicaLost)
	clean := startReplicaWith(t, dbURL, "replica-clean", replicaOptions{})
	clean.stop() // a clean stop deletes its row: no departure
	startReplicaWith(t, dbURL, "replica-lapsing", replicaOptions{heartbeat: time.Hour})
	startReplicaWith(t, dbURL, "replica-a", replicaOptions{alerts: fastAlerts()})

	fired := rcv.next(t)
	assert.Equal(t, alert.ReplicaLost, fired.event.Type)
	assert.Equal(t, alert.Fired, fired.event.Data["state"])
	assert.Equal(t, "replica-lapsing", fired.event.Subject["name"])
	assert.True(t, alert.Verify("s", fired.body, fired.header.Get(alert.SignatureHeader)), "signed")

	startReplicaWith(t, dbURL, "replica-b", replicaOptions{})
	cleared := rcv.next(t)
	assert.Equal(t, alert.ReplicaLost, cleared.event.Type)
	assert.Equal(t, alert.Cleared, cleared.event.Data["state"], "its place was taken")
	assert.Equal(t, "replica-lapsing", cleared.event.Subject["name"])
	assert.EqualValues(t, 2, rcv.calls.Load(), "the clean stop fired nothing")
}
