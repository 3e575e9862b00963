package web_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

// The console in a real browser signed in as each role: a viewer (with a
// personal token) is shown no action above the role, a pause forced with
// the page's CSRF token is refused and does nothing, and they make a token
// of their own; an operator sees the pause and key controls, not the
// admin's, and a forced price change is refused; an admin adds a person
// on the People page (web/e2e/people.mjs).
func TestConsoleByRoleInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)

	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	acct, err := st.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "team key", BaseURL: "http://127.0.0.1:1/v1"},
		store.Credentials{APIKey: "sk-test"})
	require.NoError(t, err)
	_, _, err = st.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
	require.NoError(t, err)
	viewer, err := st.CreateUser(ctx, store.User{Email: "viewer@example.com", Name: "Vee", Role: roles.Viewer})
	require.NoError(t, err)
	_, viewerToken, err := st.CreateUserToken(ctx, store.UserToken{UserID: viewer.ID, Name: "browser"})
	require.NoError(t, err)

	op, err := st.CreateUser(ctx, store.User{Email: "operator@example.com", Role: roles.Operator})
	require.NoError(t, err)
	_, operatorToken, err := st.CreateUserToken(ctx, store.UserToken{UserID: op.ID, Name: "browser"})
	require.NoError(t, err)
	srv := httptest.NewServer(web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken)}))
	t.Cleanup(srv.Close)

	out := filepath.Join(root, "test-output", "console")
	require.NoError(t, os.MkdirAll(out, 0o755))
	runBrowserScript(t, root, node, "people.mjs", 2*time.Minute, "RELAY_URL="+srv.URL, "ADMIN_TOKEN="+e2eAdminToken, "VIEWER_TOKEN="+viewerToken, "OPERATOR_TOKEN="+operatorToken,
		"ACCOUNT_ID="+acct.ID, "CHROMIUM="+chromium, "OUT_DIR="+out)

	a, err := st.Account(ctx, acct.ID)
	require.NoError(t, err)
	assert.NotEqual(t, store.StatusPaused, a.Status, "the forced pause did nothing")
	paused, _, err := st.AuditLog(ctx, store.AuditFilter{Action: "account.pause"})
	require.NoError(t, err)
	assert.Empty(t, paused)
	logins, _, err := st.AuditLog(ctx, store.AuditFilter{Action: "login"})
	require.NoError(t, err)
	actors := map[string]bool{}
	for _, e := range logins {
		actors[e.Actor] = true
	}
	assert.Equal(t, map[string]bool{"viewer@example.com": true, "operator@example.com": true, "admin-token": true}, actors)
	tables, err := st.PriceTables(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, tables, "the operator's forced price change stored nothing")
	added, err := st.UserByEmail(ctx, "new.person@example.com")
	require.NoError(t, err, "the person added in the browser is stored")
	assert.Equal(t, roles.Operator, added.Role)
	assert.Equal(t, "New Person", added.Name)
	ts, err := st.UserTokens(ctx, viewer.ID)
	require.NoError(t, err)
	require.Len(t, ts, 2)
	assert.Equal(t, "from chromium", ts[0].Name, "the token made in the browser is stored")
}
