package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

const testAdminToken = "cra_test_admin_token"

func newTestServer(t *testing.T, s *store.Store) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Registry: reg, Gatherer: reg})
	t.Cleanup(srv.Close)
	return srv
}

// call sends one request through the server and decodes a JSON answer.
func call(t *testing.T, h http.Handler, method, path, token string, body any) (int, map[string]any, string) {
	t.Helper()
	return callFrom(t, h, "", method, path, token, body)
}

// callFrom is call from the client address addr (host:port; "" is
// httptest's).
func callFrom(t *testing.T, h http.Handler, addr, method, path, token string, body any) (int, map[string]any, string) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		r = bytes.NewReader(raw)
	}
	req := httptest.NewRequest(method, path, r)
	if addr != "" {
		req.RemoteAddr = addr
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && rec.Body.Len() > 0 {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
	}
	return rec.Code, out, rec.Body.String()
}

func errorOf(t *testing.T, body map[string]any) (code, field string) {
	t.Helper()
	e, ok := body["error"].(map[string]any)
	require.True(t, ok, "error shape {\"error\":{...}} expected, got %v", body)
	require.NotEmpty(t, e["message"])
	code, _ = e["code"].(string)
	field, _ = e["field"].(string)
	return code, field
}

var pathParam = regexp.MustCompile(`:([a-z_]+)`)

// Every API route refuses a request without the admin token or with a wrong
// one, before it reads anything. (Each request comes from an address of its
// own: from one, the wrong tokens would soon be refused by the failure
// limit, TestAdminAPIFailureLimit.)
func TestEveryAPIRouteNeedsTheAdminToken(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newTestServer(t, s)
	n := 0
	for _, r := range srv.echo.Routes() {
		if !strings.HasPrefix(r.Path, "/api/v1") || r.Method == "echo_route_not_found" {
			continue
		}
		n++
		path := pathParam.ReplaceAllString(r.Path, "x")
		for i, token := range []string{"", "wrong", testAdminToken + "x", strings.ToUpper(testAdminToken)} {
			addr := fmt.Sprintf("192.0.2.%d:%d", n, 1000+i)
			code, body, _ := callFrom(t, srv, addr, r.Method, path, token, nil)
			assert.Equal(t, http.StatusUnauthorized, code, "%s %s with token %q", r.Method, r.Path, token)
			c, _ := errorOf(t, body)
			assert.Equal(t, "unauthorized", c)
		}
	}
	assert.GreaterOrEqual(t, n, 12, "the API routes were found")
	code, _, _ := call(t, srv, http.MethodGet, "/api/v1/nothing-here", "", nil)
	assert.Equal(t, http.StatusUnauthorized, code, "unknown API paths do not reveal themselves")
}

// The OpenAPI document and the routes agree in both directions.
func TestOpenAPIDocumentMatchesRoutes(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newTestServer(t, s)
	code, doc, _ := call(t, srv, http.MethodGet, "/api/v1/openapi.json", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "3.0.3", doc["openapi"])
	paths := doc["paths"].(map[string]any)

	routes := map[string]bool{}
	for _, r := range srv.echo.Routes() {
		if !strings.HasPrefix(r.Path, "/api/v1/") || r.Method == "echo_route_not_found" {
			continue
		}
		p := pathParam.ReplaceAllString(strings.TrimPrefix(r.Path, "/api/v1"), "{$1}")
		routes[strings.ToLower(r.Method)+" "+p] = true
		item, ok := paths[p].(map[string]any)
		if assert.True(t, ok, "route %s %s is not in the OpenAPI document", r.Method, p) &&
			assert.Contains(t, item, strings.ToLower(r.Method), "route %s %s is not in the OpenAPI document", r.Method, p) {
			op := item[strings.ToLower(r.Method)].(map[string]any)
			assert.Equal(t, string(srv.roleOf[r.Method+" "+r.Path]), op["x-required-role"], "the role the document names for %s %s", r.Method, p)
		}
	}
	for p, item := range paths {
		for method := range item.(map[string]any) {
			if method == "parameters" {
				continue
			}
			assert.True(t, routes[method+" "+p], "the document names %s %s, which no route serves", method, p)
		}
	}
}

func TestAccountsAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv := newTestServer(t, s)
		code, acc, raw := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{
			"label": "team", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "organization": "org-a", "api_key": "sk-secret-value",
		})
		require.Equal(t, http.StatusCreated, code, raw)
		id := acc["id"].(string)
		assert.Equal(t, "openai", acc["kind"])
		assert.Equal(t, "org-a", acc["organization"])
		assert.Equal(t, "active", acc["status"])
		assert.NotContains(t, raw, "sk-secret-value", "credentials are never returned")

		code, gpt, raw := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{
			"access_token": "at-secret-value", "refresh_token": "rt-secret-value", "id_token": "idt-secret-value", "account_id": "ws-123",
		})
		require.Equal(t, http.StatusCreated, code, raw)
		assert.Equal(t, "chatgpt", gpt["kind"], "kind defaults to chatgpt for tokens")
		assert.Equal(t, DefaultChatGPTBaseURL, gpt["base_url"])
		assert.Equal(t, "ws-123", gpt["account_id"])

		for _, path := range []string{"/api/v1/accounts", "/api/v1/accounts/" + id, "/api/v1/accounts/" + gpt["id"].(string)} {
			code, _, raw := call(t, srv, http.MethodGet, path, testAdminToken, nil)
			require.Equal(t, http.StatusOK, code)
			for _, secret := range []string{"sk-secret-value", "at-secret-value", "rt-secret-value", "idt-secret-value"} {
				assert.NotContains(t, raw, secret, "GET %s leaks a credential", path)
			}
		}
		code, list, _ := call(t, srv, http.MethodGet, "/api/v1/accounts", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.Len(t, list["accounts"], 2)

		code, patched, raw := call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken, map[string]any{"label": "renamed", "priority": 7, "api_key": "sk-rotated"})
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, "renamed", patched["label"])
		assert.EqualValues(t, 7, patched["priority"])
		assert.Equal(t, "org-a", patched["organization"])
		cred, err := s.Credentials(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, "sk-rotated", cred.APIKey)

		code, paused, _ := call(t, srv, http.MethodPost, "/api/v1/accounts/"+id+"/pause", testAdminToken, map[string]any{"reason": "maintenance"})
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, "paused", paused["status"])
		assert.Equal(t, "maintenance", paused["status_reason"])
		code, resumed, _ := call(t, srv, http.MethodPost, "/api/v1/accounts/"+id+"/resume", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, "active", resumed["status"])

		code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/accounts/"+id, testAdminToken, nil)
		assert.Equal(t, http.StatusNoContent, code)
		code, body, _ := call(t, srv, http.MethodGet, "/api/v1/accounts/"+id, testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)
		c, _ := errorOf(t, body)
		assert.Equal(t, "not_found", c)
		code, _, _ = call(t, srv, http.MethodPost, "/api/v1/accounts/acc_missing/pause", testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)
	})
}

// Bad input gets a 400 in the one error shape, naming the field.
func TestAccountValidation(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := newTestServer(t, s)
	cases := []struct {
		name  string
		body  any
		code  int
		field string
	}{
		{"unknown kind", map[string]any{"kind": "azure", "api_key": "k"}, 400, "kind"},
		{"openai without key", map[string]any{"kind": "openai"}, 400, "api_key"},
		{"compatible without base url", map[string]any{"kind": "compatible", "api_key": "k"}, 400, "base_url"},
		{"bad base url", map[string]any{"api_key": "k", "base_url": "ftp://x"}, 400, "base_url"},
		{"base url with credentials", map[string]any{"api_key": "k", "base_url": "https://u:p@x/v1"}, 400, "base_url"},
		{"chatgpt without account id", map[string]any{"access_token": "t"}, 400, "account_id"},
		{"chatgpt with api key", map[string]any{"kind": "chatgpt", "api_key": "k", "account_id": "a"}, 400, "api_key"},
		{"openai with tokens", map[string]any{"kind": "openai", "api_key": "k", "refresh_token": "r"}, 400, "access_token"},
		{"wrong type", map[string]any{"api_key": "k", "priority": "high"}, 400, "priority"},
		{"priority out of range", map[string]any{"api_key": "k", "priority": 5000}, 400, "priority"},
		{"negative cap", map[string]any{"api_key": "k", "max_concurrency": -1}, 400, "max_concurrency"},
		{"unknown field", map[string]any{"api_key": "k", "apikey": "typo"}, 400, "apikey"},
		{"blank label", map[string]any{"api_key": "k", "label": "  "}, 400, "label"},
		{"malformed json", `{"api_key": "k"`, 400, ""},
		{"not an object", `["api_key"]`, 400, ""},
		{"two objects", `{"api_key":"k"}{"api_key":"k"}`, 400, ""},
		{"empty body", ``, 400, ""},
		{"binary", []byte{0xff, 0xfe, 0x00, 0x01}, 400, ""},
		{"oversized", `{"label":"` + strings.Repeat("a", 2<<20) + `"}`, 413, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body, raw := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, tc.body)
			require.Equal(t, tc.code, code, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, tc.field, field)
		})
	}
	accounts, err := s.Accounts(context.Background())
	require.NoError(t, err)
	assert.Empty(t, accounts, "no bad request stored anything")

	req := httptest.NewRequest(http.MethodPost, "/api/v1/accounts", strings.NewReader(`api_key=k`))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusUnsupportedMediaType, rec.Code)
}

func TestKeysAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv := newTestServer(t, s)
		code, acc, _ := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"api_key": "sk-1"})
		require.Equal(t, http.StatusCreated, code)

		code, k, raw := call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, map[string]any{
			"name": "ci", "account_ids": []string{acc["id"].(string)}, "models": []string{"gpt-5.5-codex"}, "expires_in": "24h",
		})
		require.Equal(t, http.StatusCreated, code, raw)
		secret, _ := k["key"].(string)
		require.True(t, strings.HasPrefix(secret, "crk_"), "the key is returned once, in field key")
		assert.NotNil(t, k["expires_at"])
		assert.Equal(t, []any{acc["id"]}, k["account_ids"])

		got, err := s.AuthenticateClientKey(context.Background(), secret)
		require.NoError(t, err, "the returned key authenticates")
		assert.Equal(t, k["id"], got.ID)

		code, list, raw := call(t, srv, http.MethodGet, "/api/v1/keys", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.NotContains(t, raw, secret, "the key is never shown again")
		assert.Len(t, list["keys"], 1)
		code, _, raw = call(t, srv, http.MethodGet, "/api/v1/keys/"+k["id"].(string), testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.NotContains(t, raw, secret)

		// A change keeps what it does not name, and the key's secret.
		code, _, raw = call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"api_key": "sk-2", "tags": []string{"blue"}})
		require.Equal(t, http.StatusCreated, code, raw)
		code, changed, raw := call(t, srv, http.MethodPatch, "/api/v1/keys/"+k["id"].(string), testAdminToken, map[string]any{"account_tag": "blue", "models": []string{}})
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, "blue", changed["account_tag"])
		assert.Equal(t, []any{}, changed["account_ids"], "the tag replaced the account list")
		assert.Equal(t, []any{}, changed["models"])
		assert.Equal(t, "ci", changed["name"], "kept")
		assert.Equal(t, k["expires_at"], changed["expires_at"], "kept")
		code, changed, raw = call(t, srv, http.MethodPatch, "/api/v1/keys/"+k["id"].(string), testAdminToken, map[string]any{"name": "ci renamed", "expires_at": ""})
		require.Equal(t, http.StatusOK, code, raw)
		assert.Equal(t, "ci renamed", changed["name"])
		assert.Nil(t, changed["expires_at"], "an empty expires_at removes the expiry")
		assert.Equal(t, "blue", changed["account_tag"], "kept")
		got, err = s.AuthenticateClientKey(context.Background(), secret)
		require.NoError(t, err, "the same secret still authenticates")
		assert.Equal(t, "blue", got.ScopeTag)
		for _, b := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"name": ""}, "name"},
			{map[string]any{"account_ids": []string{"acc_nope"}}, "account_ids"},
			{map[string]any{"expires_in": "soon"}, "expires_in"},
		} {
			code, body, raw := call(t, srv, http.MethodPatch, "/api/v1/keys/"+k["id"].(string), testAdminToken, b.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, b.field, field, "body %v", b.body)
		}
		code, _, _ = call(t, srv, http.MethodPatch, "/api/v1/keys/key_missing", testAdminToken, map[string]any{"name": "x"})
		assert.Equal(t, http.StatusNotFound, code)

		code, revoked, _ := call(t, srv, http.MethodDelete, "/api/v1/keys/"+k["id"].(string), testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.NotNil(t, revoked["revoked_at"])
		code, _, raw = call(t, srv, http.MethodPatch, "/api/v1/keys/"+k["id"].(string), testAdminToken, map[string]any{"name": "again"})
		assert.Equal(t, http.StatusConflict, code, "a revoked key cannot be changed: %s", raw)
		_, err = s.AuthenticateClientKey(context.Background(), secret)
		assert.ErrorIs(t, err, store.ErrKeyRejected)

		bad := []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{}, "name"},
			{map[string]any{"name": "x", "account_ids": []string{"acc_nope"}}, "account_ids"},
			{map[string]any{"name": "x", "account_ids": []string{acc["id"].(string)}, "account_tag": "t"}, "account_tag"},
			{map[string]any{"name": "x", "expires_in": "soon"}, "expires_in"},
			{map[string]any{"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"},
			{map[string]any{"name": "x", "expires_at": "tomorrow"}, "expires_at"},
		}
		for _, b := range bad {
			code, body, raw := call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, b.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, b.field, field, "body %v", b.body)
		}
		code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/keys/key_missing", testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)
	})
}

func TestOperationsEndpoints(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv := newTestServer(t, s)
		code, body, _ := call(t, srv, http.MethodGet, "/healthz", "", nil)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "ok", body["status"])
		code, body, _ = call(t, srv, http.MethodGet, "/readyz", "", nil)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "ready", body["status"])

		call(t, srv, http.MethodGet, "/api/v1/accounts", "", nil)
		code, _, metrics := call(t, srv, http.MethodGet, "/metrics", "", nil)
		require.Equal(t, http.StatusOK, code)
		assert.Contains(t, metrics, "go_goroutines")
		assert.Contains(t, metrics, `codex_relay_http_requests_total{code="401",method="GET",route="/api/v1/accounts"} 1`)
		assert.Contains(t, metrics, "codex_relay_http_request_duration_seconds_bucket")
	})
}

// readyz fails while migrations are pending.
func TestReadyzNeedsMigrations(t *testing.T) {
	loc, err := store.ParseLocation(storetest.SQLiteURL(t))
	require.NoError(t, err)
	s, err := store.Open(context.Background(), loc, store.Options{SecretKey: storetest.SecretKey})
	require.NoError(t, err)
	defer s.Close()
	srv := newTestServer(t, s)
	code, body, _ := call(t, srv, http.MethodGet, "/readyz", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "not_ready", body["status"])
	assert.Regexp(t, `^migrations pending: at version 0 of \d+$`, body["reason"], "the cause, and nothing of where the database is")
	code, _, _ = call(t, srv, http.MethodGet, "/healthz", "", nil)
	assert.Equal(t, http.StatusOK, code, "liveness does not depend on the database")
}

// readyz fails at once while the replica drains, so a balancer stops
// sending it new work; healthz stays up.
func TestReadyzFailsWhileDraining(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, fr := consoleServer(t, s)
	code, _, _ := call(t, srv, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, code)
	fr.mu.Lock()
	fr.draining = true
	fr.mu.Unlock()
	code, body, _ := call(t, srv, http.MethodGet, "/readyz", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body["reason"], "draining")
	code, _, _ = call(t, srv, http.MethodGet, "/healthz", "", nil)
	assert.Equal(t, http.StatusOK, code)
}
