package web

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The database's passwords, in the user info or as ?password=, show on no
// page and in no answer. The test server trusts its clients, so the
// passwords are carried but never checked. (?sslpassword= is redacted too,
// see package store's tests, but lib/pq passes it on to the server, which
// refuses it.)
func TestDatabasePasswordsAreNeverShown(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(storetest.PostgresURL(t))
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "userinfo-canary")
	q := u.Query()
	q.Set("password", "query-canary")
	u.RawQuery = q.Encode()
	s := storetest.Open(t, u.String(), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()

	rec := b.get("/admin/settings")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "xxxxx", "the location is shown, its secrets hidden")
	for _, path := range []string{"/admin/settings", "/readyz", "/api/v1/replicas"} {
		page := body(b.get(path))
		_, _, api := call(t, srv, http.MethodGet, path, testAdminToken, nil)
		for _, secret := range []string{"userinfo-canary", "query-canary"} {
			assert.NotContains(t, page, secret, path)
			assert.NotContains(t, api, secret, path)
		}
	}
}
