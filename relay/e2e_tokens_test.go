package relay_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/relay/oauth"
	"github.com/codexrelay/codex-relay/relay/store"
)

func withRefresher(h *harness, c *relay.Config) {
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: c.Store, TokenURL: h.sim.TokenURL(), Logger: testLogger(h.t)})
	h.t.Cleanup(r.Close)
	c.Tokens = r
}

// An upstream 401 before any work refreshes the account's token once and
// retries the same account, with no penalty; a refresh the auth server
// rejects marks the account reauth_required and the request moves on.
func TestTokenRefreshAfter401(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, withRefresher, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx := context.Background()
	// The relay holds a stale access token for a1 (the sim no longer knows it).
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a1"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-a1"}, h.zeroTime()))
	h.setUsed("a2", 90)

	resp, body := h.post(sessionS, rootT, responseRequest("hello"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	recs := h.responseRecords(rootT)
	assert.Equal(t, "a1", recs[len(recs)-1].Account, "the same account, with the refreshed token")
	atts, _, err := h.store.Attempts(ctx, store.AttemptFilter{ThreadID: rootT})
	require.NoError(t, err)
	require.Len(t, atts, 2)
	assert.Equal(t, "token_refresh", atts[1].Recovery, "the 401 attempt, oldest last")
	assert.Equal(t, http.StatusUnauthorized, atts[1].Status)
	assert.Equal(t, 1, h.sim.RefreshCount("a1"))
	assert.Equal(t, store.StatusActive, statusOf(t, h, "a1"), "no penalty")
	var cred store.Credentials
	cred, err = h.store.Credentials(ctx, h.ids["a1"])
	require.NoError(t, err)
	assert.NotEqual(t, "stale", cred.AccessToken)
	assert.NotEqual(t, "rt-a1", cred.RefreshToken, "the rotated refresh token is stored")

	// a2 now holds a stale token and a refresh token the auth server rejects.
	require.NoError(t, h.store.SetCredentials(ctx, h.ids["a2"], store.Credentials{AccessToken: "stale", RefreshToken: "rt-revoked"}, h.zeroTime()))
	h.setUsed("a2", 0)
	h.setUsed("a1", 90)
	resp, body = h.post("019a7777-0000-7000-8000-000000000001", childT, responseRequest("hello"), nil) // a session of its own
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	child := h.responseRecords(childT)
	assert.Equal(t, "a1", child[len(child)-1].Account, "the request moved on")
	catts, _, err := h.store.Attempts(ctx, store.AttemptFilter{ThreadID: childT})
	require.NoError(t, err)
	require.NotEmpty(t, catts)
	assert.Equal(t, h.ids["a2"], catts[len(catts)-1].AccountID, "a2 was tried first")
	assert.Equal(t, "auth", catts[len(catts)-1].Class)
	a2, err := h.store.Account(ctx, h.ids["a2"])
	require.NoError(t, err)
	assert.Equal(t, store.StatusReauthRequired, a2.Status)
	assert.NotEmpty(t, a2.StatusReason)
}
