package web

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// bindingFixture is two accounts and the bindings of two Codex sessions:
// s1 with threads t1 and t2 on account a, s2 with thread t3 on account b
// under client key k1.
type bindingFixture struct {
	a, b store.Account
}

func seedBindings(t *testing.T, s *store.Store) bindingFixture {
	t.Helper()
	ctx := context.Background()
	var f bindingFixture
	var err error
	f.a, err = s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "alpha", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	f.b, err = s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "beta", BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
	require.NoError(t, err)
	for _, p := range []store.Placement{
		{ThreadKey: "v1:st:s1:t1", SessionKey: "v1:s:s1", SessionID: "s1", ThreadID: "t1", AccountID: f.a.ID, SeedSession: true},
		{ThreadKey: "v1:st:s1:t2", SessionKey: "v1:s:s1", SessionID: "s1", ThreadID: "t2", AccountID: f.a.ID},
		{ClientScope: "k1", ThreadKey: "v1:st:s2:t3", SessionKey: "v1:s:s2", SessionID: "s2", ThreadID: "t3", AccountID: f.b.ID, SeedSession: true},
	} {
		p.Source, p.TTL = "admission", time.Hour
		require.NoError(t, s.Place(ctx, p))
	}
	return f
}

func TestBindingsAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s)
		srv, fr := consoleServer(t, s)

		code, list, raw := call(t, srv, http.MethodGet, "/api/v1/bindings", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.EqualValues(t, 5, list["total"], "three thread rows and two session preferences")
		assert.Len(t, list["bindings"], 5)

		for _, tc := range []struct {
			query string
			total int
		}{
			{"session=s1", 3}, {"thread=t1", 1}, {"account=" + f.b.ID, 2}, {"client_key=k1", 2},
			{"kind=session", 2}, {"kind=thread&account=" + f.a.ID, 2}, {"thread=nope", 0},
		} {
			code, list, raw := call(t, srv, http.MethodGet, "/api/v1/bindings?"+tc.query, testAdminToken, nil)
			require.Equal(t, http.StatusOK, code, raw)
			assert.EqualValues(t, tc.total, list["total"], tc.query)
			assert.Len(t, list["bindings"], tc.total, tc.query)
		}
		code, page, _ := call(t, srv, http.MethodGet, "/api/v1/bindings?limit=2&offset=4", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 5, page["total"])
		assert.Len(t, page["bindings"], 1, "the last page")
		for _, bad := range []struct{ query, field string }{{"kind=soft", "kind"}, {"limit=0", "limit"}, {"limit=5000", "limit"}, {"offset=-1", "offset"}, {"limit=x", "limit"}} {
			code, body, _ := call(t, srv, http.MethodGet, "/api/v1/bindings?"+bad.query, testAdminToken, nil)
			require.Equal(t, http.StatusBadRequest, code, bad.query)
			_, field := errorOf(t, body)
			assert.Equal(t, bad.field, field)
		}

		code, list, _ = call(t, srv, http.MethodGet, "/api/v1/bindings?thread=t1", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		row := list["bindings"].([]any)[0].(map[string]any)
		assert.Equal(t, "thread", row["kind"])
		assert.Equal(t, "soft", row["strength"])
		assert.Equal(t, false, row["pin"])
		assert.Equal(t, f.a.ID, row["account_id"])
		assert.Equal(t, "s1", row["session_id"])
		assert.Equal(t, "admission", row["source"])
		assert.NotNil(t, row["expires_at"])
		_, err := time.Parse(time.RFC3339, row["created_at"].(string))
		assert.NoError(t, err, "times are RFC 3339")
		id := row["id"].(string)

		code, one, _ := call(t, srv, http.MethodGet, "/api/v1/bindings/"+id, testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, id, one["id"])
		code, body, _ := call(t, srv, http.MethodGet, "/api/v1/bindings/bnd_missing", testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)
		c, _ := errorOf(t, body)
		assert.Equal(t, "not_found", c)

		// Pins: a hard raw row, shown as a pin.
		code, pin, raw := call(t, srv, http.MethodPost, "/api/v1/bindings", testAdminToken, map[string]any{"thread_id": "t9", "account_id": f.b.ID})
		require.Equal(t, http.StatusCreated, code, raw)
		assert.Equal(t, "raw_thread", pin["kind"])
		assert.Equal(t, "hard", pin["strength"])
		assert.Equal(t, true, pin["pin"])
		assert.Nil(t, pin["expires_at"], "a pin does not expire")
		assert.Equal(t, "pin", pin["source"])
		code, spin, raw := call(t, srv, http.MethodPost, "/api/v1/bindings", testAdminToken, map[string]any{"session_id": "s2", "account_id": f.a.ID})
		require.Equal(t, http.StatusCreated, code, raw)
		assert.Equal(t, "raw_session", spin["kind"])
		got, err := s.BindingsFor(ctx, store.BindingLookup{RawSession: "s2"})
		require.NoError(t, err)
		require.Len(t, got, 1, "the relay sees the pin")
		assert.Equal(t, f.a.ID, got[0].AccountID)
		for _, bad := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"account_id": f.a.ID}, "session_id"},
			{map[string]any{"session_id": "s", "thread_id": "t", "account_id": f.a.ID}, "thread_id"},
			{map[string]any{"thread_id": "t"}, "account_id"},
			{map[string]any{"thread_id": "t", "account_id": "acc_missing"}, "account_id"},
			{map[string]any{"thread_id": "t", "account_id": f.a.ID, "strength": "hard"}, "strength"},
		} {
			code, body, raw := call(t, srv, http.MethodPost, "/api/v1/bindings", testAdminToken, bad.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			_, field := errorOf(t, body)
			assert.Equal(t, bad.field, field, "%v", bad.body)
		}

		// Resets: exactly one of four, answered with a count; the relay forgets.
		for _, bad := range []map[string]any{{}, {"thread_id": "t1", "session_id": "s1"}, {"thread_id": ""}} {
			code, _, raw := call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, bad)
			assert.Equal(t, http.StatusBadRequest, code, raw)
		}
		code, _, _ = call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"thread": "t1"})
		assert.Equal(t, http.StatusBadRequest, code, "unknown field")
		assert.Empty(t, fr.forgottenIDs(), "refused resets reset nothing")

		code, n, raw := call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"thread_id": "t1"})
		require.Equal(t, http.StatusOK, code, raw)
		assert.EqualValues(t, 1, n["reset"])
		assert.Equal(t, []string{id}, fr.forgottenIDs(), "a thread reset is followed by Forget")
		code, n, _ = call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"thread_id": "t1"})
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 0, n["reset"], "nothing left to reset")
		code, n, _ = call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"session_id": "s1"})
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 2, n["reset"], "t2 and the session preference")
		code, n, _ = call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"account_id": f.b.ID})
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 3, n["reset"], "t3, s2's preference and the t9 pin")
		code, n, _ = call(t, srv, http.MethodPost, "/api/v1/bindings/reset", testAdminToken, map[string]any{"binding_id": spin["id"]})
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 1, n["reset"])
		_, total, err := s.Bindings(ctx, store.BindingFilter{IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, total)

		code, pin, _ = call(t, srv, http.MethodPost, "/api/v1/bindings", testAdminToken, map[string]any{"thread_id": "t9", "account_id": f.b.ID})
		require.Equal(t, http.StatusCreated, code)
		before := len(fr.forgottenIDs())
		code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/bindings/"+pin["id"].(string), testAdminToken, nil)
		assert.Equal(t, http.StatusNoContent, code)
		assert.Len(t, fr.forgottenIDs(), before+1, "DELETE is a reset: Forget is called")
		code, _, _ = call(t, srv, http.MethodDelete, "/api/v1/bindings/"+pin["id"].(string), testAdminToken, nil)
		assert.Equal(t, http.StatusNotFound, code)

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Actor: "admin-token"})
		require.NoError(t, err)
		var actions, targets []string
		for _, e := range entries {
			actions, targets = append(actions, e.Action), append(targets, e.Target)
			assert.Equal(t, "192.0.2.1", e.Address)
		}
		assert.Equal(t, []string{"binding.reset", "binding.pin", "binding.reset", "binding.reset", "binding.reset", "binding.reset", "binding.reset", "binding.pin", "binding.pin"}, actions)
		assert.Contains(t, targets, "thread:t1")
		assert.Contains(t, targets, "session:s1")
		assert.Contains(t, targets, "account:"+f.b.ID)
		assert.Contains(t, targets, "thread:t9")
	})
}

func TestLanesDiagnosticsRequestsAuditAPI(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, fr := consoleServer(t, s)
		opened := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
		fr.lanes = []relay.LaneInfo{{Kind: "direct", AccountID: "acc_a", SessionID: "s1", ThreadID: "t1", ThreadKey: "v1:st:x", OpenedAt: opened, Requests: 3}}
		code, lanes, _ := call(t, srv, http.MethodGet, "/api/v1/lanes", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		l := lanes["lanes"].([]any)[0].(map[string]any)
		assert.Equal(t, "direct", l["kind"])
		assert.Equal(t, "t1", l["thread_id"])
		assert.Equal(t, "2026-11-30T09:00:00Z", l["opened_at"])
		assert.EqualValues(t, 3, l["requests"])

		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "rep_test", Name: "host-a:1", Address: "http://10.0.0.1:2455", StartedAt: opened}))
		require.NoError(t, s.Heartbeat(ctx, store.Replica{ID: "rep_other", Name: "host-b:2", StartedAt: opened.Add(time.Minute), Lanes: json.RawMessage(`[{"kind":"bridge"},{"kind":"direct"}]`)}))
		code, reps, raw := call(t, srv, http.MethodGet, "/api/v1/replicas", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		require.Len(t, reps["replicas"], 2)
		self := reps["replicas"].([]any)[0].(map[string]any)
		other := reps["replicas"].([]any)[1].(map[string]any)
		assert.Equal(t, "host-a:1", self["name"])
		assert.Equal(t, true, self["self"])
		assert.Equal(t, "http://10.0.0.1:2455", self["address"])
		assert.Equal(t, false, other["self"])
		assert.EqualValues(t, 2, other["lanes"])

		start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_1", ThreadID: "t1", SessionID: "s1", AccountID: "acc_b", Transport: "http",
			Path: "/backend-api/codex/responses", Model: "m", Status: 200, Recovery: "failover", StartedAt: start, FirstEvent: 300 * time.Millisecond, Duration: time.Second}))
		require.NoError(t, s.LogRequest(ctx, store.RequestRecord{ID: "req_2", ThreadID: "t2", AccountID: "acc_a", Transport: "ws", Path: "/v1/responses", Status: 429, StartedAt: start.Add(time.Second)}))
		require.NoError(t, s.RecordAttempts(ctx, []store.Attempt{
			{RequestID: "req_1", Seq: 1, ThreadID: "t1", AccountID: "acc_a", Class: "usage_limit", Action: "next_account", Status: 429, Detail: "usage_limit_reached until 11:00", StartedAt: start, EndedAt: start.Add(50 * time.Millisecond)},
			{RequestID: "req_1", Seq: 2, ThreadID: "t1", AccountID: "acc_b", FromAccountID: "acc_a", Class: "ok", Recovery: "failover", Action: "done", Status: 200, StartedAt: start.Add(50 * time.Millisecond), EndedAt: start.Add(time.Second), FirstEvent: 250 * time.Millisecond},
			{RequestID: "req_2", Seq: 1, ThreadID: "t2", AccountID: "acc_a", Class: "usage_limit", Action: "terminal", Status: 429, StartedAt: start.Add(time.Second), EndedAt: start.Add(time.Second)},
		}))

		code, d, raw := call(t, srv, http.MethodGet, "/api/v1/diagnostics?class=usage_limit", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code, raw)
		assert.EqualValues(t, 2, d["total"])
		code, d, _ = call(t, srv, http.MethodGet, "/api/v1/diagnostics?request=req_1&account=acc_b", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		require.EqualValues(t, 1, d["total"])
		a := d["attempts"].([]any)[0].(map[string]any)
		assert.Equal(t, "acc_a", a["from_account_id"])
		assert.Equal(t, "failover", a["recovery"])
		assert.EqualValues(t, 950, a["duration_ms"])
		assert.EqualValues(t, 250, a["first_event_ms"])
		code, d, _ = call(t, srv, http.MethodGet, "/api/v1/diagnostics?thread=t2", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 1, d["total"])
		code, d, _ = call(t, srv, http.MethodGet, "/api/v1/diagnostics?recovery=failover", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 1, d["total"])

		code, r, _ := call(t, srv, http.MethodGet, "/api/v1/requests?transport=http", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		require.EqualValues(t, 1, r["total"])
		req := r["requests"].([]any)[0].(map[string]any)
		assert.Equal(t, "req_1", req["id"])
		assert.EqualValues(t, 300, req["first_event_ms"])
		assert.EqualValues(t, 1000, req["duration_ms"])
		assert.Equal(t, "2026-11-30T10:00:00Z", req["started_at"])
		code, r, _ = call(t, srv, http.MethodGet, "/api/v1/requests?account=acc_a&limit=1", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 1, r["total"])
		assert.Nil(t, r["requests"].([]any)[0].(map[string]any)["first_event_ms"])
		code, _, _ = call(t, srv, http.MethodGet, "/api/v1/requests?transport=carrier-pigeon", testAdminToken, nil)
		assert.Equal(t, http.StatusBadRequest, code)

		call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, map[string]any{"name": "ci"})
		code, au, _ := call(t, srv, http.MethodGet, "/api/v1/audit?action=key.", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		require.EqualValues(t, 1, au["total"])
		e := au["entries"].([]any)[0].(map[string]any)
		assert.Equal(t, "key.create", e["action"])
		assert.Equal(t, "admin-token", e["actor"])
		_, err := time.Parse(time.RFC3339, e["at"].(string))
		assert.NoError(t, err)
		code, au, _ = call(t, srv, http.MethodGet, "/api/v1/audit?actor=admin", testAdminToken, nil)
		require.Equal(t, http.StatusOK, code)
		assert.EqualValues(t, 0, au["total"])
	})
}

// Every account and key change through the API is audited, credentials never.
func TestAPIActionsAreAudited(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		srv, _ := consoleServer(t, s)
		code, acc, _ := call(t, srv, http.MethodPost, "/api/v1/accounts", testAdminToken, map[string]any{"label": "team", "api_key": "sk-secret-value"})
		require.Equal(t, http.StatusCreated, code)
		id := acc["id"].(string)
		call(t, srv, http.MethodPatch, "/api/v1/accounts/"+id, testAdminToken, map[string]any{"priority": 3, "api_key": "sk-rotated-secret"})
		call(t, srv, http.MethodPost, "/api/v1/accounts/"+id+"/pause", testAdminToken, map[string]any{"reason": "maintenance"})
		call(t, srv, http.MethodPost, "/api/v1/accounts/"+id+"/resume", testAdminToken, nil)
		code, k, _ := call(t, srv, http.MethodPost, "/api/v1/keys", testAdminToken, map[string]any{"name": "laptop"})
		require.Equal(t, http.StatusCreated, code)
		call(t, srv, http.MethodDelete, "/api/v1/keys/"+k["id"].(string), testAdminToken, nil)
		call(t, srv, http.MethodDelete, "/api/v1/accounts/"+id, testAdminToken, nil)
		call(t, srv, http.MethodPost, "/api/v1/accounts/acc_missing/pause", testAdminToken, nil)

		entries, _, err := s.AuditLog(context.Background(), store.AuditFilter{})
		require.NoError(t, err)
		var actions []string
		for i := len(entries) - 1; i >= 0; i-- {
			e := entries[i]
			actions = append(actions, e.Action)
			assert.Equal(t, "admin-token", e.Actor)
			assert.NotContains(t, e.Detail, "secret", "credentials never reach the audit log")
		}
		assert.Equal(t, []string{"account.create", "account.update", "account.pause", "account.resume", "key.create", "key.revoke", "account.delete"}, actions,
			"every successful action, in order; a failed one is not recorded")
		assert.Equal(t, "account:"+id, entries[0].Target)
		assert.Contains(t, entries[len(entries)-2].Detail, "priority")
		assert.Contains(t, entries[len(entries)-2].Detail, "api_key")
	})
}
