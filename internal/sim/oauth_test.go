package sim

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// refresh redeems a refresh token, as a form or as JSON.
func refresh(t *testing.T, upstream *Server, token string, asJSON bool) (int, tokenGrant, wire.Error) {
	t.Helper()
	var body, ctype string
	if asJSON {
		b, _ := json.Marshal(map[string]string{"client_id": "app_x", "grant_type": "refresh_token",
			"refresh_token": token, "scope": "openid profile email"})
		body, ctype = string(b), "application/json"
	} else {
		body = url.Values{"grant_type": {"refresh_token"}, "refresh_token": {token}, "client_id": {"app_x"}}.Encode()
		ctype = "application/x-www-form-urlencoded"
	}
	req, err := http.NewRequest(http.MethodPost, upstream.TokenURL(), strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", ctype)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var g tokenGrant
	var e wire.Error
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, &g))
	} else {
		var ok bool
		e, ok = wire.ParseErrorBody(b)
		require.True(t, ok, "%s", b)
	}
	return resp.StatusCode, g, e
}

func TestRefreshTokenRotation(t *testing.T) {
	t.Parallel()
	for _, asJSON := range []bool{false, true} {
		name := "form"
		if asJSON {
			name = "json"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{})
			status, g, _ := refresh(t, upstream, "rt-a1", asJSON)
			require.Equal(t, http.StatusOK, status)
			assert.NotEqual(t, "rt-a1", g.RefreshToken, "the refresh token rotates")
			assert.NotEmpty(t, g.AccessToken)
			assert.NotEqual(t, "at-a1", g.AccessToken)
			assert.Positive(t, g.ExpiresIn)
			assert.Equal(t, 1, upstream.RefreshCount("a1"))

			// The id token reads like auth.openai.com's.
			parts := strings.Split(g.IDToken, ".")
			require.Len(t, parts, 3)
			claims, err := base64.RawURLEncoding.DecodeString(parts[1])
			require.NoError(t, err)
			var c struct {
				Email string `json:"email"`
				Auth  struct {
					AccountID string `json:"chatgpt_account_id"`
					Plan      string `json:"chatgpt_plan_type"`
				} `json:"https://api.openai.com/auth"`
			}
			require.NoError(t, json.Unmarshal(claims, &c))
			assert.Equal(t, "cg-a1", c.Auth.AccountID)
			assert.Equal(t, "plus", c.Auth.Plan)

			// The old refresh token is spent.
			status, _, e := refresh(t, upstream, "rt-a1", asJSON)
			assert.Equal(t, http.StatusUnauthorized, status)
			assert.Equal(t, wire.TypeInvalidGrant, e.Type)
			assert.Equal(t, wire.CodeRefreshTokenReused, e.Code)
			st, _ := upstream.Account("a1")
			assert.Equal(t, 1, st.Refreshes)
			assert.Equal(t, 1, st.RefreshesRejected)
			assert.Equal(t, g.AccessToken, st.AccessToken)
			assert.Equal(t, g.RefreshToken, st.RefreshToken)

			// The new one works, once.
			status, g2, _ := refresh(t, upstream, g.RefreshToken, asJSON)
			require.Equal(t, http.StatusOK, status)
			assert.Equal(t, 2, upstream.RefreshCount("a1"))

			// New access tokens work; the old one too, since the account
			// does not revoke it.
			for _, tok := range []string{"at-a1", g.AccessToken, g2.AccessToken} {
				c := clientFor(t, upstream, "a1")
				c.token = tok
				_, _, err := c.turn(prompt(t, "hi"))
				assert.NoError(t, err, tok)
			}

			status, _, e = refresh(t, upstream, "never-issued", asJSON)
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Equal(t, wire.TypeInvalidGrant, e.Type)
			assert.Equal(t, 0, upstream.RefreshCount("b1"))

			recs := upstream.Records(RecordFilter{Route: RouteToken, Account: "a1"})
			require.Len(t, recs, 3)
			assert.Equal(t, []int{200, 401, 200}, []int{recs[0].Status, recs[1].Status, recs[2].Status})
		})
	}
}

func TestRefreshRevokesOldAccessToken(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }

	accts := testAccounts()
	accts[0].RevokeOldAccessToken = new(Duration(time.Minute))
	accts[1].RevokeOldAccessToken = new(Duration(0))
	accts[2].AccessTokenTTL = Duration(time.Hour)
	upstream := newSim(t, Config{Accounts: accts, Now: clock})
	use := func(acct, token string) (int, string) {
		c := clientFor(t, upstream, acct)
		c.token = token
		_, _, err := c.turn(prompt(t, "hi"))
		if err == nil {
			return http.StatusOK, ""
		}
		status, e := errorOf(t, err)
		return status, e.Code
	}

	status, g1, _ := refresh(t, upstream, "rt-a1", false)
	require.Equal(t, http.StatusOK, status)
	status, g2, _ := refresh(t, upstream, "rt-a2", false)
	require.Equal(t, http.StatusOK, status)

	s, _ := use("a1", "at-a1")
	assert.Equal(t, http.StatusOK, s, "still inside the grace period")
	s, code := use("a2", "at-a2")
	assert.Equal(t, http.StatusUnauthorized, s, "revoked at once")
	assert.Equal(t, wire.CodeTokenExpired, code)
	advance(2 * time.Minute)
	s, code = use("a1", "at-a1")
	assert.Equal(t, http.StatusUnauthorized, s, "past the grace period")
	assert.Equal(t, wire.CodeTokenExpired, code)
	for acct, tok := range map[string]string{"a1": g1.AccessToken, "a2": g2.AccessToken} {
		s, _ = use(acct, tok)
		assert.Equal(t, http.StatusOK, s)
	}

	// Access tokens with a lifetime expire.
	s, _ = use("b1", "at-b1")
	assert.Equal(t, http.StatusOK, s)
	advance(time.Hour)
	s, code = use("b1", "at-b1")
	assert.Equal(t, http.StatusUnauthorized, s)
	assert.Equal(t, wire.CodeTokenExpired, code)
	status, g3, _ := refresh(t, upstream, "rt-b1", true)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, int64(3600), g3.ExpiresIn)
	s, _ = use("b1", g3.AccessToken)
	assert.Equal(t, http.StatusOK, s)
}

func TestConcurrentRefreshesSucceedOnce(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	var wg sync.WaitGroup
	results := make(chan int, 8)
	for range 8 {
		wg.Go(func() {
			status, _, _ := refresh(t, upstream, "rt-a1", true)
			results <- status
		})
	}
	wg.Wait()
	close(results)
	ok := 0
	for s := range results {
		if s == http.StatusOK {
			ok++
		}
	}
	assert.Equal(t, 1, ok, "a refresh token is redeemed exactly once")
	assert.Equal(t, 1, upstream.RefreshCount("a1"))
	st, _ := upstream.Account("a1")
	assert.Equal(t, 7, st.RefreshesRejected)
}

func TestTokenEndpointRejectsOtherGrants(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	for _, b := range []string{"grant_type=authorization_code&code=x", "grant_type=refresh_token", `{"grant_type":`} {
		resp, err := http.Post(upstream.TokenURL(), "application/x-www-form-urlencoded", strings.NewReader(b))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, b)
	}
	http.DefaultClient.CloseIdleConnections()
}
