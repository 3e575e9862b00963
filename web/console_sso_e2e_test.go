package web_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

// Single sign-on in headless Chromium: from the login page to the provider
// (another site, localhost) and back, where the sign-in's state cookie
// must have come along on the cross-site redirect, then on to the page
// asked for, signed in as the person their group maps to
// (web/e2e/sso.mjs).
func TestSingleSignOnInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)
	m := web.StartOIDCProvider(t)
	m.QueueUser(&mockoidc.MockUser{Subject: "u1", Email: "ada@example.com", EmailVerified: true, Groups: []string{"relay-ops"}})

	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := httptest.NewUnstartedServer(nil)
	roleMap, err := web.ParseRoleMap("admin=relay-admins,operator=relay-ops")
	require.NoError(t, err)
	w := web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken),
		OIDC: &web.OIDC{Issuer: m.Issuer(), ClientID: m.ClientID, ClientSecret: m.ClientSecret, Roles: roleMap,
			PublicURL: "http://" + srv.Listener.Addr().String()}})
	t.Cleanup(w.Close)
	srv.Config.Handler = w
	srv.Start()
	t.Cleanup(srv.Close)
	provider, err := url.Parse(m.Issuer())
	require.NoError(t, err)

	out := filepath.Join(root, "test-output", "console")
	require.NoError(t, os.MkdirAll(out, 0o755))
	runBrowserScript(t, root, node, "sso.mjs", 2*time.Minute, "RELAY_URL="+srv.URL, "PROVIDER_HOST="+provider.Hostname(), "EMAIL=ada@example.com",
		"ROLE=operator", "CHROMIUM="+chromium, "OUT_DIR="+out)

	u, err := st.UserByEmail(context.Background(), "ada@example.com")
	require.NoError(t, err)
	assert.Equal(t, roles.Operator, u.Role)
}
