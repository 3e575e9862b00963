package web

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// searchFixture is a store with one of each thing the search finds, some
// sharing the beginnings of their ids and names.
type searchFixture struct {
	alpha, beta   store.Account
	laptop, ci    store.ClientKey
	revoked       store.ClientKey
	bindingsFixed bindingFixture
}

func seedSearch(t *testing.T, s *store.Store) searchFixture {
	t.Helper()
	ctx := context.Background()
	f := searchFixture{bindingsFixed: seedBindings(t, s)} // accounts alpha, beta; threads t1, t2 (session s1), t3 (s2)
	f.alpha, f.beta = f.bindingsFixed.a, f.bindingsFixed.b
	var err error
	f.laptop, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "Laptop of Ana"})
	require.NoError(t, err)
	f.ci, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "laptop-ci"})
	require.NoError(t, err)
	f.revoked, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "old build box"})
	require.NoError(t, err)
	_, err = s.RevokeClientKey(ctx, f.revoked.ID)
	require.NoError(t, err)
	at := time.Now().Add(-time.Minute)
	for _, r := range []store.RequestRecord{
		{ID: "req_01search0000000000000001", ThreadKey: "v1:st:s1:t1", ThreadID: "t1", SessionID: "s1", AccountID: f.alpha.ID, ClientKeyID: f.laptop.ID},
		{ID: "req_01search0000000000000002", ThreadKey: "v1:st:s9:thread-gone", ThreadID: "thread-gone-01", SessionID: "session-gone-01", AccountID: f.beta.ID},
		{ID: "req_01search0000000000000003", ThreadKey: "v1:st:root-01:root-01", ThreadID: "root-01", SessionID: "root-01", AccountID: f.beta.ID},
	} {
		r.Transport, r.Path, r.Status, r.StartedAt = "http", "/backend-api/codex/responses", 200, at
		require.NoError(t, s.LogRequest(ctx, r))
	}
	return f
}

// The search resolver: exact ids and names first (names ignoring case),
// else what a query of at least 6 characters begins; each thing to its
// page.
func TestSearchResolver(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedSearch(t, s)
		srv, _ := consoleServer(t, s)
		n, err := srv.names(ctx)
		require.NoError(t, err)
		ix := searchIndex{accounts: n.accounts, keys: n.keys, find: s.FindIDs}
		type hit struct{ kind, id, url string }
		for _, c := range []struct {
			name, q string
			prefix  bool
			want    []hit
		}{
			{name: "empty", q: "  "},
			{name: "a request id", q: "req_01search0000000000000002",
				want: []hit{{"request", "req_01search0000000000000002", "/admin/requests/req_01search0000000000000002"}}},
			{name: "a bound thread id", q: "t1", want: []hit{{"thread", "t1", "/admin/bindings?thread=t1"}}},
			{name: "a thread key is its thread", q: "v1:st:s2:t3", want: []hit{{"thread", "t3", "/admin/bindings?thread=t3"}}},
			{name: "a thread only the request log knows", q: "thread-gone-01",
				want: []hit{{"thread", "thread-gone-01", "/admin/requests?thread=thread-gone-01"}}},
			{name: "a root thread and its session of the same id are one", q: "root-01",
				want: []hit{{"thread", "root-01", "/admin/requests?session=root-01"}}},
			{name: "a session id", q: "s2", want: []hit{{"session", "s2", "/admin/bindings?session=s2"}}},
			{name: "a session key is its session", q: "v1:s:s1", want: []hit{{"session", "s1", "/admin/bindings?session=s1"}}},
			{name: "a key by id", q: f.ci.ID, want: []hit{{"client key", f.ci.ID, "/admin/keys/" + f.ci.ID}}},
			{name: "a key by name, any case", q: "LAPTOP OF ANA", want: []hit{{"client key", f.laptop.ID, "/admin/keys/" + f.laptop.ID}}},
			{name: "a revoked key is found too", q: "old build box", want: []hit{{"client key", f.revoked.ID, "/admin/keys/" + f.revoked.ID}}},
			{name: "an account by label", q: "Beta", want: []hit{{"account", f.beta.ID, "/admin/accounts/" + url.PathEscape(f.beta.ID)}}},
			{name: "an account by id", q: f.alpha.ID, want: []hit{{"account", f.alpha.ID, "/admin/accounts/" + url.PathEscape(f.alpha.ID)}}},
			{name: "a unique prefix", q: "thread-go", prefix: true,
				want: []hit{{"thread", "thread-gone-01", "/admin/requests?thread=thread-gone-01"}}},
			{name: "a prefix matching several", q: "req_01search", prefix: true, want: []hit{
				{"request", "req_01search0000000000000001", "/admin/requests/req_01search0000000000000001"},
				{"request", "req_01search0000000000000002", "/admin/requests/req_01search0000000000000002"},
				{"request", "req_01search0000000000000003", "/admin/requests/req_01search0000000000000003"}}},
			{name: "a name prefix matches both keys, any case", q: "LAPTOP", prefix: true, want: []hit{
				{"client key", f.laptop.ID, "/admin/keys/" + f.laptop.ID}, {"client key", f.ci.ID, "/admin/keys/" + f.ci.ID}}},
			{name: "an exact match wins over prefixes", q: "laptop-ci", want: []hit{{"client key", f.ci.ID, "/admin/keys/" + f.ci.ID}}},
			{name: "a prefix under 6 characters matches nothing", q: "laptp"},
			{name: "a 5-character beginning of a label is too short", q: "alph"},
			{name: "nothing", q: "no-such-thing-at-all"},
		} {
			hits, prefix, err := ix.resolve(ctx, c.q)
			require.NoError(t, err, c.name)
			var got []hit
			for _, h := range hits {
				got = append(got, hit{h.Kind, h.ID, h.URL})
			}
			assert.Equal(t, c.want, got, c.name)
			assert.Equal(t, c.prefix, prefix, c.name)
		}
	})
}

// GET /admin/search: one match is a redirect to its page, several are a
// list, none says so; the query stays in the header's box.
func TestConsoleSearch(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	f := seedSearch(t, s)
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()

	rec := b.get("/admin/search?q=" + url.QueryEscape("laptop of ana"))
	require.Equal(t, http.StatusSeeOther, rec.Code)
	assert.Equal(t, "/admin/keys/"+f.laptop.ID, rec.Header().Get("Location"))

	rec = b.get("/admin/search?q=req_01search")
	require.Equal(t, http.StatusOK, rec.Code)
	page := body(rec)
	assert.Contains(t, page, "3 matches for “req_01search”")
	assert.Contains(t, page, "nothing matched exactly")
	assert.Contains(t, page, `href="/admin/requests/req_01search0000000000000001"`)
	assert.Contains(t, page, `href="/admin/requests/req_01search0000000000000002"`)
	assert.Contains(t, page, `name="q" value="req_01search"`, "the box keeps the query")

	rec = b.get("/admin/search?q=zzz")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, body(rec), "Nothing matched “zzz”")
	assert.Contains(t, body(rec), "Only exact ids and names match under 6 characters")

	page = body(b.get("/admin/"))
	assert.Contains(t, page, `action="/admin/search"`, "every page has the search box")
}
