package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// editForm is the account page's form filled with a's settings, as the
// browser sends it when nothing was changed.
func editForm(a store.Account) url.Values {
	f := editFormOf(a)
	return url.Values{"label": {f.Label}, "base_url": {f.BaseURL}, "organization": {f.Organization}, "tags": {f.Tags},
		"priority": {f.Priority}, "max_concurrency": {f.MaxConcurrency}}
}

// The account page edits what PATCH /api/v1/accounts/{id} edits (but
// credentials), through the same validation: a refused form answers the
// API's message, shows what was typed (a proxy password excepted) and
// saves nothing, not even its valid fields.
func TestConsoleEditAccount(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, _ := consoleServer(t, s)
		a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "team", BaseURL: "http://127.0.0.1:9/v1",
			Organization: "org-a", Tags: []string{"blue"}, Priority: 3}, store.Credentials{APIKey: "sk-1"})
		require.NoError(t, err)
		b := newBrowser(t, srv)
		b.login()

		page := body(b.get("/admin/accounts"))
		assert.Contains(t, page, `href="/admin/accounts/`+a.ID+`"`, "the list links to the account's page")
		rec := b.get("/admin/accounts/" + a.ID)
		require.Equal(t, http.StatusOK, rec.Code)
		page = body(rec)
		for _, want := range []string{"Account team", `name="label" value="team"`, `name="priority" value="3"`, `name="tags" value="blue"`,
			`name="organization" value="org-a"`, "Remove account…", `action="/admin/accounts/` + a.ID + `"`} {
			assert.Contains(t, page, want)
		}

		// The API's answer for each refused value, to compare the console's with.
		apiMessage := func(body map[string]any) string {
			code, resp, raw := call(t, srv, http.MethodPatch, "/api/v1/accounts/"+a.ID, testAdminToken, body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			return resp["error"].(map[string]any)["message"].(string)
		}
		for _, tc := range []struct {
			name string
			set  url.Values
			want string // the message, or the API's for api
			api  map[string]any
		}{
			{name: "priority not a number", set: url.Values{"priority": {"high"}}, want: "priority: must be a whole number between -1000 and 1000"},
			{name: "priority out of range", set: url.Values{"priority": {"5000"}}, api: map[string]any{"priority": 5000}},
			{name: "max concurrency negative", set: url.Values{"max_concurrency": {"-1"}}, api: map[string]any{"max_concurrency": -1}},
			{name: "blank label", set: url.Values{"label": {" "}}, api: map[string]any{"label": " "}},
			{name: "bad base URL", set: url.Values{"base_url": {"ftp://x"}}, api: map[string]any{"base_url": "ftp://x"}},
			{name: "proxy with a bad scheme", set: url.Values{"proxy_url": {"ftp://127.0.0.1:21"}}, api: map[string]any{"proxy_url": "ftp://127.0.0.1:21"}},
			{name: "proxy without a port", set: url.Values{"proxy_url": {"socks5://bob:" + proxyPassword + "@10.0.0.5"}},
				api: map[string]any{"proxy_url": "socks5://bob:" + proxyPassword + "@10.0.0.5"}},
			{name: "a proxy and no proxy", set: url.Values{"proxy_url": {"http://127.0.0.1:3128"}, "no_proxy": {"1"}},
				want: "proxy_url: type a new proxy or tick “no proxy”, not both"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				form := editForm(a)
				form.Set("label", "renamed in vain") // valid, and lost with the rest
				form.Set("tags", "kept, as typed")
				for k, v := range tc.set {
					form[k] = v
				}
				want := tc.want
				if tc.api != nil {
					want = apiMessage(tc.api)
				}
				rec := b.post("/admin/accounts/"+a.ID, form)
				require.Equal(t, http.StatusBadRequest, rec.Code, body(rec))
				page := body(rec)
				assert.Contains(t, page, "flash-error")
				assert.Contains(t, unescape(page), "Not saved: "+want, "the API's message")
				assert.Contains(t, page, `value="kept, as typed"`, "what was typed is shown again")
				if tc.set.Get("label") == "" {
					assert.Contains(t, page, `value="renamed in vain"`)
				}
				if p := tc.set.Get("priority"); p != "" {
					assert.Contains(t, page, `name="priority" value="`+p+`"`)
				}
				if p := tc.set.Get("proxy_url"); p != "" && !strings.Contains(p, proxyPassword) {
					assert.Contains(t, page, `name="proxy_url" value="`+p+`"`, "a proxy without a password is shown again")
				}
				assert.NotContains(t, page, proxyPassword, "a proxy password is never sent back")
				if strings.Contains(tc.set.Get("proxy_url"), proxyPassword) {
					assert.Contains(t, page, "it holds a password")
				}
				stored, err := s.Account(ctx, a.ID)
				require.NoError(t, err)
				assert.Equal(t, "team", stored.Label, "nothing is saved")
				assert.Equal(t, []string{"blue"}, stored.Tags)
				assert.Equal(t, 3, stored.Priority)
			})
		}

		// A form without its CSRF token changes nothing.
		form := editForm(a)
		form.Set("label", "forged")
		form.Set("_csrf", "")
		rec = b.post("/admin/accounts/"+a.ID, form)
		assert.Equal(t, http.StatusForbidden, rec.Code)
		assert.Contains(t, body(rec), "CSRF")

		// An unknown account is a 404, to view and to save.
		assert.Equal(t, http.StatusNotFound, b.get("/admin/accounts/acc_missing").Code)
		rec = b.post("/admin/accounts/acc_missing", editForm(a))
		assert.Equal(t, http.StatusNotFound, rec.Code)
		assert.Contains(t, body(rec), "no such object")

		// Nothing changed: nothing written, nothing audited.
		rec = b.post("/admin/accounts/"+a.ID, editForm(a))
		require.Equal(t, http.StatusSeeOther, rec.Code)
		assert.Contains(t, body(b.get("/admin/accounts/"+a.ID)), "Nothing to save")

		form = editForm(a)
		form.Set("label", "  team two ")
		form.Set("priority", "-20")
		form.Set("tags", "green, , red")
		form.Set("max_concurrency", "4")
		form.Set("proxy_url", "socks5://bob:"+proxyPassword+"@10.0.0.5:1080")
		rec = b.post("/admin/accounts/"+a.ID, form)
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		assert.Equal(t, "/admin/accounts/"+a.ID, rec.Header().Get("Location"))
		page = body(b.get("/admin/accounts/" + a.ID))
		assert.Contains(t, page, "Saved team two: label, tags, priority, max_concurrency, proxy_url changed")
		assert.Contains(t, page, "socks5://bob:***@10.0.0.5:1080")
		assert.NotContains(t, page, proxyPassword)
		stored, err := s.Account(ctx, a.ID)
		require.NoError(t, err)
		assert.Equal(t, "team two", stored.Label)
		assert.Equal(t, -20, stored.Priority)
		assert.Equal(t, []string{"green", "red"}, stored.Tags)
		assert.Equal(t, 4, stored.MaxConcurrency)
		assert.Equal(t, "org-a", stored.Organization, "what the form did not change is kept")
		u, err := stored.Proxy.URL()
		require.NoError(t, err)
		assert.Equal(t, "socks5://bob:"+proxyPassword+"@10.0.0.5:1080", u.String())
		cred, err := s.Credentials(ctx, a.ID)
		require.NoError(t, err)
		assert.Equal(t, "sk-1", cred.APIKey, "credentials are not the form's")

		// A blank proxy field keeps the proxy; "no proxy" removes it; blank
		// tags clear the tags.
		form = editForm(stored)
		rec = b.post("/admin/accounts/"+a.ID, form)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		stored, err = s.Account(ctx, a.ID)
		require.NoError(t, err)
		assert.False(t, stored.Proxy.IsZero(), "a blank proxy field keeps the proxy")
		form.Set("no_proxy", "1")
		form.Set("tags", "")
		rec = b.post("/admin/accounts/"+a.ID, form)
		require.Equal(t, http.StatusSeeOther, rec.Code)
		stored, err = s.Account(ctx, a.ID)
		require.NoError(t, err)
		assert.True(t, stored.Proxy.IsZero(), "no proxy removes it")
		assert.Empty(t, stored.Tags)

		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account.update"})
		require.NoError(t, err)
		var details []string
		for _, e := range entries {
			assert.Equal(t, "admin-token", e.Actor)
			assert.Equal(t, "account:"+a.ID, e.Target)
			assert.NotContains(t, e.Detail, proxyPassword)
			details = append(details, e.Detail)
		}
		assert.Equal(t, []string{`tags "green,red" → (none); proxy_url "socks5://bob:***@10.0.0.5:1080" → (none)`,
			`label "team" → "team two"; tags "blue" → "green,red"; priority "3" → "-20"; max_concurrency "0" → "4"; proxy_url (none) → "socks5://bob:***@10.0.0.5:1080"`},
			details, "one entry a save that changed something, naming what, before and after (the proxy without its password)")
	})
}

// unescape undoes templ's escaping of the characters the messages hold.
func unescape(page string) string {
	return strings.NewReplacer("&#34;", `"`, "&#39;", "'", "&amp;", "&", "&lt;", "<", "&gt;", ">").Replace(page)
}

// Removal asks first, on a page that says what goes with the account: its
// bindings (so its threads move), its pins, and what the client keys
// limited to it lose; confirmed, it does what DELETE /api/v1/accounts/{id}
// does.
func TestConsoleRemoveAccount(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		f := seedBindings(t, s) // alpha: threads t1, t2 and session s1; beta: t3 and s2
		srv, fr := consoleServer(t, s)
		_, err := s.Pin(ctx, store.BindRawThread, "t-pinned", f.a.ID, "pin")
		require.NoError(t, err)
		_, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "alpha only", ScopeAccounts: []string{f.a.ID}})
		require.NoError(t, err)
		_, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "both", ScopeAccounts: []string{f.a.ID, f.b.ID}})
		require.NoError(t, err)
		fr.inflight[f.a.ID] = 2
		b := newBrowser(t, srv)
		b.login()

		rec := b.get("/admin/accounts/" + f.a.ID + "/remove")
		require.Equal(t, http.StatusOK, rec.Code)
		page := unescape(body(rec))
		for _, want := range []string{
			"Removing alpha does this",
			"Its 2 thread bindings and 1 session binding are deleted with it.",
			"Each of those threads goes to another account at its next request, with its history",
			"Its 1 thread pin and 0 session pins are deleted",
			"2 requests in flight on this replica and 0 live lanes finish their turn on it",
			"Client keys limited to this account alone serve nothing until their scope changes:</strong> alpha only.",
			"Client keys limited to this account and others use the others: both.",
			`action="/admin/accounts/` + f.a.ID + `/remove"`,
		} {
			assert.Contains(t, page, want)
		}
		assert.NotContains(t, page, "It is the last account")

		rec = b.post("/admin/accounts/"+f.a.ID+"/remove", url.Values{"_csrf": {""}})
		assert.Equal(t, http.StatusForbidden, rec.Code, "no CSRF token, no removal")
		_, err = s.Account(ctx, f.a.ID)
		require.NoError(t, err, "still there")

		rec = b.post("/admin/accounts/"+f.a.ID+"/remove", nil)
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		assert.Equal(t, "/admin/accounts", rec.Header().Get("Location"))
		assert.Contains(t, body(b.get("/admin/accounts")), "Removed alpha and its bindings")
		_, err = s.Account(ctx, f.a.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		_, total, err := s.Bindings(ctx, store.BindingFilter{AccountID: f.a.ID, IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, total, "its bindings went with it")
		_, total, err = s.Bindings(ctx, store.BindingFilter{AccountID: f.b.ID})
		require.NoError(t, err)
		assert.Equal(t, 2, total, "the other account's are kept")
		entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account.delete"})
		require.NoError(t, err)
		require.Len(t, entries, 1)
		assert.Equal(t, "account:"+f.a.ID, entries[0].Target)
		assert.Equal(t, "admin-token", entries[0].Actor)

		// The last account: the page says every request fails.
		page = unescape(body(b.get("/admin/accounts/" + f.b.ID + "/remove")))
		assert.Contains(t, page, "It is the last account")
		assert.Equal(t, http.StatusNotFound, b.get("/admin/accounts/"+f.a.ID+"/remove").Code)
		assert.Equal(t, http.StatusNotFound, b.post("/admin/accounts/"+f.a.ID+"/remove", nil).Code)
	})
}

// Resume is offered, on the list and the account's page, for every status
// the API's resume clears (paused, limited until a reset, waiting for a new
// login, disabled), never for an active account; it returns the account
// to service with no end time, and comes back to the page it was sent
// from.
func TestConsoleResumeAccount(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	srv, _ := consoleServer(t, s)
	b := newBrowser(t, srv)
	b.login()
	for _, st := range []store.Status{store.StatusPaused, store.StatusRateLimited, store.StatusQuotaExceeded, store.StatusReauthRequired, store.StatusDisabled} {
		t.Run(string(st), func(t *testing.T) {
			a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "acct " + string(st), BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "k"})
			require.NoError(t, err)
			_, err = s.SetAccountStatus(ctx, a.ID, st, "because", time.Now().Add(time.Hour))
			require.NoError(t, err)
			button := `data-resume="` + a.ID + `"`
			assert.Contains(t, body(b.get("/admin/accounts")), button, "the list offers Resume")
			assert.Contains(t, body(b.get("/admin/accounts/"+a.ID)), button, "the account's page offers Resume")

			rec := b.post("/admin/accounts/"+a.ID+"/resume", url.Values{"return": {"/admin/accounts/" + a.ID}})
			require.Equal(t, http.StatusSeeOther, rec.Code)
			assert.Equal(t, "/admin/accounts/"+a.ID, rec.Header().Get("Location"), "back to the account's page")
			page := body(b.get("/admin/accounts/" + a.ID))
			assert.Contains(t, page, "Resumed acct "+string(st))
			assert.NotContains(t, page, button, "nothing left to resume")
			got, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, got.Status)
			assert.True(t, got.StatusUntil.IsZero())
		})
	}
	rec := b.post("/admin/accounts/acc_x/resume", url.Values{"return": {"https://evil.example/"}})
	require.Equal(t, http.StatusSeeOther, rec.Code)
	assert.Equal(t, "/admin/accounts", rec.Header().Get("Location"), "a return address outside the console is not followed")
	entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "account.resume"})
	require.NoError(t, err)
	assert.Len(t, entries, 5)
}
