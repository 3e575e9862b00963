package main

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func TestPickRef(t *testing.T) {
	objects := []namedRef{
		{"acc_1", "team"},
		{"acc_2", "Team"},
		{"acc_3", "solo"},
		{"acc_4", "twin"},
		{"acc_5", "twin"},
		{"acc_6", "acc_3"}, // a label that is another account's id
		{"acc_7", "Mixed"},
	}
	for _, tc := range []struct {
		ref  string
		mode resolveMode
		want string
		err  string
	}{
		{ref: "acc_3", want: "acc_3"},
		{ref: "acc_6", want: "acc_6"},
		{ref: " acc_3 ", want: "acc_3"},
		{ref: "solo", want: "acc_3"},
		{ref: "team", want: "acc_1", err: ""},
		{ref: "Team", want: "acc_2"},
		{ref: "SOLO", want: "acc_3"},
		{ref: "mixed", want: "acc_7"},
		{ref: "TEAM", err: `2 accounts match the label "TEAM": acc_1 (label "team"), acc_2 (label "Team"); give the id`},
		{ref: "twin", err: `2 accounts match the label "twin": acc_4 (label "twin"), acc_5 (label "twin"); give the id`},
		{ref: "nobody", err: `no account with id or label "nobody"`},
		{ref: "acc_gone", err: `no account with id or label "acc_gone"`},
		{ref: "acc_gone", mode: mayBeGone, want: "acc_gone"},
		{ref: "nobody", mode: mayBeGone, err: `no account with id or label "nobody"`},
		{ref: "solo", mode: mayBeGone, want: "acc_3"},
	} {
		got, err := pickRef(accountRef, tc.mode, objects, tc.ref)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, "%q", tc.ref)
			continue
		}
		require.NoError(t, err, "%q", tc.ref)
		assert.Equal(t, tc.want, got, "%q", tc.ref)
	}
	_, err := pickRef(keyRef, mustExist, nil, "laptop")
	assert.EqualError(t, err, `no client key with id or name "laptop"`)
}

// Every command that takes an account or a key takes its label or name
// too: pause, resume and remove an account; keys limits and revoke; keys
// create -accounts; bindings -account and -client-key; usage -key and
// -account. An ambiguous or unknown one is refused and nothing changes.
func TestCommandsTakeLabelsAndNames(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		env := adminEnv("CODEX_RELAY_URL", adminAPI(t, s))
		add := func(label string) store.Account {
			a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: label, BaseURL: "http://127.0.0.1:9/v1"}, store.Credentials{APIKey: "sk-x"})
			require.NoError(t, err)
			return a
		}
		alpha, twin1, twin2 := add("alpha"), add("twin"), add("twin")
		if twin2.ID < twin1.ID {
			twin1, twin2 = twin2, twin1 // the error lists them in id order
		}
		status := func(a store.Account) store.Status {
			got, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			return got.Status
		}

		out, _, err := runCLI(t, env, "accounts", "pause", "alpha", "-reason", "by label")
		require.NoError(t, err)
		assert.Contains(t, out, "paused "+alpha.ID)
		assert.Equal(t, store.StatusPaused, status(alpha))
		_, _, err = runCLI(t, env, "accounts", "resume", "ALPHA")
		require.NoError(t, err, "the label in another case, as only one account has it")
		assert.Equal(t, store.StatusActive, status(alpha))

		_, _, err = runCLI(t, env, "accounts", "pause", "twin")
		require.Error(t, err)
		assert.Equal(t, `accounts pause: 2 accounts match the label "twin": `+twin1.ID+` (label "twin"), `+twin2.ID+` (label "twin"); give the id`, err.Error())
		assert.Equal(t, store.StatusActive, status(twin1), "nothing changed")
		assert.Equal(t, store.StatusActive, status(twin2), "nothing changed")
		_, _, err = runCLI(t, env, "accounts", "remove", "twin")
		require.Error(t, err)
		accts, err := s.Accounts(ctx)
		require.NoError(t, err)
		assert.Len(t, accts, 3, "nothing removed")
		_, _, err = runCLI(t, env, "accounts", "pause", twin2.ID)
		require.NoError(t, err, "the id of an account whose label is shared")
		assert.Equal(t, store.StatusPaused, status(twin2))

		_, _, err = runCLI(t, env, "accounts", "remove", "nobody")
		assert.EqualError(t, err, `accounts remove: no account with id or label "nobody"`)

		// keys create -accounts by label; keys limits and revoke by name.
		out, _, err = runCLI(t, env, "keys", "create", "-name", "laptop", "-accounts", "alpha,"+twin1.ID)
		require.NoError(t, err)
		assert.Contains(t, out, "accounts "+alpha.ID+","+twin1.ID)
		_, _, err = runCLI(t, env, "keys", "create", "-name", "x", "-accounts", "twin")
		assert.ErrorContains(t, err, `keys create: -accounts: 2 accounts match the label "twin"`)
		_, _, err = runCLI(t, env, "keys", "create", "-name", "ci")
		require.NoError(t, err)
		_, _, err = runCLI(t, env, "keys", "create", "-name", "ci")
		require.NoError(t, err)
		keys, err := s.ClientKeys(ctx)
		require.NoError(t, err)
		require.Len(t, keys, 3)
		var laptop store.ClientKey
		for _, k := range keys {
			if k.Name == "laptop" {
				laptop = k
			}
		}

		out, _, err = runCLI(t, env, "keys", "limits", "laptop", "-set", "requests/minute=60")
		require.NoError(t, err)
		assert.Contains(t, out, "requests/minute")
		got, err := s.ClientKey(ctx, laptop.ID)
		require.NoError(t, err)
		assert.Len(t, got.Limits, 1)
		_, _, err = runCLI(t, env, "keys", "limits", "ci", "-set", "requests/minute=60")
		assert.ErrorContains(t, err, `keys limits: 2 client keys match the name "ci": key_`)
		_, _, err = runCLI(t, env, "keys", "revoke", "ci")
		require.Error(t, err)
		assert.Regexp(t, `^keys revoke: 2 client keys match the name "ci": key_\w+ \(name "ci"\), key_\w+ \(name "ci"\); give the id$`, err.Error())
		keys, err = s.ClientKeys(ctx)
		require.NoError(t, err)
		for _, k := range keys {
			assert.True(t, k.RevokedAt.IsZero(), "nothing revoked")
			if k.Name == "ci" {
				assert.Empty(t, k.Limits, "nothing changed")
			}
		}
		_, _, err = runCLI(t, env, "keys", "revoke", "desktop")
		assert.EqualError(t, err, `keys revoke: no client key with id or name "desktop"`)
		out, _, err = runCLI(t, env, "keys", "revoke", "laptop")
		require.NoError(t, err)
		assert.Contains(t, out, "revoked "+laptop.ID)

		// bindings by label and key name.
		require.NoError(t, s.Place(ctx, store.Placement{ThreadKey: "k-t1", ThreadID: "t1", AccountID: alpha.ID, ClientScope: laptop.ID,
			Source: "admission", TTL: time.Hour}))
		out, _, err = runCLI(t, env, "bindings", "list", "-account", "alpha")
		require.NoError(t, err)
		assert.Contains(t, out, "  t1  ")
		out, _, err = runCLI(t, env, "bindings", "list", "-client-key", "laptop")
		require.NoError(t, err)
		assert.Contains(t, out, "  t1  ")
		_, _, err = runCLI(t, env, "bindings", "list", "-account", "twin")
		assert.ErrorContains(t, err, "bindings list: -account: 2 accounts match")
		_, _, err = runCLI(t, env, "bindings", "reset", "-account", "twin")
		assert.ErrorContains(t, err, "bindings reset: -account: 2 accounts match")
		_, _, err = runCLI(t, env, "bindings", "reset", "-account", "nobody")
		assert.EqualError(t, err, `bindings reset: -account: no account with id or label "nobody"`)
		_, total, err := s.Bindings(ctx, store.BindingFilter{})
		require.NoError(t, err)
		assert.Equal(t, 1, total, "nothing reset")
		out, _, err = runCLI(t, env, "bindings", "reset", "-account", "alpha")
		require.NoError(t, err)
		assert.Equal(t, "Reset 1 binding of account "+alpha.ID+".\n", out)

		// usage by key name and account label; an account since removed by
		// its id.
		require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ClientKeyID: laptop.ID, AccountID: alpha.ID, Transport: "http",
			Path: "/v1/responses", Status: 200, StartedAt: alpha.CreatedAt, TotalTokens: 10}, nil))
		require.NoError(t, s.RecordRequest(ctx, store.RequestRecord{ClientKeyID: "key_other", AccountID: "acc_removed", Transport: "http",
			Path: "/v1/responses", Status: 200, StartedAt: alpha.CreatedAt, TotalTokens: 10}, nil))
		requests := func(args ...string) string {
			t.Helper()
			out, _, err := runCLI(t, env, append([]string{"usage"}, args...)...)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 2, out)
			return fields(lines[1])[0]
		}
		assert.Equal(t, "2", requests())
		assert.Equal(t, "1", requests("-key", "laptop"))
		assert.Equal(t, "1", requests("-account", "Alpha"))
		assert.Equal(t, "1", requests("-account", "acc_removed"))
		_, _, err = runCLI(t, env, "usage", "-account", "twin")
		assert.ErrorContains(t, err, "usage: -account: 2 accounts match")
		_, _, err = runCLI(t, env, "usage", "-key", "nobody")
		assert.EqualError(t, err, `usage: -key: no client key with id or name "nobody"`)
	})
}

// The help of every command that takes an account or a key says it takes
// the id or the label (or name).
func TestRefHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"accounts", "pause"}, []string{"ID|LABEL", "by its id (acc_...) or its label"}},
		{[]string{"accounts", "resume"}, []string{"ID|LABEL", "by its id (acc_...) or its label"}},
		{[]string{"accounts", "remove"}, []string{"ID|LABEL", "by its id (acc_...) or its label"}},
		{[]string{"accounts"}, []string{"pause ID|LABEL", "resume ID|LABEL", "remove ID|LABEL"}},
		{[]string{"keys", "limits"}, []string{"ID|NAME", "by its id (key_...) or its name"}},
		{[]string{"keys", "revoke"}, []string{"ID|NAME", "by its id (key_...) or its name"}},
		{[]string{"keys"}, []string{"limits ID|NAME", "revoke ID|NAME"}},
		{[]string{"keys", "create"}, []string{"accounts (ids or labels)"}},
		{[]string{"bindings", "list"}, []string{"this account (id or label)", "this client key (id or name)"}},
		{[]string{"bindings", "reset"}, []string{"this account (id or label)"}},
		{[]string{"usage"}, []string{"this account (id or label", "this client key (id or name)"}},
	} {
		_, errOut, err := runCLI(t, cliEnv{}, append(tc.args, "--help")...)
		assert.ErrorIs(t, err, flag.ErrHelp, "%v", tc.args)
		for _, w := range tc.want {
			assert.Contains(t, errOut, w, "%v", tc.args)
		}
	}
}
