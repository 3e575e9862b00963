package oauth_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/relay/oauth"
	"github.com/codexrelay/codex-relay/relay/store"
)

// idToken is an id token in auth.openai.com's layout.
func idToken(email, accountID, plan string, orgs ...map[string]any) string {
	auth := map[string]any{"chatgpt_account_id": accountID, "chatgpt_plan_type": plan, "chatgpt_user_id": "user-1"}
	if len(orgs) > 0 {
		auth["organizations"] = orgs
	}
	return jwt(map[string]any{"email": email, "exp": 1_900_000_000, "https://api.openai.com/auth": auth})
}

// authJSON is an auth.json as Codex writes it after a ChatGPT login.
func authJSON(email, accountID, plan, suffix, lastRefresh string) string {
	b, _ := json.Marshal(map[string]any{
		"auth_mode":      "chatgpt",
		"OPENAI_API_KEY": nil,
		"tokens": map[string]any{
			"id_token":      idToken(email, accountID, plan, map[string]any{"id": "org-" + accountID, "title": "Personal", "is_default": true, "role": "owner"}),
			"access_token":  jwt(map[string]any{"exp": 1_800_864_000, "https://api.openai.com/auth": map[string]any{"chatgpt_account_id": accountID}}),
			"refresh_token": "rt-" + suffix,
			"account_id":    accountID,
		},
		"last_refresh": lastRefresh,
	})
	return string(b)
}

func TestParseAuthJSON(t *testing.T) {
	t.Parallel()
	personal := authJSON("dev@example.com", "ws-personal", "plus", "p", "2026-01-01T00:00:00Z")
	team := authJSON("dev@example.com", "ws-team", "team", "t", "2026-01-02T00:00:00Z")
	teamNewer := authJSON("dev@example.com", "ws-team", "team", "t2", "2026-02-01T00:00:00Z")

	t.Run("one login", func(t *testing.T) {
		got, err := oauth.ParseAuthJSON([]byte(personal))
		require.NoError(t, err)
		require.Len(t, got, 1)
		a := got[0]
		assert.Equal(t, store.KindChatGPT, a.Kind)
		assert.Equal(t, "ws-personal", a.ChatGPTAccountID)
		assert.Equal(t, "dev@example.com", a.Email)
		assert.Equal(t, "plus", a.PlanType)
		assert.Equal(t, "user-1", a.UserID)
		assert.Equal(t, "org-ws-personal", a.Organization, "the default organisation")
		require.Len(t, a.Organizations, 1)
		assert.Equal(t, "Personal", a.Organizations[0].Title)
		assert.Equal(t, "rt-p", a.Credentials.RefreshToken)
		assert.NotEmpty(t, a.Credentials.AccessToken)
		assert.NotEmpty(t, a.Credentials.IDToken)
		assert.Equal(t, time.Unix(1_800_864_000, 0).UTC(), a.AccessExpiresAt)
		assert.Equal(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), a.LastRefresh)
		assert.Equal(t, "chatgpt:ws-personal", a.Key())
		assert.Contains(t, a.Label(), "dev@example.com")
	})

	t.Run("two workspaces of one email are two accounts", func(t *testing.T) {
		for name, in := range map[string]string{
			"array":        "[" + personal + "," + team + "]",
			"concatenated": personal + "\n" + team + "\n",
		} {
			got, err := oauth.ParseAuthJSON([]byte(in))
			require.NoError(t, err, name)
			require.Len(t, got, 2, name)
			assert.Equal(t, "ws-personal", got[0].ChatGPTAccountID)
			assert.Equal(t, "ws-team", got[1].ChatGPTAccountID)
			assert.Equal(t, got[0].Email, got[1].Email)
			assert.NotEqual(t, got[0].Label(), got[1].Label(), "labels tell workspaces of one email apart")
		}
	})

	t.Run("one workspace twice keeps the newest", func(t *testing.T) {
		got, err := oauth.ParseAuthJSON([]byte("[" + teamNewer + "," + personal + "," + team + "]"))
		require.NoError(t, err)
		require.Len(t, got, 2)
		assert.Equal(t, "ws-team", got[0].ChatGPTAccountID)
		assert.Equal(t, "rt-t2", got[0].Credentials.RefreshToken)
	})

	t.Run("account_id falls back to the id token", func(t *testing.T) {
		in := `{"tokens":{"id_token":"` + idToken("a@b.c", "ws-claim", "pro") + `","access_token":"opaque","refresh_token":"rt"}}`
		got, err := oauth.ParseAuthJSON([]byte(in))
		require.NoError(t, err)
		assert.Equal(t, "ws-claim", got[0].ChatGPTAccountID)
		assert.Equal(t, "pro", got[0].PlanType)
		assert.True(t, got[0].AccessExpiresAt.IsZero(), "an opaque access token has no known expiry")
	})

	t.Run("API key only", func(t *testing.T) {
		got, err := oauth.ParseAuthJSON([]byte(`{"OPENAI_API_KEY":"sk-proj-abc123","tokens":null,"last_refresh":null}`))
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, store.KindOpenAI, got[0].Kind)
		assert.Equal(t, "sk-proj-abc123", got[0].Credentials.APIKey)
		assert.NotContains(t, got[0].Key()+got[0].Label(), "sk-proj-abc123")
	})

	for _, tc := range []struct{ name, in, want string }{
		{"empty", "  ", "empty"},
		{"nothing in it", `{"tokens":null}`, "neither tokens nor OPENAI_API_KEY"},
		{"no account id", `{"tokens":{"access_token":"opaque-secret-token","refresh_token":"rt-secret-value"}}`, "no ChatGPT account id"},
		{"no usable token", `{"tokens":{"id_token":"` + idToken("a@b.c", "ws", "plus") + `"}}`, "neither access_token nor refresh_token"},
		{"malformed", `{"tokens":{"access_token":"opaque-secret-token",`, "malformed JSON"},
		{"wrong type", `{"tokens":{"access_token":42}}`, "must be"},
		{"second entry bad", personal + `{"tokens":{"refresh_token":"rt-secret-value"}}`, "entry 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := oauth.ParseAuthJSON([]byte(tc.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "secret", "errors never quote a token")
		})
	}
}

func TestParseClaims(t *testing.T) {
	t.Parallel()
	c, err := oauth.ParseClaims(jwt(map[string]any{
		"exp": 1_900_000_000, "iat": 1_899_000_000,
		"https://api.openai.com/profile": map[string]any{"email": "p@example.com"},
		"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "ws", "chatgpt_plan_type": "team", "user_id": "u",
			"organizations": []map[string]any{{"id": "org-a"}, {"id": "org-b", "is_default": true}, {"title": "no id"}}},
	}))
	require.NoError(t, err)
	assert.Equal(t, "p@example.com", c.Email, "the profile claim's email when there is no top-level one")
	assert.Equal(t, time.Unix(1_900_000_000, 0).UTC(), c.ExpiresAt)
	assert.Equal(t, time.Unix(1_899_000_000, 0).UTC(), c.IssuedAt)
	assert.Equal(t, "ws", c.ChatGPTAccountID)
	assert.Equal(t, "u", c.UserID)
	assert.Len(t, c.Organizations, 2)
	assert.Equal(t, "org-b", c.Organization(), "the default organisation")

	c, err = oauth.ParseClaims(jwt(map[string]any{"https://api.openai.com/auth": map[string]any{"organization_id": "org-x",
		"organizations": []map[string]any{{"id": "org-y", "is_default": true}}}, "exp": "soon"}))
	require.NoError(t, err)
	assert.Equal(t, "org-x", c.Organization(), "organization_id wins")
	assert.True(t, c.ExpiresAt.IsZero(), "a mistyped claim is ignored")

	for _, bad := range []string{"", "opaque", "a.b", "a.!!!.c", "a." + strings.Repeat("x", 5) + ".c"} {
		_, err := oauth.ParseClaims(bad)
		assert.Error(t, err, bad)
	}
}

func FuzzParseAuthJSON(f *testing.F) {
	f.Add([]byte(authJSON("dev@example.com", "ws", "plus", "x", "2026-01-01T00:00:00Z")))
	f.Add([]byte(`[{"OPENAI_API_KEY":"sk-1"},{"tokens":{"refresh_token":"r","account_id":"w"}}]`))
	f.Add([]byte(`{"tokens":{"id_token":"a.b.c"}}{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := oauth.ParseAuthJSON(data)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, a := range got {
			if a.Kind == store.KindChatGPT && a.ChatGPTAccountID == "" {
				t.Fatalf("a chatgpt account without an account id: %+v", a)
			}
			if seen[a.Key()] {
				t.Fatalf("account %s returned twice", a.Key())
			}
			seen[a.Key()] = true
		}
	})
}

func FuzzParseClaims(f *testing.F) {
	f.Add(jwt(map[string]any{"exp": 1, "https://api.openai.com/auth": map[string]any{"organizations": []any{1, "x", map[string]any{"id": "o"}}}}))
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := oauth.ParseClaims(token)
		if err == nil {
			_ = c.Organization()
		}
	})
}
