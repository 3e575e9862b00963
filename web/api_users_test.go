package web

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// clockedServer is a server and store on one settable clock.
func clockedServer(t *testing.T) (*Server, *store.Store, *testClock) {
	t.Helper()
	clk := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{Now: clk.Now})
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Now: clk.Now,
		Relay: &fakeRelay{inflight: map[string]int{}}, SessionKey: []byte("test session key")})
	t.Cleanup(srv.Close)
	return srv, s, clk
}

// The users routes as the contract has them: created with email, name and
// role, listed, changed, deleted; every change audited with what changed.
func TestUsersAPI(t *testing.T) {
	srv, s, clk := clockedServer(t)
	code, u, raw := call(t, srv, http.MethodPost, "/api/v1/users", testAdminToken, map[string]any{"email": "ann@example.com", "name": "Ann", "role": "viewer"})
	require.Equal(t, http.StatusCreated, code, raw)
	id, _ := u["id"].(string)
	require.True(t, strings.HasPrefix(id, "usr_"), raw)
	assert.Equal(t, "viewer", u["role"])
	assert.Equal(t, false, u["disabled"])

	code, body, _ := call(t, srv, http.MethodPost, "/api/v1/users", testAdminToken, map[string]any{"email": "ANN@example.com", "role": "admin"})
	assert.Equal(t, http.StatusConflict, code)
	_, field := errorOf(t, body)
	assert.Equal(t, "email", field)
	for _, bad := range []map[string]any{{"email": "nope", "role": "viewer"}, {"email": "b@example.com", "role": "root"}, {"email": "b@example.com"}} {
		code, body, _ = call(t, srv, http.MethodPost, "/api/v1/users", testAdminToken, bad)
		assert.Equal(t, http.StatusBadRequest, code, "%v", bad)
		c, _ := errorOf(t, body)
		assert.Equal(t, "invalid_field", c)
	}

	clk.Add(time.Second) // the audit log lists by time
	code, body, _ = call(t, srv, http.MethodPatch, "/api/v1/users/"+id, testAdminToken, map[string]any{"role": "operator", "disabled": true})
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "operator", body["role"])
	assert.Equal(t, true, body["disabled"])
	code, body, _ = call(t, srv, http.MethodGet, "/api/v1/users", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code)
	list := body["users"].([]any)
	require.Len(t, list, 1)
	assert.Equal(t, "ann@example.com", list[0].(map[string]any)["email"])

	clk.Add(time.Second)
	code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/users/"+id, testAdminToken, nil)
	assert.Equal(t, http.StatusNoContent, code)
	code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/users/"+id, testAdminToken, nil)
	assert.Equal(t, http.StatusNotFound, code)

	entries, _, err := s.AuditLog(context.Background(), store.AuditFilter{Action: "user."})
	require.NoError(t, err)
	require.Len(t, entries, 3)
	assert.Equal(t, "user.delete", entries[0].Action)
	assert.Equal(t, "user.update", entries[1].Action)
	assert.Equal(t, "ann@example.com: role viewer → operator; disabled no → yes", entries[1].Detail, "before and after")
	assert.Equal(t, "user.create", entries[2].Action)
	for _, e := range entries {
		assert.Equal(t, "admin-token", e.Actor)
	}
}

// A personal token's life: shown once, used as a bearer token with its
// user's role, listed with its last use (never its secret), refused once
// revoked, expired, or its user disabled, at the very next request.
func TestPersonalTokenLifecycle(t *testing.T) {
	srv, s, clk := clockedServer(t)
	ctx := context.Background()
	op, err := s.CreateUser(ctx, store.User{Email: "op@example.com", Role: "operator"})
	require.NoError(t, err)

	code, tok, raw := call(t, srv, http.MethodPost, "/api/v1/users/"+op.ID+"/tokens", testAdminToken,
		map[string]any{"name": "ci", "expires_at": clk.Now().Add(24 * time.Hour)})
	require.Equal(t, http.StatusCreated, code, raw)
	secret, _ := tok["token"].(string)
	tokID, _ := tok["id"].(string)
	require.True(t, strings.HasPrefix(secret, "crp_"), raw)
	require.NotEmpty(t, tokID)

	code, _, raw = call(t, srv, http.MethodGet, "/api/v1/accounts", secret, nil)
	require.Equal(t, http.StatusOK, code, raw)
	code, key, raw := call(t, srv, http.MethodPost, "/api/v1/keys", secret, map[string]any{"name": "made by a token"})
	require.Equal(t, http.StatusCreated, code, raw)

	// The audit log names the token and the person behind it.
	code, body, _ := call(t, srv, http.MethodGet, "/api/v1/audit?actor=op@example.com", testAdminToken, nil)
	require.Equal(t, http.StatusOK, code)
	rows := body["entries"].([]any)
	require.Len(t, rows, 1, "the token's creation is the admin token's; the key's is the token's")
	e := rows[0].(map[string]any)
	assert.Equal(t, "key.create", e["action"])
	assert.Equal(t, "token:ci", e["actor"])
	assert.Equal(t, "op@example.com", e["user"])
	assert.Equal(t, "key:"+key["id"].(string), e["target"])

	// Listed by its user, never with the secret; last use recorded.
	code, body, raw = call(t, srv, http.MethodGet, "/api/v1/users/"+op.ID+"/tokens", secret, nil)
	require.Equal(t, http.StatusOK, code, raw)
	assert.NotContains(t, raw, secret)
	listed := body["tokens"].([]any)[0].(map[string]any)
	assert.Equal(t, tokID, listed["id"])
	assert.Equal(t, secret[:10], listed["prefix"])
	assert.NotNil(t, listed["last_used_at"])

	// Too low a role: 403, the contract's shape, and nothing done.
	code, body, _ = call(t, srv, http.MethodPost, "/api/v1/users", secret, map[string]any{"email": "x@example.com", "role": "admin"})
	require.Equal(t, http.StatusForbidden, code)
	ee := body["error"].(map[string]any)
	assert.Equal(t, "forbidden", ee["type"])
	assert.Equal(t, "role_required", ee["code"])
	assert.Equal(t, "this needs the admin role", ee["message"])
	users, err := s.Users(ctx)
	require.NoError(t, err)
	assert.Len(t, users, 1, "no user was made")

	// Disabled: refused at the next request; enabled again, it works.
	code, _, _ = call(t, srv, http.MethodPatch, "/api/v1/users/"+op.ID, testAdminToken, map[string]any{"disabled": true})
	require.Equal(t, http.StatusOK, code)
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/accounts", secret, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "a disabled user's token")
	code, _, _ = call(t, srv, http.MethodPatch, "/api/v1/users/"+op.ID, testAdminToken, map[string]any{"disabled": false})
	require.Equal(t, http.StatusOK, code)
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/accounts", secret, nil)
	assert.Equal(t, http.StatusOK, code)

	// Expired.
	clk.Add(24 * time.Hour)
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/accounts", secret, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "an expired token")

	// Revoked by its user (with another token of theirs).
	_, second, err := s.CreateUserToken(ctx, store.UserToken{UserID: op.ID, Name: "laptop"})
	require.NoError(t, err)
	_, third, err := s.CreateUserToken(ctx, store.UserToken{UserID: op.ID, Name: "spare"})
	require.NoError(t, err)
	tokens, err := s.UserTokens(ctx, op.ID)
	require.NoError(t, err)
	var secondID string
	for _, t := range tokens {
		if t.Name == "laptop" {
			secondID = t.ID
		}
	}
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/accounts", second, nil)
	require.Equal(t, http.StatusOK, code)
	code, body, raw = call(t, srv, http.MethodDelete, "/api/v1/users/"+op.ID+"/tokens/"+secondID, third, nil)
	require.Equal(t, http.StatusOK, code, raw)
	assert.NotNil(t, body["revoked_at"])
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/accounts", second, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "a revoked token")
}

// Other people's tokens are an admin's: a viewer lists and revokes only
// their own; a token narrower than its user makes no wider token.
func TestOtherPeoplesTokens(t *testing.T) {
	srv, s, _ := clockedServer(t)
	ctx := context.Background()
	pp := addPeople(t, s)
	viewerTok, opTok := pp.tokens["viewer"], pp.tokens["operator"]
	opID := pp.users["operator"].ID
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/users/" + opID + "/tokens"},
		{http.MethodPost, "/api/v1/users/" + opID + "/tokens"},
		{http.MethodDelete, "/api/v1/users/" + opID + "/tokens/x"},
	} {
		code, body, _ := call(t, srv, r.method, r.path, viewerTok, map[string]any{"name": "mine now"})
		assert.Equal(t, http.StatusForbidden, code, "%s %s", r.method, r.path)
		c, _ := errorOf(t, body)
		assert.Equal(t, "role_required", c)
	}
	ts, err := s.UserTokens(ctx, opID)
	require.NoError(t, err)
	assert.Len(t, ts, 1, "no token was made for the operator")
	code, _, _ := call(t, srv, http.MethodGet, "/api/v1/users/"+opID+"/tokens", opTok, nil)
	assert.Equal(t, http.StatusOK, code, "one's own")
	code, body, _ := call(t, srv, http.MethodPost, "/api/v1/users/"+opID+"/tokens", pp.tokens["admin"], map[string]any{"name": "wide", "role": "admin"})
	assert.Equal(t, http.StatusBadRequest, code, "a token's role narrows its user's, never widens it")
	_, field := errorOf(t, body)
	assert.Equal(t, "role", field)
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/users/"+opID+"/tokens", pp.tokens["admin"], nil)
	assert.Equal(t, http.StatusOK, code, "an admin's: anyone's")

	// An admin's viewer token acts as a viewer, and makes viewer tokens.
	adminID := pp.users["admin"].ID
	_, narrow, err := s.CreateUserToken(ctx, store.UserToken{UserID: adminID, Name: "read-only", Role: "viewer"})
	require.NoError(t, err)
	code, _, _ = call(t, srv, http.MethodPost, "/api/v1/users", narrow, map[string]any{"email": "z@example.com", "role": "viewer"})
	assert.Equal(t, http.StatusForbidden, code)
	code, made, raw := call(t, srv, http.MethodPost, "/api/v1/users/"+adminID+"/tokens", narrow, map[string]any{"name": "wider?"})
	require.Equal(t, http.StatusCreated, code, raw)
	assert.Equal(t, "viewer", made["role"], "no wider than the token it was made with")
	code, _, _ = call(t, srv, http.MethodPut, "/api/v1/prices", made["token"].(string), map[string]any{})
	assert.Equal(t, http.StatusForbidden, code)
}

// A console session signed in with a personal token acts as its user with
// the token's role, stops when the user is disabled or the token revoked,
// and shows a viewer no action a viewer cannot take.
func TestConsoleSessionOfAPerson(t *testing.T) {
	srv, s, _ := clockedServer(t)
	ctx := context.Background()
	pp := addPeople(t, s)
	b := newBrowser(t, srv)
	loginWith(t, b, pp.tokens["viewer"])

	rec := b.get("/admin/keys")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "viewer · viewer@example.com")
	assert.NotContains(t, body(rec), "Create a client key")
	rec = b.get("/admin/bindings")
	assert.NotContains(t, body(rec), `action="/admin/bindings/reset"`)
	rec = b.get("/admin/accounts")
	assert.NotContains(t, body(rec), `action="/admin/accounts/signin"`)
	assert.NotContains(t, body(rec), `href="/admin/people"`, "People is an admin's")

	// Forced: refused, nothing done.
	rec = b.post("/admin/keys", url.Values{"name": {"forced"}})
	assert.Equal(t, http.StatusForbidden, rec.Code)
	assert.Contains(t, body(rec), "needs the operator role")
	keys, err := s.ClientKeys(ctx)
	require.NoError(t, err)
	assert.Empty(t, keys)

	entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "login"})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "viewer@example.com", entries[0].Actor, "a person's session is audited as them")

	// Disabled: the session stops at its next request.
	yes := true
	_, _, err = s.UpdateUser(ctx, pp.users["viewer"].ID, store.UserChange{Disabled: &yes})
	require.NoError(t, err)
	rec = b.get("/admin/keys")
	assert.Equal(t, http.StatusSeeOther, rec.Code, "back to the login page")

	// A session signed in with a token ends with the token.
	a := newBrowser(t, srv)
	a.addr = "192.0.2.11:40000"
	loginWith(t, a, pp.tokens["admin"])
	rec = a.get("/admin/people")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "operator@example.com")
	ts, err := s.UserTokens(ctx, pp.users["admin"].ID)
	require.NoError(t, err)
	_, err = s.RevokeUserToken(ctx, pp.users["admin"].ID, ts[0].ID)
	require.NoError(t, err)
	rec = a.get("/admin/people")
	assert.Equal(t, http.StatusSeeOther, rec.Code)
}

// The People page adds a person, changes their role and disables them, as
// the API does (and audited the same).
func TestPeoplePage(t *testing.T) {
	srv, s, _ := clockedServer(t)
	ctx := context.Background()
	b := newBrowser(t, srv)
	b.login()
	rec := b.get("/admin/people")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "No people yet")
	rec = b.post("/admin/people", url.Values{"email": {"new@example.com"}, "name": {"New"}, "role": {"operator"}})
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	u, err := s.UserByEmail(ctx, "new@example.com")
	require.NoError(t, err)
	assert.Equal(t, "operator", string(u.Role))

	rec = b.post("/admin/people", url.Values{"email": {"NEW@example.com"}, "role": {"viewer"}})
	assert.Equal(t, http.StatusConflict, rec.Code)
	assert.Contains(t, body(rec), "a user with that address exists")

	rec = b.post("/admin/people/"+u.ID, url.Values{"do": {"role"}, "role": {"admin"}})
	require.Equal(t, http.StatusSeeOther, rec.Code)
	rec = b.post("/admin/people/"+u.ID, url.Values{"do": {"disable"}})
	require.Equal(t, http.StatusSeeOther, rec.Code)
	u, err = s.User(ctx, u.ID)
	require.NoError(t, err)
	assert.Equal(t, "admin", string(u.Role))
	assert.True(t, u.Disabled())
	rec = b.get("/admin/people")
	assert.Contains(t, body(rec), "disabled")

	rec = b.get("/admin/audit?actor=admin-token")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), `<option value="new@example.com">`, "the filter offers every person")
	assert.Contains(t, body(rec), "new@example.com: disabled no → yes")
	assert.Contains(t, body(rec), "new@example.com: role operator → admin")
}

// An open live view of a person ends at its next update once they are
// disabled, as their next page would be refused.
func TestLiveViewEndsWhenItsPersonIsDisabled(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := rolesServer(t, s)
	pp := addPeople(t, s)
	b := newBrowser(t, srv)
	loginWith(t, b, pp.tokens["viewer"])
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	live, stop := openLive(t, ts, b, "/admin/live/overview")
	defer stop()
	assert.Contains(t, nextEvent(t, live), "Accounts available")
	yes := true
	_, _, err := s.UpdateUser(context.Background(), pp.users["viewer"].ID, store.UserChange{Disabled: &yes})
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, live)
	assert.NoError(t, err, "the stream ends")
}

// A usage report is a viewer's to read; its CSV export is an operator's.
func TestUsageExportNeedsAnOperator(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := rolesServer(t, s)
	pp := addPeople(t, s)
	code, _, _ := call(t, srv, http.MethodGet, "/api/v1/usage", pp.tokens["viewer"], nil)
	assert.Equal(t, http.StatusOK, code)
	code, body, _ := call(t, srv, http.MethodGet, "/api/v1/usage?format=csv", pp.tokens["viewer"], nil)
	assert.Equal(t, http.StatusForbidden, code)
	c, _ := errorOf(t, body)
	assert.Equal(t, "role_required", c)
	code, _, raw := call(t, srv, http.MethodGet, "/api/v1/usage?format=csv", pp.tokens["operator"], nil)
	assert.Equal(t, http.StatusOK, code, raw)
}

// The console's tokens page: a person makes a token (shown once), which
// works on the API until they revoke it there; another person's tokens are
// an admin's to see; the admin token, not a person, has none.
func TestConsoleTokensPage(t *testing.T) {
	srv, s, clk := clockedServer(t)
	ctx := context.Background()
	pp := addPeople(t, s)
	b := newBrowser(t, srv)
	loginWith(t, b, pp.tokens["viewer"])
	rec := b.get("/admin/tokens")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "viewer-token")
	clk.Add(time.Second) // tokens list newest first
	rec = b.post("/admin/tokens", url.Values{"name": {"from the console"}, "expires_in": {"720h"}})
	require.Equal(t, http.StatusOK, rec.Code, body(rec))
	secret := regexpFind(`id="new-token" readonly value="(crp_[0-9A-Za-z]+)"`, body(rec))
	require.NotEmpty(t, secret, "the token is shown once")
	assert.NotContains(t, body(b.get("/admin/tokens")), secret, "and never again")
	code, _, _ := call(t, srv, http.MethodGet, "/api/v1/keys", secret, nil)
	assert.Equal(t, http.StatusOK, code)

	ts, err := s.UserTokens(ctx, pp.users["viewer"].ID)
	require.NoError(t, err)
	require.Len(t, ts, 2)
	assert.Equal(t, "from the console", ts[0].Name)
	assert.False(t, ts[0].ExpiresAt.IsZero())
	rec = b.post("/admin/tokens/"+ts[0].ID+"/revoke", nil)
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	code, _, _ = call(t, srv, http.MethodGet, "/api/v1/keys", secret, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "revoked in the console")

	opID := pp.users["operator"].ID
	rec = b.get("/admin/tokens?user=" + opID)
	assert.Equal(t, http.StatusForbidden, rec.Code)
	assert.Contains(t, body(rec), "needs the admin role")
	rec = b.post("/admin/tokens", url.Values{"user": {opID}, "name": {"theirs now"}})
	assert.Equal(t, http.StatusForbidden, rec.Code)
	ts, err = s.UserTokens(ctx, opID)
	require.NoError(t, err)
	assert.Len(t, ts, 1, "no token was made for the operator")

	a := newBrowser(t, srv)
	a.addr = "192.0.2.11:40000"
	a.login()
	assert.NotContains(t, body(a.get("/admin/")), `href="/admin/tokens"`, "the admin token has no tokens of its own")
	assert.Contains(t, body(b.get("/admin/")), `<a class="who" href="/admin/tokens"`, "a person reaches theirs from their name")
	assert.Contains(t, body(a.get("/admin/people")), `href="/admin/tokens?user=`+opID+`"`)
	rec = a.get("/admin/tokens?user=" + opID)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "Tokens of operator@example.com")
	assert.Contains(t, body(rec), "operator-token")
}

// A person's console sessions are listed on their page, this one marked,
// and "Sign out everywhere" ends all of them on their next request (this
// one too); another person's need an admin, who may end them.
func TestConsoleSignOutEverywhere(t *testing.T) {
	srv, s, _ := clockedServer(t)
	ctx := context.Background()
	pp := addPeople(t, s)
	laptop, phone := newBrowser(t, srv), newBrowser(t, srv)
	loginWith(t, laptop, pp.tokens["viewer"])
	loginWith(t, phone, pp.tokens["viewer"])
	page := body(laptop.get("/admin/tokens"))
	assert.Equal(t, 2, strings.Count(page, "a personal token</td>"), "both sessions listed: %s", page)
	assert.Contains(t, page, "this one")

	op := newBrowser(t, srv)
	loginWith(t, op, pp.tokens["operator"])
	viewerID := pp.users["viewer"].ID
	rec := op.post("/admin/sessions/signout", url.Values{"user": {viewerID}})
	assert.Equal(t, http.StatusForbidden, rec.Code, "another person's sessions need an admin")
	assert.Equal(t, http.StatusOK, phone.get("/admin/keys").Code, "still signed in")

	rec = laptop.post("/admin/sessions/signout", nil)
	require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
	assert.Equal(t, "/admin/login", rec.Header().Get("Location"))
	for _, b := range []*browser{laptop, phone} {
		rec := b.get("/admin/keys")
		assert.Equal(t, http.StatusSeeOther, rec.Code, "signed out everywhere")
	}
	assert.Equal(t, http.StatusOK, op.get("/admin/keys").Code, "another person's session stands")
	left, err := s.ConsoleSessionsOf(ctx, viewerID, time.Now())
	require.NoError(t, err)
	assert.Empty(t, left)
	entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "sessions.revoke"})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "user:"+viewerID, entries[0].Target)
}
