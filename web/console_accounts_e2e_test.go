package web_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

// The Accounts page in a real browser, at 1280 and at 390 px wide, each
// width with accounts of its own: an account's label, priority and tags
// are edited on its page (a bad priority refused first, the form keeping
// what was typed) and read back through the API; an account with bindings
// is removed through its confirmation page; a paused one is resumed from
// the list; and "Sign in with ChatGPT" runs the device-code login against
// the simulated upstream's auth server, its page following it live until
// the account appears. Screenshots in test-output/accounts.
func TestConsoleAccountsInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)

	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "alice", Kind: sim.KindChatGPT, AccessToken: "at-alice", RefreshToken: "rt-alice", ChatGPTAccountID: "cg-alice", Email: "alice@example.com", Organization: "org-a"},
		{ID: "bob", Kind: sim.KindChatGPT, AccessToken: "at-bob", RefreshToken: "rt-bob", ChatGPTAccountID: "cg-bob", Email: "bob@example.com", Organization: "org-a"},
	}})
	t.Cleanup(upstream.Close)
	require.NoError(t, upstream.SetDeviceLogin(0, 0))
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()

	type widthAccounts struct {
		Edit   string `json:"edit"`
		Remove string `json:"remove"`
		Paused string `json:"paused"`
		SignIn string `json:"signin"` // the sim account that approves the sign-in
	}
	ids := map[string]widthAccounts{}
	for w, signIn := range map[string]string{"1280": "alice", "390": "bob"} {
		add := func(label string, tags []string, priority int) store.Account {
			a, err := st.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: label + " " + w, BaseURL: upstream.URL + "/v1",
				Organization: "org-a", Tags: tags, Priority: priority}, store.Credentials{APIKey: "sk-" + label + w})
			require.NoError(t, err)
			return a
		}
		edit, remove, paused := add("editable", []string{"old"}, 1), add("doomed", nil, 0), add("resting", nil, 0)
		require.NoError(t, st.Place(ctx, store.Placement{ThreadKey: "v1:t:" + w, SessionKey: "v1:s:" + w, ThreadID: "thread-" + w, SessionID: "session-" + w,
			AccountID: remove.ID, Source: "admission", TTL: time.Hour, SeedSession: true}))
		_, err := st.SetAccountStatus(ctx, paused.ID, store.StatusPaused, "maintenance", time.Time{})
		require.NoError(t, err)
		ids[w] = widthAccounts{Edit: edit.ID, Remove: remove.ID, Paused: paused.ID, SignIn: signIn}
	}

	srv := web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken), LiveInterval: 200 * time.Millisecond,
		AuthURL: upstream.URL})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		srv.Close()
	})

	out := filepath.Join(root, "test-output", "accounts")
	require.NoError(t, os.MkdirAll(out, 0o755))
	started := time.Now().Add(-time.Second)
	spec, err := json.Marshal(ids)
	require.NoError(t, err)
	stdout := runBrowserScript(t, root, node, "accounts.mjs", 3*time.Minute, "RELAY_URL="+ts.URL, "ADMIN_TOKEN="+e2eAdminToken, "CHROMIUM="+chromium, "OUT_DIR="+out,
		"SIM_URL="+upstream.URL, "ACCOUNTS="+string(spec))
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var result struct {
		OK bool `json:"ok"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &result))
	require.True(t, result.OK)

	// What the browser did is in the store.
	for w, a := range ids {
		edited, err := st.Account(ctx, a.Edit)
		require.NoError(t, err)
		assert.Equal(t, "renamed "+w, edited.Label)
		assert.Equal(t, 42, edited.Priority)
		assert.Equal(t, []string{"e2e", "w" + w}, edited.Tags)
		_, err = st.Account(ctx, a.Remove)
		assert.ErrorIs(t, err, store.ErrNotFound, "removed at %s px", w)
		_, bound, err := st.Bindings(ctx, store.BindingFilter{AccountID: a.Remove, IncludeExpired: true})
		require.NoError(t, err)
		assert.Zero(t, bound, "its bindings went with it")
		resumed, err := st.Account(ctx, a.Paused)
		require.NoError(t, err)
		assert.Equal(t, store.StatusActive, resumed.Status, "resumed at %s px", w)
	}
	accounts, err := st.Accounts(ctx)
	require.NoError(t, err)
	signedIn := map[string]store.Account{}
	for _, a := range accounts {
		if a.Kind == store.KindChatGPT {
			signedIn[a.ChatGPTAccountID] = a
		}
	}
	require.Len(t, signedIn, 2, "one sign-in at each width")
	for _, ws := range []string{"cg-alice", "cg-bob"} {
		a, ok := signedIn[ws]
		if assert.True(t, ok, "workspace %s signed in", ws) {
			cred, err := st.Credentials(ctx, a.ID)
			require.NoError(t, err)
			simAcct, _ := upstream.Account(strings.TrimPrefix(ws, "cg-"))
			assert.Equal(t, simAcct.RefreshToken, cred.RefreshToken, "the login's tokens are stored")
		}
	}
	entries, _, err := st.AuditLog(ctx, store.AuditFilter{Action: "account."})
	require.NoError(t, err)
	count := map[string]int{}
	for _, e := range entries {
		count[e.Action]++
		assert.Equal(t, "admin-token", e.Actor)
	}
	assert.Equal(t, map[string]int{"account.update": 2, "account.delete": 2, "account.resume": 2, "account.signin": 4}, count,
		"every action audited once; the refused save is not")

	for _, name := range []string{"accounts", "account", "account-refused", "account-saved", "remove-confirm", "removed", "resumed",
		"signin-pending", "signin-done", "signed-in-account"} {
		for _, w := range []string{"1280", "390"} {
			fi, err := os.Stat(filepath.Join(out, name+"-"+w+".png"))
			if assert.NoError(t, err, "screenshot %s-%s", name, w) {
				assert.True(t, fi.ModTime().After(started), "screenshot %s-%s was taken by this run", name, w)
			}
		}
	}
}
