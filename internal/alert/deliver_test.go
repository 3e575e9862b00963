package alert

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

type hit struct {
	url    string
	header http.Header
	body   []byte
}

// recorder is a loopback server handing each request it gets to hits and
// answering 204.
func recorder(t *testing.T) (*httptest.Server, chan hit) {
	hits := make(chan hit, 16)
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
		select {
		case hits <- hit{url: r.URL.String(), header: r.Header.Clone(), body: b}:
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	return srv, hits
}

func waitHit(t *testing.T, hits chan hit) hit {
	t.Helper()
	select {
	case h := <-hits:
		return h
	case <-time.After(30 * time.Second):
		require.FailNow(t, "no request within 30s")
		return hit{}
	}
}

// runDeliverer runs a Deliverer on st until the test ends.
func runDeliverer(t *testing.T, cfg DelivererConfig) *Deliverer {
	cfg.Replica, cfg.Poll = "r1", 10*time.Millisecond
	d := NewDeliverer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return d
}

func enqueue(t *testing.T, st *store.Store, format, rawURL string) (store.Webhook, store.AlertEvent) {
	t.Helper()
	w, err := st.CreateWebhook(context.Background(), store.Webhook{URL: rawURL, Events: []string{PoolExhausted}, Format: format}, "the-secret")
	require.NoError(t, err)
	ev, err := TestEvent(w.ID, time.Now())
	require.NoError(t, err)
	require.NoError(t, st.EnqueueEvent(context.Background(), ev, w.ID))
	return w, ev
}

// Deliveries go through the configured egress: a receiver only the proxy
// can reach gets the event, signed, in the webhook's format.
func TestDeliveryThroughEgress(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	proxy, hits := recorder(t)
	pu, err := url.Parse(proxy.URL)
	require.NoError(t, err)
	runDeliverer(t, DelivererConfig{Store: st, Proxy: http.ProxyURL(pu)})

	_, ev := enqueue(t, st, FormatJSON, "http://receiver.invalid/hook")
	h := waitHit(t, hits)
	assert.Equal(t, "http://receiver.invalid/hook", h.url, "sent to the proxy, for the receiver")
	assert.JSONEq(t, string(ev.Payload), string(h.body))
	assert.True(t, Verify("the-secret", h.body, h.header.Get(SignatureHeader)))
	assert.Equal(t, ev.ID, h.header.Get("X-Codex-Relay-Event-Id"))

	enqueue(t, st, FormatSlack, "http://receiver.invalid/slack")
	h = waitHit(t, hits)
	var slack map[string]string
	require.NoError(t, json.Unmarshal(h.body, &slack))
	assert.Contains(t, slack["text"], "webhook.test")
	assert.Len(t, slack, 1, "Slack's shape: text alone")
	assert.True(t, Verify("the-secret", h.body, h.header.Get(SignatureHeader)))
}

// A webhook at the relay's own admin routes is never called, even when
// stored; nor is a redirect followed.
func TestDeliveryRefusesTheRelaysOwnRoutes(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	self, hits := recorder(t)
	selfURL, err := url.Parse(self.URL)
	require.NoError(t, err)
	runDeliverer(t, DelivererConfig{Store: st, Self: []string{selfURL.Host}, Schedule: []time.Duration{}})

	w, _ := enqueue(t, st, FormatJSON, self.URL+"/api/v1/accounts")
	var ds []store.Delivery
	require.Eventually(t, func() bool {
		ds, err = st.Deliveries(context.Background(), w.ID, 10)
		return err == nil && len(ds) == 1 && ds[0].Status == store.DeliveryFailed
	}, 30*time.Second, 10*time.Millisecond)
	assert.Contains(t, ds[0].LastError, "the relay's own api routes")
	assert.Equal(t, 1, ds[0].Attempts, "no schedule: one try")
	select {
	case h := <-hits:
		t.Fatalf("the relay's own route was called: %s", h.url)
	default:
	}
}

func TestRefuseSelf(t *testing.T) {
	self := []string{"127.0.0.1:2455", "0.0.0.0:8080"}
	for _, c := range []struct {
		url     string
		refused bool
	}{
		{"http://127.0.0.1:2455/api/v1/accounts", true},
		{"http://localhost:2455/admin/", true},
		{"http://LOCALHOST:2455/ADMIN", true},
		{"http://[::1]:2455/api", true},
		{"http://127.0.0.1:2455/hooks", false},
		{"http://127.0.0.1:2456/api/v1", false},
		{"http://127.0.0.1:8080/api/v1", true},
		{"http://hooks.example.net:8080/api/v1", false},
		{"http://127.0.0.1:2455/apix", false},
	} {
		u, err := url.Parse(c.url)
		require.NoError(t, err)
		assert.Equal(t, c.refused, RefuseSelf(u, self) != nil, c.url)
	}
}
