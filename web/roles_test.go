package web

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// routeRoles is the role every route of the API and the console needs, as
// issue 35 assigns them: viewers read (no credentials, no one else's
// tokens), operators act on threads and traffic, admins on accounts,
// people, settings and prices. The route table (routes.go) must say the
// same, and the server must enforce it.
var routeRoles = map[string]roles.Role{
	"GET /api/v1/openapi.json":                  viewer,
	"GET /api/v1/accounts":                      viewer,
	"POST /api/v1/accounts":                     admin,
	"GET /api/v1/accounts/:id":                  viewer,
	"PATCH /api/v1/accounts/:id":                admin,
	"DELETE /api/v1/accounts/:id":               admin,
	"POST /api/v1/accounts/:id/pause":           operator,
	"POST /api/v1/accounts/:id/probe":           operator,
	"POST /api/v1/accounts/:id/resume":          operator,
	"GET /api/v1/keys":                          viewer,
	"POST /api/v1/keys":                         operator,
	"GET /api/v1/keys/:id":                      viewer,
	"PATCH /api/v1/keys/:id":                    operator,
	"DELETE /api/v1/keys/:id":                   operator,
	"GET /api/v1/bindings":                      viewer,
	"POST /api/v1/bindings":                     operator,
	"POST /api/v1/bindings/reset":               operator,
	"GET /api/v1/bindings/:id":                  viewer,
	"DELETE /api/v1/bindings/:id":               operator,
	"GET /api/v1/lanes":                         viewer,
	"GET /api/v1/replicas":                      viewer,
	"GET /api/v1/diagnostics":                   viewer,
	"GET /api/v1/requests":                      viewer,
	"GET /api/v1/usage":                         viewer,
	"GET /api/v1/audit":                         viewer,
	"GET /api/v1/prices":                        viewer,
	"PUT /api/v1/prices":                        admin,
	"GET /api/v1/prices/history":                viewer,
	"GET /api/v1/users":                         viewer,
	"POST /api/v1/users":                        admin,
	"PATCH /api/v1/users/:id":                   admin,
	"DELETE /api/v1/users/:id":                  admin,
	"GET /api/v1/users/:id/tokens":              viewer, // one's own; another's need admin
	"POST /api/v1/users/:id/tokens":             viewer, // likewise
	"DELETE /api/v1/users/:id/tokens/:token_id": viewer, // likewise
	"GET /api/v1/webhooks":                      admin,
	"POST /api/v1/webhooks":                     admin,
	"DELETE /api/v1/webhooks/:id":               admin,
	"POST /api/v1/webhooks/:id/test":            admin,
	"GET /api/v1/webhooks/:id/deliveries":       admin,

	"GET /admin/login":                       anyone,
	"POST /admin/login":                      anyone,
	"GET /admin/static/*":                    anyone,
	"GET /admin/oidc/start":                  anyone,
	"GET /admin/oidc/callback":               anyone,
	"GET /admin":                             viewer,
	"GET /admin/":                            viewer,
	"GET /admin/accounts":                    viewer,
	"POST /admin/accounts":                   admin,
	"POST /admin/accounts/import":            admin,
	"POST /admin/accounts/signin":            admin,
	"GET /admin/accounts/signin/:id":         admin,
	"POST /admin/accounts/signin/:id/cancel": admin,
	"GET /admin/accounts/:id":                viewer,
	"POST /admin/accounts/:id":               admin,
	"GET /admin/accounts/:id/remove":         admin,
	"POST /admin/accounts/:id/remove":        admin,
	"POST /admin/accounts/:id/pause":         operator,
	"POST /admin/accounts/:id/probe":         operator,
	"POST /admin/accounts/:id/resume":        operator,
	"GET /admin/bindings":                    viewer,
	"POST /admin/bindings/reset":             operator,
	"POST /admin/bindings/pin":               operator,
	"GET /admin/lanes":                       viewer,
	"GET /admin/diagnostics":                 viewer,
	"GET /admin/requests":                    viewer,
	"GET /admin/requests/:id":                viewer,
	"GET /admin/search":                      viewer,
	"GET /admin/usage":                       viewer,
	"GET /admin/usage.csv":                   operator,
	"GET /admin/keys":                        viewer,
	"POST /admin/keys":                       operator,
	"GET /admin/keys/:id":                    viewer,
	"POST /admin/keys/:id":                   operator,
	"POST /admin/keys/:id/revoke":            operator,
	"GET /admin/settings":                    viewer,
	"POST /admin/settings/prices":            admin,
	"GET /admin/audit":                       viewer,
	"GET /admin/people":                      admin,
	"POST /admin/people":                     admin,
	"POST /admin/people/:id":                 admin,
	"GET /admin/tokens":                      viewer, // one's own; another's need admin
	"POST /admin/tokens":                     viewer, // likewise
	"POST /admin/tokens/:id/revoke":          viewer, // likewise
	"POST /admin/sessions/signout":           viewer, // likewise
	"GET /admin/webhooks":                    admin,
	"POST /admin/webhooks":                   admin,
	"GET /admin/webhooks/:id":                admin,
	"POST /admin/webhooks/:id/remove":        admin,
	"POST /admin/webhooks/:id/test":          admin,
	"GET /admin/live/:topic":                 viewer,
	"POST /admin/logout":                     viewer,
}

// people is a user of each role with a personal token.
type people struct {
	users  map[roles.Role]store.User
	tokens map[roles.Role]string
}

func addPeople(t *testing.T, s *store.Store) people {
	t.Helper()
	ctx := context.Background()
	p := people{users: map[roles.Role]store.User{}, tokens: map[roles.Role]string{}}
	for _, r := range roles.All {
		u, err := s.CreateUser(ctx, store.User{Email: string(r) + "@example.com", Role: r})
		require.NoError(t, err)
		_, secret, err := s.CreateUserToken(ctx, store.UserToken{UserID: u.ID, Name: string(r) + "-token"})
		require.NoError(t, err)
		p.users[r], p.tokens[r] = u, secret
	}
	return p
}

// rolesServer is a server whose console sign-ins go nowhere (a closed
// loopback port), for tests that call every route.
func rolesServer(t *testing.T, s *store.Store) *Server {
	t.Helper()
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: &fakeRelay{inflight: map[string]int{}},
		SessionKey: []byte("test session key"), LiveInterval: 20 * time.Millisecond, AuthURL: "http://127.0.0.1:1",
		SignInTimeout: time.Second})
	t.Cleanup(srv.Close)
	return srv
}

// Every route of the API and the console is in the route table with the
// role the issue gives it, and a route added any other way (without a role)
// fails here.
func TestEveryRouteDeclaresItsRole(t *testing.T) {
	srv := rolesServer(t, storetest.Open(t, storetest.SQLiteURL(t), store.Options{}))
	seen := map[string]bool{}
	for _, r := range srv.echo.Routes() {
		if r.Method == "echo_route_not_found" || !(strings.HasPrefix(r.Path, "/api/v1") || isConsole(r.Path)) {
			continue
		}
		k := r.Method + " " + r.Path
		seen[k] = true
		declared, ok := srv.roleOf[k]
		if !assert.True(t, ok, "%s has no role in the route table (add it with handle)", k) {
			continue
		}
		want, ok := routeRoles[k]
		if assert.True(t, ok, "%s is not in routeRoles: say which role it needs", k) {
			assert.Equal(t, want, declared, "the role of %s", k)
		}
	}
	for k := range routeRoles {
		assert.True(t, seen[k], "routeRoles names %s, which no route serves", k)
	}
}

// roleRefusal reports whether an answer is the role middleware's 403.
func roleRefusal(code int, body string) bool {
	return code == http.StatusForbidden && strings.Contains(body, "role_required") || code == http.StatusForbidden && strings.Contains(body, " role")
}

// Every API route, called with a personal token of each role: the roles
// below the route's are refused with 403 forbidden/role_required naming
// the role, and the others reach the handler.
func TestEveryAPIRouteWithEachRole(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := rolesServer(t, s)
	pp := addPeople(t, s)
	n := 0
	for _, r := range srv.echo.Routes() {
		if !strings.HasPrefix(r.Path, "/api/v1") || r.Method == "echo_route_not_found" {
			continue
		}
		need := routeRoles[r.Method+" "+r.Path]
		for _, role := range roles.All {
			n++
			path := r.Path
			if strings.HasPrefix(path, "/api/v1/users/:id/tokens") {
				// One's own tokens: what the route's role admits.
				path = strings.Replace(path, ":id", pp.users[role].ID, 1)
			}
			path = pathParam.ReplaceAllString(path, "x")
			code, body, raw := callFrom(t, srv, fmt.Sprintf("192.0.2.%d:1000", n%250+1), r.Method, path, pp.tokens[role], nil)
			if role.Covers(need) {
				assert.False(t, roleRefusal(code, raw), "%s %s as %s: refused (%d %s)", r.Method, r.Path, role, code, raw)
				assert.NotEqual(t, http.StatusUnauthorized, code, "%s %s as %s", r.Method, r.Path, role)
				continue
			}
			if !assert.Equal(t, http.StatusForbidden, code, "%s %s as %s: %s", r.Method, r.Path, role, raw) {
				continue
			}
			e := body["error"].(map[string]any)
			assert.Equal(t, "forbidden", e["type"])
			assert.Equal(t, "role_required", e["code"])
			assert.Contains(t, e["message"], "needs the "+string(need)+" role")
		}
	}
	assert.Greater(t, n, 90)
}

// Every console route, signed in with a personal token of each role: the
// roles below the route's get the 403 page naming the role, forms with
// their CSRF token included; the others reach the handler.
func TestEveryConsoleRouteWithEachRole(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := rolesServer(t, s)
	pp := addPeople(t, s)
	for i, role := range roles.All {
		b := newBrowser(t, srv)
		b.addr = fmt.Sprintf("192.0.2.%d:40000", 100+i) // logins are limited per address
		loginWith(t, b, pp.tokens[role])
		csrf := b.csrf
		for _, r := range srv.echo.Routes() {
			need, ok := routeRoles[r.Method+" "+r.Path]
			if !isConsole(r.Path) || r.Method == "echo_route_not_found" || !ok || need == anyone {
				continue
			}
			path := pathParam.ReplaceAllString(r.Path, "x")
			var code int
			var raw string
			if r.Method == http.MethodPost {
				rec := b.post(path, url.Values{"_csrf": {csrf}})
				code, raw = rec.Code, body(rec)
			} else {
				rec := b.get(path)
				code, raw = rec.Code, body(rec)
			}
			if r.Path == "/admin/logout" || r.Path == "/admin/sessions/signout" {
				assert.Equal(t, http.StatusSeeOther, code, "a %s signs out (%s)", role, r.Path)
				loginWith(t, b, pp.tokens[role])
				csrf = b.csrf
				continue
			}
			if role.Covers(need) {
				assert.False(t, code == http.StatusForbidden && strings.Contains(raw, "role"), "%s %s as %s: refused (%d)", r.Method, r.Path, role, code)
				assert.NotEqual(t, http.StatusUnauthorized, code, "%s %s as %s", r.Method, r.Path, role)
				continue
			}
			assert.Equal(t, http.StatusForbidden, code, "%s %s as %s", r.Method, r.Path, role)
			assert.Contains(t, raw, "needs the "+string(need)+" role", "%s %s as %s", r.Method, r.Path, role)
		}
	}
}

// loginWith signs a browser into the console with a token.
func loginWith(t *testing.T, b *browser, token string) {
	t.Helper()
	require.Equal(t, http.StatusOK, b.get("/admin/login").Code)
	rec := b.post("/admin/login", url.Values{"token": {token}, "next": {"/admin/"}})
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	rec = b.get("/admin/")
	require.Equal(t, http.StatusOK, rec.Code, body(rec))
}
