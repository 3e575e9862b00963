package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The admin commands take a personal token (CODEX_RELAY_API_TOKEN) as they
// take the admin token: they act as its user, with its role, and a role
// too low is the API's refusal naming the role needed.
func TestAdminCommandsWithAPersonalToken(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	ctx := context.Background()
	base := adminAPI(t, s)
	token := func(email string, r roles.Role) string {
		u, err := s.CreateUser(ctx, store.User{Email: email, Role: r})
		require.NoError(t, err)
		_, secret, err := s.CreateUserToken(ctx, store.UserToken{UserID: u.ID, Name: string(r) + " script"})
		require.NoError(t, err)
		return secret
	}
	viewer, operator := token("vi@example.com", roles.Viewer), token("op@example.com", roles.Operator)

	out, _, err := runCLI(t, cliEnv{"CODEX_RELAY_URL": base, "CODEX_RELAY_API_TOKEN": viewer}, "bindings", "list")
	require.NoError(t, err)
	assert.Equal(t, "No bindings match.\n", out)
	_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": base, "CODEX_RELAY_API_TOKEN": viewer}, "bindings", "reset", "-thread", "t1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "needs the operator role")

	// The personal token wins over the admin token: the person is audited.
	_, _, err = runCLI(t, cliEnv{"CODEX_RELAY_URL": base, "CODEX_RELAY_API_TOKEN": operator, "CODEX_RELAY_ADMIN_TOKEN": cliAdminToken},
		"bindings", "reset", "-thread", "t1")
	require.NoError(t, err)
	entries, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "binding.reset"})
	require.NoError(t, err)
	require.Len(t, entries, 1, "the viewer's reset did nothing")
	assert.Equal(t, "token:operator script", entries[0].Actor)
	assert.Equal(t, "op@example.com", entries[0].UserEmail)
}
