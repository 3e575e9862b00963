package web

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// Probing an account runs the configured probe and is audited; without a
// probe the route says so.
func TestProbeAccount(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "k"}, store.Credentials{APIKey: "sk"})
	require.NoError(t, err)

	srv := newTestServer(t, s)
	code, body, _ := call(t, srv, http.MethodPost, "/api/v1/accounts/"+a.ID+"/probe", testAdminToken, nil)
	assert.Equal(t, http.StatusNotImplemented, code)
	c, _ := errorOf(t, body)
	assert.Equal(t, "probe_unavailable", c)

	var probed []string
	srv.cfg.Probe = func(ctx context.Context, id string) (store.Account, error) {
		probed = append(probed, id)
		return s.SetAccountStatus(ctx, id, store.StatusActive, "probed", time.Time{})
	}
	code, body, raw := call(t, srv, http.MethodPost, "/api/v1/accounts/"+a.ID+"/probe", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	assert.Equal(t, "active", body["status"])
	assert.Equal(t, []string{a.ID}, probed)
	entries, _, err := s.AuditLog(ctx, store.AuditFilter{})
	require.NoError(t, err)
	found := false
	for _, e := range entries {
		found = found || e.Action == "account.probe"
	}
	assert.True(t, found, "the probe is in the audit log")
	code, _, _ = call(t, srv, http.MethodPost, "/api/v1/accounts/acc_missing/probe", testAdminToken, nil)
	assert.Equal(t, http.StatusNotFound, code)
}
