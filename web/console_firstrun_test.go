package web

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The bare address sends a browser to the console; only GET and HEAD of
// exactly /, and the client routes and the API answer as before.
func TestRootRedirectsToTheConsole(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	client := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Client: client})
	for _, c := range []struct {
		method, path string
		status       int
		location     string
	}{
		{http.MethodGet, "/", http.StatusFound, "/admin/"},
		{http.MethodHead, "/", http.StatusFound, "/admin/"},
		{http.MethodGet, "/?from=bookmark", http.StatusFound, "/admin/"},
		{http.MethodPost, "/", http.StatusNotFound, ""},
		{http.MethodDelete, "/", http.StatusNotFound, ""},
		{http.MethodGet, "/index.html", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/models", http.StatusTeapot, ""},
		{http.MethodGet, "/backend-api/codex/models", http.StatusTeapot, ""},
		{http.MethodGet, "/api/v1/accounts", http.StatusUnauthorized, ""},
		{http.MethodGet, "/admin/", http.StatusSeeOther, "/admin/login?next=%2Fadmin%2F"},
	} {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		assert.Equal(t, c.status, rec.Code, "%s %s", c.method, c.path)
		assert.Equal(t, c.location, rec.Header().Get("Location"), "%s %s", c.method, c.path)
		if c.status == http.StatusNotFound && c.method != http.MethodHead {
			assert.Contains(t, rec.Header().Get("Content-Type"), "application/json", "%s %s is the API's 404, as before", c.method, c.path)
		}
	}
}
