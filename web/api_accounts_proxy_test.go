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

// proxyPassword is the proxy password no answer, page or audit entry may show.
const proxyPassword = "pr0xy-pw-s3cret"

// proxy_url: POST and PATCH take the URL with its password; every read
// shows it as user:***@; PATCH "" removes it; a bad one is refused naming
// the field, without echoing the URL.
func TestAccountsAPIProxy(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv := newTestServer(t, s)
		code, acc, raw := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{
			"kind": "openai", "api_key": "sk-x", "proxy_url": "http://alice:" + proxyPassword + "@127.0.0.1:3128",
		})
		require.Equal(t, http.StatusCreated, code, raw)
		id := acc["id"].(string)
		assert.Equal(t, "http://alice:***@127.0.0.1:3128", acc["proxy_url"])
		assert.NotContains(t, raw, proxyPassword)
		stored, err := s.Account(ctx, id)
		require.NoError(t, err)
		u, err := stored.Proxy.URL()
		require.NoError(t, err)
		assert.Equal(t, "http://alice:"+proxyPassword+"@127.0.0.1:3128", u.String(), "the store holds the whole URL")

		code, plain, _ := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"kind": "openai", "api_key": "sk-y"})
		require.Equal(t, http.StatusCreated, code)
		assert.Equal(t, "", plain["proxy_url"], "none")

		for _, path := range []string{"/api/v1/accounts", "/api/v1/accounts/" + id} {
			code, _, raw := call(t, srv, http.MethodGet, path, testAdminToken, nil)
			require.Equal(t, http.StatusOK, code)
			assert.Contains(t, raw, `"proxy_url":"http://alice:***@127.0.0.1:3128"`, path)
			assert.NotContains(t, raw, proxyPassword, path)
		}

		code, patched, raw := call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken,
			map[string]any{"proxy_url": "socks5://bob:" + proxyPassword + "@127.0.0.1:1080"})
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, "socks5://bob:***@127.0.0.1:1080", patched["proxy_url"])
		assert.NotContains(t, raw, proxyPassword)
		code, patched, _ = call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken, map[string]any{"label": "kept"})
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, "socks5://bob:***@127.0.0.1:1080", patched["proxy_url"], "absent: kept")

		for name, bad := range map[string]string{
			"scheme": "ftp://u:" + proxyPassword + "@h:21", "no port": "http://u:" + proxyPassword + "@h",
			"path": "http://u:" + proxyPassword + "@h:1/x", "unparseable": "http://u:" + proxyPassword + "%zz@h:1",
		} {
			code, body, raw := call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken, map[string]any{"proxy_url": bad})
			require.Equal(t, http.StatusBadRequest, code, "%s: %s", name, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, "proxy_url", field, name)
			assert.NotContains(t, raw, proxyPassword, name)
			code, _, raw = call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"kind": "openai", "api_key": "k", "proxy_url": bad})
			require.Equal(t, http.StatusBadRequest, code, "%s: %s", name, raw)
			assert.NotContains(t, raw, proxyPassword, name)
		}
		code, patched, _ = call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken, map[string]any{"proxy_url": ""})
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, "", patched["proxy_url"], `"" removes it`)
		stored, err = s.Account(ctx, id)
		require.NoError(t, err)
		assert.True(t, stored.Proxy.IsZero())

		code, _, raw = call(t, srv, http.MethodGet, "/api/v1/audit", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.Contains(t, raw, "proxy_url", "the audit names the field changed, before and after")
		assert.NotContains(t, raw, proxyPassword)
		accounts, err := s.Accounts(ctx)
		require.NoError(t, err)
		assert.Len(t, accounts, 2, "no bad request stored anything")
	})
}

// The console's add form takes a proxy; the list shows it without its
// password, and a form sent back after an error never holds it.
func TestConsoleAccountProxy(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	page := body(b.get("/admin/accounts"))
	assert.Contains(t, page, `name="proxy_url"`)

	rec := b.post("/admin/accounts", url.Values{"kind": {"openai"}, "label": {"proxied"}, "api_key": {"sk-1"},
		"proxy_url": {"socks5://bob:" + proxyPassword + "@10.0.0.5"}})
	require.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Contains(t, body(rec), "proxy_url: a port")
	assert.NotContains(t, body(rec), proxyPassword, "never sent back")

	rec = b.post("/admin/accounts", url.Values{"kind": {"openai"}, "label": {"proxied"}, "api_key": {"sk-1"},
		"proxy_url": {"socks5://bob:" + proxyPassword + "@10.0.0.5:1080"}})
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	accounts, err := s.Accounts(context.Background())
	require.NoError(t, err)
	require.Len(t, accounts, 1)
	u, err := accounts[0].Proxy.URL()
	require.NoError(t, err)
	assert.Equal(t, "socks5://bob:"+proxyPassword+"@10.0.0.5:1080", u.String())
	page = body(b.get("/admin/accounts"))
	assert.Contains(t, page, "via socks5://bob:***@10.0.0.5:1080")
	assert.NotContains(t, page, proxyPassword)
}

// A PATCH applies whole or not at all: a credential given beside a field
// that is refused is not written either (it was committed before the last
// check, in a transaction of its own).
func TestAccountPatchAppliesWholeOrNothing(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv := newTestServer(t, s)
		code, acc, raw := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"kind": "openai", "api_key": "sk-old", "label": "before"})
		require.Equal(t, http.StatusCreated, code, raw)
		id := acc["id"].(string)
		code, _, raw = call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken,
			map[string]any{"api_key": "sk-new", "label": "after", "proxy_url": "ftp://127.0.0.1:21"})
		require.Equal(t, http.StatusBadRequest, code, raw)
		cred, err := s.Credentials(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "sk-old", cred.APIKey, "the key is not changed by a refused PATCH")
		stored, err := s.Account(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "before", stored.Label)

		code, acc, raw = call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{
			"kind": "chatgpt", "access_token": "at-old", "refresh_token": "rt-old", "account_id": "acct-1"})
		require.Equal(t, http.StatusCreated, code, raw)
		id = acc["id"].(string)
		code, _, raw = call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken,
			map[string]any{"access_token": "at-new", "account_id": " "})
		require.Equal(t, http.StatusBadRequest, code, raw)
		cred, err = s.Credentials(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "at-old", cred.AccessToken, "the token is not changed by a refused PATCH")

		code, _, raw = call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken,
			map[string]any{"access_token": "at-new", "label": "renewed"})
		require.Equal(t, http.StatusOK, code, raw)
		cred, err = s.Credentials(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "at-new", cred.AccessToken)
		assert.Equal(t, "rt-old", cred.RefreshToken, "what the PATCH does not name is kept")
		stored, err = s.Account(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "renewed", stored.Label)
	})
}
