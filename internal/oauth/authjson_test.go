package oauth_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
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

// FuzzParseClaims checks ParseClaims two ways. A token built from claims
// (encoded the way auth.openai.com encodes them) parses, and reads back
// what was put in: expiry, email, workspace, user, plan and organisations.
// Any other string parses only when it is header.payload.signature with a
// payload that is a base64url JSON object, and parses the same way twice.
func FuzzParseClaims(f *testing.F) {
	f.Add("a.b.c", "dev@example.com", "", int64(1_900_000_000), int64(1_899_000_000),
		"ws-personal", "plus", "user-1", "", "", "org-a", "", false)
	f.Add(jwt(map[string]any{"exp": 1, "https://api.openai.com/auth": map[string]any{"organizations": []any{1, "x", map[string]any{"id": "o"}}}}),
		" ", " p@example.com ", int64(0), int64(-5), "", "team", "", "user-legacy", "org-x", "org-a", "org-b", true)
	f.Add(jwt(map[string]any{"email": "a@b.c"})+"=", "\xff\xfe", "", int64(1)<<53, int64(1)<<60,
		"ws\t", "pro", "", "", "  ", "", "org-only", false)
	f.Add("eyJhbGciOiJub25lIn0.bnVsbA.sig", "", "", int64(-1), int64(1), "", "", "", "", "", "org-a", "org-b", true)
	f.Add(`{"exp":1.9e9,"email":7,"https://api.openai.com/auth":{"organizations":"x"}}`, "", "", int64(0), int64(0), "", "", "", "", "", "", "", false)
	f.Add(`{"https://api.openai.com/profile":{"email":["a"]},"iat":"now"}`, "", "", int64(0), int64(0), "", "", "", "", "", "", "", false)
	// Regression seeds of bugs the fuzzer found: a profile or auth claim that
	// is no object failed the whole token; an exp past what time.Time holds
	// wrapped round to a time long past; claim names matched in any case.
	f.Add(`{"https://api.openai.com/auth":{"chatgpt_account_id":"ws"},"https://api.openai.com/profile":"p@example.com"}`,
		"", "", int64(math.MaxInt64), int64(math.MaxInt64-511), "", "", "", "", "", "", "", false)
	f.Add(`{"https://api.openai.com/auth":1}`, "", "", int64(1)<<62, int64(math.MaxInt64-62_135_596_800+4096), "", "", "", "", "", "", "", false)
	f.Add(`{"https://api.openai.com/auth":{},"https://aPi.openai.com/auth":1}`, "", "", int64(0), int64(0), "", "", "", "", "", "", "", false)
	f.Add("eyJhbGciOiJub25lIn0.W10.sig", "", "", int64(0), int64(0), "", "", "", "", "", "", "", false)
	f.Fuzz(func(t *testing.T, token, email, profileEmail string, exp, iat int64,
		accountID, plan, chatgptUserID, userID, orgID, orgA, orgB string, bDefault bool) {
		// Any string: an error, or a token of the right shape read the same
		// way every time.
		c, err := oauth.ParseClaims(token)
		again, errAgain := oauth.ParseClaims(token)
		require.Equal(t, err == nil, errAgain == nil, "parsing twice")
		assert.Equal(t, c, again, "parsing twice")
		payload, shaped := jwtPayload(token)
		isObject := shaped && json.Valid(payload) && (bytes.HasPrefix(bytes.TrimSpace(payload), []byte("{")) ||
			string(bytes.TrimSpace(payload)) == "null")
		if !isObject {
			require.Error(t, err, "the payload is not a base64url JSON object: %q", payload)
		}

		// The fuzzed string as a payload: any JSON object parses (unknown or
		// mistyped claims are ignored), anything else is an error.
		_, err = oauth.ParseClaims(jwtWithPayload([]byte(token)))
		trimmed := bytes.TrimSpace([]byte(token))
		if json.Valid(trimmed) && (trimmed[0] == '{' || string(trimmed) == "null") {
			assert.NoError(t, err, "a JSON object payload")
		} else {
			assert.Error(t, err, "a payload that is not a JSON object")
		}

		// A token built from claims: what was put in is read back.
		orgs := []map[string]any{{"id": orgA, "title": "A"}, {"id": orgB, "is_default": bDefault}}
		token = jwt(map[string]any{
			"email": email, "exp": exp, "iat": iat,
			"https://api.openai.com/profile": map[string]any{"email": profileEmail},
			"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": accountID, "chatgpt_plan_type": plan,
				"chatgpt_user_id": chatgptUserID, "user_id": userID, "organization_id": orgID, "organizations": orgs},
		})
		c, err = oauth.ParseClaims(token)
		require.NoError(t, err, "a token built from claims")
		want := oauth.Claims{
			Email:            firstNonBlank(sent(email), sent(profileEmail)),
			ChatGPTAccountID: strings.TrimSpace(sent(accountID)),
			PlanType:         strings.TrimSpace(sent(plan)),
			UserID:           firstNonBlank(sent(chatgptUserID), sent(userID)),
			OrganizationID:   strings.TrimSpace(sent(orgID)),
		}
		if id := sent(orgA); id != "" {
			want.Organizations = append(want.Organizations, oauth.Organization{ID: id, Title: "A"})
		}
		if id := sent(orgB); id != "" {
			want.Organizations = append(want.Organizations, oauth.Organization{ID: id, Default: bDefault})
		}
		for _, tc := range []struct {
			name string
			in   int64
			got  *time.Time
			want *time.Time
		}{{"exp", exp, &c.ExpiresAt, &want.ExpiresAt}, {"iat", iat, &c.IssuedAt, &want.IssuedAt}} {
			switch {
			case tc.in <= 0:
				// Not a time: absent.
			case tc.in <= endOf9999:
				*tc.want = time.Unix(tc.in, 0).UTC()
			default:
				// Far beyond any real token: "never", read as the end of
				// year 9999, not wrapped round to a time long past.
				*tc.want = time.Unix(endOf9999, 0).UTC()
			}
		}
		assert.Equal(t, want, c)
		assert.Equal(t, organization(want), c.Organization())
	})
}

// jwtPayload is the decoded middle part of a header.payload.signature
// token; false when the token is not of that shape.
func jwtPayload(token string) ([]byte, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	return b, err == nil
}

// endOf9999 is the last second a NumericDate claim is read as.
const endOf9999 = 253402300799

// jwtWithPayload is a header.payload.signature token around payload.
func jwtWithPayload(payload []byte) string {
	return "eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString(payload) + ".sig"
}

// sent is s as it reads after a JSON round trip (invalid UTF-8 becomes
// U+FFFD).
func sent(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

func firstNonBlank(ss ...string) string {
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			return s
		}
	}
	return ""
}

// organization is the reference for Claims.Organization: the
// organization_id claim, else the default organisation, else the only one.
func organization(c oauth.Claims) string {
	if c.OrganizationID != "" {
		return c.OrganizationID
	}
	var ids, defaults []string
	for _, o := range c.Organizations {
		ids = append(ids, o.ID)
		if o.Default {
			defaults = append(defaults, o.ID)
		}
	}
	switch {
	case len(defaults) > 0:
		return defaults[0]
	case len(ids) == 1:
		return ids[0]
	}
	return ""
}
