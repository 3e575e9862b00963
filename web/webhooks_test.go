package web

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The webhooks API: a webhook registered, listed without its secret, sent
// a test event (a pending delivery, due at once) and removed; each change
// audited; wrong input refused with a 400 naming the field.
func TestWebhooksAPI(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newTestServer(t, s)
	kicked := 0
	srv.cfg.KickAlerts = func() { kicked++ }

	for _, c := range []struct {
		name, field string
		body        map[string]any
	}{
		{"no url", "url", map[string]any{"events": []string{"pool.exhausted"}, "secret": "s"}},
		{"not http", "url", map[string]any{"url": "ftp://example.net/x", "events": []string{"pool.exhausted"}, "secret": "s"}},
		{"user info", "url", map[string]any{"url": "https://u:p@example.net/x", "events": []string{"pool.exhausted"}, "secret": "s"}},
		{"the relay's own admin API", "url", map[string]any{"url": "http://example.com/api/v1/accounts", "events": []string{"pool.exhausted"}, "secret": "s"}},
		{"the relay's own console", "url", map[string]any{"url": "http://localhost:80/admin/", "events": []string{"pool.exhausted"}, "secret": "s"}},
		{"no events", "events", map[string]any{"url": "https://example.net/x", "secret": "s"}},
		{"unknown event", "events", map[string]any{"url": "https://example.net/x", "events": []string{"account.gone"}, "secret": "s"}},
		{"unknown format", "format", map[string]any{"url": "https://example.net/x", "events": []string{"pool.exhausted"}, "format": "xml", "secret": "s"}},
		{"json without a secret", "secret", map[string]any{"url": "https://example.net/x", "events": []string{"pool.exhausted"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body, raw := call(t, srv, http.MethodPost, "/api/v1/webhooks", testAdminToken, c.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			assert.Equal(t, c.field, body["error"].(map[string]any)["field"], raw)
		})
	}

	code, created, raw := call(t, srv, http.MethodPost, "/api/v1/webhooks", testAdminToken,
		map[string]any{"url": "https://hooks.example.net/relay", "events": []string{"account.needs_login", "key.limit_threshold"}, "format": "json", "secret": "do-not-show"})
	require.Equal(t, http.StatusCreated, code, raw)
	id, _ := created["id"].(string)
	require.NotEmpty(t, id)
	assert.NotContains(t, raw, "do-not-show")
	sec, err := s.WebhookSecret(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, "do-not-show", sec, "kept, sealed")

	code, list, raw := call(t, srv, http.MethodGet, "/api/v1/webhooks", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	assert.NotContains(t, raw, "do-not-show", "the list never shows the secret")
	hooks := list["webhooks"].([]any)
	require.Len(t, hooks, 1)
	assert.Equal(t, []any{"account.needs_login", "key.limit_threshold"}, hooks[0].(map[string]any)["events"])

	code, sent, raw := call(t, srv, http.MethodPost, "/api/v1/webhooks/"+id+"/test", testAdminToken, nil)
	require.Equal(t, http.StatusAccepted, code, raw)
	assert.NotEmpty(t, sent["event_id"])
	assert.Equal(t, 1, kicked, "the deliverer is woken")
	code, ds, raw := call(t, srv, http.MethodGet, "/api/v1/webhooks/"+id+"/deliveries", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	deliveries := ds["deliveries"].([]any)
	require.Len(t, deliveries, 1)
	d := deliveries[0].(map[string]any)
	assert.Equal(t, sent["event_id"], d["event_id"])
	assert.Equal(t, "webhook.test", d["type"])
	assert.Equal(t, "pending", d["status"])
	assert.EqualValues(t, 0, d["attempts"])

	code, _, raw = call(t, srv, http.MethodDelete, "/api/v1/webhooks/"+id, testAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	for _, path := range []string{"/api/v1/webhooks/" + id + "/deliveries"} {
		code, _, _ = call(t, srv, http.MethodGet, path, testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)
	}
	code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/webhooks/"+id, testAdminToken, nil)
	assert.Equal(t, http.StatusNotFound, code)
	code, _, _ = call(t, srv, http.MethodPost, "/api/v1/webhooks/"+id+"/test", testAdminToken, nil)
	assert.Equal(t, http.StatusNotFound, code)
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/webhooks", "", nil)
	assert.Equal(t, http.StatusUnauthorized, code)

	entries, _, err := s.AuditLog(context.Background(), store.AuditFilter{Limit: 100})
	require.NoError(t, err)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
		assert.NotContains(t, e.Detail, "do-not-show")
	}
	assert.Subset(t, actions, []string{"webhook.create", "webhook.test", "webhook.delete"})
}
