package web

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The console's webhooks page: add one (a refused form shown again as
// sent, without its secret), send it a test event and see the delivery on
// its page, remove it; every form needs its CSRF token.
func TestConsoleWebhooks(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	ctx := context.Background()

	page := body(b.get("/admin/webhooks"))
	assert.Contains(t, page, "No webhooks")
	assert.Contains(t, page, `value="account.needs_login"`)

	rec := b.post("/admin/webhooks", url.Values{"url": {"https://hooks.example.net/x"}, "events": {"pool.exhausted"}, "format": {"json"}, "secret": {"typed-secret"}, "_csrf": {""}})
	assert.Equal(t, http.StatusForbidden, rec.Code, "no CSRF token, no webhook")

	rec = b.post("/admin/webhooks", url.Values{"url": {"https://hooks.example.net/x"}, "events": {"pool.exhausted"}, "format": {"json"}})
	require.Equal(t, http.StatusBadRequest, rec.Code)
	page = body(rec)
	assert.Contains(t, page, "secret: required for the json format")
	assert.Contains(t, page, `value="https://hooks.example.net/x"`)

	rec = b.post("/admin/webhooks", url.Values{"url": {"https://hooks.example.net/x"}, "events": {"pool.exhausted", "account.needs_login"}, "format": {"json"}, "secret": {"typed-secret"}})
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	ws, err := s.Webhooks(ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	assert.Equal(t, []string{"pool.exhausted", "account.needs_login"}, ws[0].Events)
	page = body(b.get("/admin/webhooks"))
	assert.Contains(t, page, "https://hooks.example.net/x")
	assert.Contains(t, page, "none yet")
	assert.NotContains(t, page, "typed-secret")

	rec = b.post("/admin/webhooks/"+ws[0].ID+"/test", nil)
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	page = body(b.get(webhookURL(ws[0].ID)))
	assert.Contains(t, page, "Sent a test event")
	assert.Contains(t, page, "webhook.test")
	assert.Contains(t, page, "pending")

	rec = b.post("/admin/webhooks/"+ws[0].ID+"/remove", nil)
	require.Equal(t, http.StatusSeeOther, rec.Code)
	ws, err = s.Webhooks(ctx)
	require.NoError(t, err)
	assert.Empty(t, ws)
	assert.Equal(t, http.StatusNotFound, b.get(webhookURL("whk_nope")).Code)
}
