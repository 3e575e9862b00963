package oauth_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// delayed fronts the sim with a server that holds every request for d, so
// concurrent callers really overlap with a refresh in flight. It returns
// the token URL to use.
func delayed(t testing.TB, upstream *sim.Server, d time.Duration) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		upstream.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/oauth/token"
}

// deadURL is a URL nothing listens on.
func deadURL(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr + "/oauth/token"
}

// useToken makes one usage request to the sim with a ChatGPT token and
// returns the status: the proof that a token works upstream.
func useToken(t testing.TB, hc *http.Client, upstream *sim.Server, accountID, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, upstream.UsageURL(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("ChatGPT-Account-Id", accountID)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// redeem presents a refresh token to the sim directly and returns the status.
func redeem(t testing.TB, hc *http.Client, upstream *sim.Server, refreshToken string) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"grant_type": "refresh_token", "refresh_token": refreshToken, "client_id": "x"})
	resp, err := hc.Post(upstream.TokenURL(), "application/json", strings.NewReader(string(b)))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// assertNoTokens fails when any token appears in text.
func assertNoTokens(t testing.TB, what, text string, tokens ...string) {
	t.Helper()
	for _, tok := range tokens {
		if tok == "" {
			continue
		}
		assert.NotContains(t, text, tok, "%s must not contain a token", what)
		// Long tokens: no sizeable piece of them either.
		if len(tok) > 40 {
			assert.NotContains(t, text, tok[len(tok)-24:], "%s must not contain a piece of a token", what)
		}
	}
}

// A refresh-token rotation under 50 concurrent Token and AfterUnauthorized
// calls refreshes exactly once; everyone gets the rotated token, which was
// committed first; and after a restart (a new store handle and a new
// Refresher) the account refreshes again from the rotated refresh token,
// while the original one is spent.
func TestRefreshOnceUnderConcurrencyAndAcrossRestart(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := t.Context()
			clk := newClock()
			sa := simAccount("a1", "dev@example.com")
			upstream := newSim(t, clk, sa)
			hc := httpClient(t)
			url := b.URL(t)
			st := openStore(t, url, clk)
			// Expires within the 5-minute margin: Token must refresh.
			acct := addAccount(t, st, upstream, sa, clk.Now().Add(time.Minute))
			log, logs := newLogger(t)
			r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: hc, TokenURL: delayed(t, upstream, 150*time.Millisecond),
				Now: clk.Now, Replica: "replica-1", Logger: log})

			const n = 50
			got := make([]store.Credentials, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					if i%2 == 0 {
						got[i], errs[i] = r.Token(ctx, acct)
					} else {
						got[i], errs[i] = r.AfterUnauthorized(ctx, acct, sa.AccessToken)
					}
				})
			}
			close(start)
			wg.Wait()
			r.Close()

			require.Equal(t, 1, upstream.RefreshCount("a1"), "exactly one refresh reached the auth server")
			simState, _ := upstream.Account("a1")
			assert.Zero(t, simState.RefreshesRejected)
			stored, exp, err := st.TokenState(ctx, acct.ID)
			require.NoError(t, err)
			assert.Equal(t, simState.AccessToken, stored.AccessToken, "the rotated tokens are committed")
			assert.Equal(t, simState.RefreshToken, stored.RefreshToken)
			assert.NotEmpty(t, stored.IDToken)
			assert.True(t, exp.After(clk.Now().Add(24*time.Hour)), "expiry stored with the tokens: %v", exp)
			for i := range n {
				require.NoError(t, errs[i], "caller %d", i)
				assert.Equal(t, stored.AccessToken, got[i].AccessToken, "caller %d gets the committed token", i)
			}
			assert.Equal(t, http.StatusOK, useToken(t, hc, upstream, "cg-a1", stored.AccessToken))

			// Restart: the old store and Refresher are gone; a new pair reads
			// the rotated tokens. Past the new token's life, it refreshes
			// with the rotated refresh token, which the sim accepts.
			require.NoError(t, st.Close())
			st2 := openStore(t, url, clk)
			r2 := oauth.NewRefresher(oauth.RefresherConfig{Store: st2, HTTPClient: hc, TokenURL: upstream.TokenURL(),
				Now: clk.Now, Replica: "replica-1b", Logger: log})
			defer r2.Close()
			cred, err := r2.Token(ctx, acct)
			require.NoError(t, err)
			assert.Equal(t, stored.AccessToken, cred.AccessToken, "fresh: no refresh after a restart")
			assert.Equal(t, 1, upstream.RefreshCount("a1"))

			clk.Advance(11 * 24 * time.Hour)
			cred2, err := r2.Token(ctx, acct)
			require.NoError(t, err)
			assert.Equal(t, 2, upstream.RefreshCount("a1"), "the rotated refresh token works after the restart")
			simState, _ = upstream.Account("a1")
			assert.Zero(t, simState.RefreshesRejected, "no spent token was ever presented")
			assert.Equal(t, http.StatusOK, useToken(t, hc, upstream, "cg-a1", cred2.AccessToken))
			a, err := st2.Account(ctx, acct.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, a.Status)

			status, _ := redeem(t, hc, upstream, sa.RefreshToken)
			assert.Equal(t, http.StatusUnauthorized, status, "the original refresh token is spent: only the committed one kept the account alive")
			assertNoTokens(t, "the log", logs.String(), sa.AccessToken, sa.RefreshToken, stored.AccessToken, stored.RefreshToken,
				stored.IDToken, cred2.AccessToken, cred2.RefreshToken, cred2.IDToken)
		})
	}
}

// Two replicas (two Refreshers, two store handles, one database) racing to
// refresh the same expired account: one refresh reaches the auth server,
// the other replica waits on the claim and re-reads the committed tokens.
func TestTwoReplicasRefreshOnce(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := t.Context()
			clk := newClock()
			sa := simAccount("a1", "dev@example.com")
			upstream := newSim(t, clk, sa)
			hc := httpClient(t)
			url := b.URL(t)
			st1, st2 := openStore(t, url, clk), openStore(t, url, clk)
			acct := addAccount(t, st1, upstream, sa, clk.Now().Add(-time.Minute))
			tokenURL := delayed(t, upstream, 400*time.Millisecond)
			log, logs := newLogger(t)
			var replicas []*oauth.Refresher
			for i, st := range []*store.Store{st1, st2} {
				r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: hc, TokenURL: tokenURL, Now: clk.Now,
					Replica: []string{"replica-1", "replica-2"}[i], Logger: log, PollInterval: 20 * time.Millisecond})
				defer r.Close()
				replicas = append(replicas, r)
			}
			const n = 20
			got := make([]store.Credentials, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					got[i], errs[i] = replicas[i%2].Token(ctx, acct)
				})
			}
			close(start)
			wg.Wait()
			require.Equal(t, 1, upstream.RefreshCount("a1"), "one refresh across both replicas")
			assert.Len(t, upstream.Records(sim.RecordFilter{Route: sim.RouteToken}), 1,
				"not even a rejected second attempt reached the auth server")
			for i := range n {
				require.NoError(t, errs[i], "caller %d", i)
				assert.Equal(t, got[0].AccessToken, got[i].AccessToken)
			}
			assert.NotEqual(t, sa.AccessToken, got[0].AccessToken)
			assert.Contains(t, logs.String(), "waiting for another replica's token refresh")
		})
	}
}

// A replica that crashed holding the claim blocks refreshes only until its
// claim lapses.
func TestLapsedClaimOfACrashedReplica(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := t.Context()
			clk := newClock()
			sa := simAccount("a1", "")
			upstream := newSim(t, clk, sa)
			st := openStore(t, b.URL(t), clk)
			acct := addAccount(t, st, upstream, sa, clk.Now().Add(-time.Minute))
			_, ok, err := st.ClaimRefresh(ctx, acct.ID, "crashed-replica", 2*time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: httpClient(t), TokenURL: upstream.TokenURL(), Now: clk.Now,
				WaitTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
			defer r.Close()
			_, err = r.Token(ctx, acct)
			require.ErrorIs(t, err, oauth.ErrRefreshBusy)
			assert.Contains(t, err.Error(), "crashed-replica")
			assert.Zero(t, upstream.RefreshCount("a1"))
			a, err := st.Account(ctx, acct.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, a.Status, "waiting is no reason to give up on the account")

			clk.Advance(2 * time.Minute)
			cred, err := r.Token(ctx, acct)
			require.NoError(t, err)
			assert.Equal(t, 1, upstream.RefreshCount("a1"), "the lapsed claim was taken over")
			assert.NotEqual(t, sa.AccessToken, cred.AccessToken)
		})
	}
}

// A caller that gives up does not abandon the refresh: it commits, and the
// next caller gets its tokens without a second refresh.
func TestCallerHangingUpDoesNotLoseTheRotation(t *testing.T) {
	ctx := t.Context()
	clk := newClock()
	sa := simAccount("a1", "")
	upstream := newSim(t, clk, sa)
	st := openStore(t, storetest.SQLiteURL(t), clk)
	acct := addAccount(t, st, upstream, sa, clk.Now().Add(-time.Minute))
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: httpClient(t), TokenURL: delayed(t, upstream, 300*time.Millisecond), Now: clk.Now})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := r.Token(short, acct)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	r.Close() // waits for the flight
	assert.Equal(t, 1, upstream.RefreshCount("a1"))
	cred, _, err := st.TokenState(ctx, acct.ID)
	require.NoError(t, err)
	simState, _ := upstream.Account("a1")
	assert.Equal(t, simState.RefreshToken, cred.RefreshToken, "the rotated refresh token was committed")
	again, err := r.Token(ctx, acct)
	require.NoError(t, err, "a fresh token needs no refresh, even after Close")
	assert.Equal(t, cred.AccessToken, again.AccessToken)
	assert.Equal(t, 1, upstream.RefreshCount("a1"))
	_, err = r.AfterUnauthorized(ctx, acct, again.AccessToken)
	assert.ErrorIs(t, err, oauth.ErrClosed, "a refresh after Close is refused")
}

// A refresh the auth server rejects marks the account reauth_required with
// a reason naming the error; transport errors and 5xx do not. No token
// appears in the log or in an error.
func TestRejectedRefreshMarksReauthRequired(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := t.Context()
		clk := newClock()
		a1, a2 := simAccount("a1", ""), simAccount("a2", "")
		upstream := newSim(t, clk, a1, a2)
		hc := httpClient(t)
		log, logs := newLogger(t)
		newRefresher := func(tokenURL string) *oauth.Refresher {
			r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: hc, TokenURL: tokenURL, Now: clk.Now, Logger: log})
			t.Cleanup(r.Close)
			return r
		}
		r := newRefresher(upstream.TokenURL())
		var errText []string

		// a1's refresh token was spent by someone else (another relay, a
		// copied auth.json): 401 refresh_token_reused.
		status, spent := redeem(t, hc, upstream, a1.RefreshToken)
		require.Equal(t, http.StatusOK, status)
		acct1 := addAccount(t, st, upstream, a1, clk.Now().Add(-time.Minute))
		_, err := r.Token(ctx, acct1)
		var rej *oauth.RejectedError
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, http.StatusUnauthorized, rej.Status)
		assert.Equal(t, "refresh_token_reused", rej.Code)
		errText = append(errText, err.Error())
		got, err := st.Account(ctx, acct1.ID)
		require.NoError(t, err)
		assert.Equal(t, store.StatusReauthRequired, got.Status)
		assert.Contains(t, got.StatusReason, "refresh_token_reused")
		stored, _, err := st.TokenState(ctx, acct1.ID)
		require.NoError(t, err)
		assert.Equal(t, a1.RefreshToken, stored.RefreshToken, "a rejection drops no credentials")

		// An unknown refresh token: 400 invalid_grant, also after a 401.
		bogus := sim.Account{ID: "x", AccessToken: "at-x-never-issued-by-sim", RefreshToken: "rt-x-never-issued-by-sim", ChatGPTAccountID: "cg-x"}
		acctX := addAccount(t, st, upstream, bogus, time.Time{})
		_, err = r.AfterUnauthorized(ctx, acctX, bogus.AccessToken)
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, http.StatusBadRequest, rej.Status)
		assert.Equal(t, "invalid_grant", rej.Code)
		errText = append(errText, err.Error())
		got, err = st.Account(ctx, acctX.ID)
		require.NoError(t, err)
		assert.Equal(t, store.StatusReauthRequired, got.Status)
		assert.Contains(t, got.StatusReason, "invalid_grant")

		// a2: the auth server is unreachable, then answers 503 and 429:
		// errors, but the account stays active and keeps its tokens.
		acct2 := addAccount(t, st, upstream, a2, clk.Now().Add(-time.Minute))
		for _, tokenURL := range []string{deadURL(t), stub(t, 503, `{"error":{"code":"server_error","message":"try later"}}`),
			stub(t, 429, `{"error":"rate_limited"}`), stub(t, 200, `<html>not json</html>`)} {
			_, err = newRefresher(tokenURL).Token(ctx, acct2)
			require.Error(t, err)
			assert.False(t, errors.As(err, &rej), "%v is no rejection", err)
			errText = append(errText, err.Error())
			got, err = st.Account(ctx, acct2.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusActive, got.Status, "a transport failure is not a rejection")
		}
		// a3: refreshed early (expiring within the margin) while the auth
		// server is out of reach: the still valid token is used.
		a3 := sim.Account{ID: "a3", AccessToken: "at-a3-still-valid", RefreshToken: "rt-a3", ChatGPTAccountID: "cg-a3"}
		acct3 := addAccount(t, st, upstream, a3, clk.Now().Add(2*time.Minute))
		early, err := newRefresher(deadURL(t)).Token(ctx, acct3)
		require.NoError(t, err, "an unreachable auth server does not take a still valid token away")
		assert.Equal(t, a3.AccessToken, early.AccessToken)

		cred, err := r.Token(ctx, acct2)
		require.NoError(t, err, "the account still refreshes once the auth server is back")
		assert.NotEqual(t, a2.AccessToken, cred.AccessToken)

		secrets := []string{a1.AccessToken, a1.RefreshToken, spent["access_token"].(string), spent["refresh_token"].(string),
			spent["id_token"].(string), bogus.AccessToken, bogus.RefreshToken, a2.AccessToken, a2.RefreshToken,
			cred.AccessToken, cred.RefreshToken, cred.IDToken, a3.AccessToken, a3.RefreshToken}
		assertNoTokens(t, "the log", logs.String(), secrets...)
		assertNoTokens(t, "errors", strings.Join(errText, "\n"), secrets...)
		accts, err := st.Accounts(ctx)
		require.NoError(t, err)
		for _, a := range accts {
			assertNoTokens(t, "status reasons", a.StatusReason, secrets...)
		}
		assert.Contains(t, logs.String(), "token refresh rejected")
		assert.Contains(t, logs.String(), "token refresh failed")
		assert.Contains(t, logs.String(), "token refreshed")
	})
}

// A rejection message that echoes the refresh token is scrubbed before it
// reaches the account's reason, the log or the error.
func TestRejectionEchoingTheTokenIsScrubbed(t *testing.T) {
	ctx := t.Context()
	clk := newClock()
	st := openStore(t, storetest.SQLiteURL(t), clk)
	const rt = "rt-echoed-back-by-a-careless-server"
	a, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: "cg"},
		store.Credentials{AccessToken: "at-short-lived-token", RefreshToken: rt})
	require.NoError(t, err)
	log, logs := newLogger(t)
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: httpClient(t), Now: clk.Now, Logger: log,
		TokenURL: stub(t, 401, `{"error":"invalid_grant","error_description":"refresh token `+rt+` is not valid"}`)})
	defer r.Close()
	_, err = r.AfterUnauthorized(ctx, a, "at-short-lived-token")
	require.Error(t, err)
	got, err2 := st.Account(ctx, a.ID)
	require.NoError(t, err2)
	assert.Equal(t, store.StatusReauthRequired, got.Status)
	assert.Contains(t, got.StatusReason, "invalid_grant")
	assert.Contains(t, got.StatusReason, "is not valid")
	for what, text := range map[string]string{"reason": got.StatusReason, "error": err.Error(), "log": logs.String()} {
		assertNoTokens(t, what, text, rt, "at-short-lived-token")
	}
}

// stub is a token endpoint that always answers status and body.
func stub(t testing.TB, status int, body string) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/oauth/token"
}

// jwt builds an unsigned JWT-shaped token with claims.
func jwt(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + base64.RawURLEncoding.EncodeToString(b) + ".sig"
}

// Expiry comes from the JWT's exp claim (or the stored expiry); a token is
// refreshed within the margin, which is capped at half a short lifetime.
// AfterUnauthorized with a token already replaced refreshes nothing; other
// kinds of accounts are handed their credentials as they are.
func TestWhenTokensRefresh(t *testing.T) {
	ctx := t.Context()
	clk := newClock()
	sa := simAccount("a1", "")
	upstream := newSim(t, clk, sa)
	st := openStore(t, storetest.SQLiteURL(t), clk)
	r := oauth.NewRefresher(oauth.RefresherConfig{Store: st, HTTPClient: httpClient(t), TokenURL: upstream.TokenURL(), Now: clk.Now})
	defer r.Close()
	now := clk.Now()

	// A JWT expiring in 10 minutes, no stored expiry: fresh for 5 more minutes.
	access := jwt(map[string]any{"exp": now.Add(10 * time.Minute).Unix()})
	acct, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a", ChatGPTAccountID: sa.ChatGPTAccountID, BaseURL: upstream.CodexBaseURL()},
		store.Credentials{AccessToken: access, RefreshToken: sa.RefreshToken})
	require.NoError(t, err)
	cred, err := r.Token(ctx, acct)
	require.NoError(t, err)
	assert.Equal(t, access, cred.AccessToken)
	clk.Advance(4 * time.Minute)
	_, err = r.Token(ctx, acct)
	require.NoError(t, err)
	assert.Zero(t, upstream.RefreshCount("a1"))
	clk.Advance(2 * time.Minute)
	cred, err = r.Token(ctx, acct)
	require.NoError(t, err)
	assert.Equal(t, 1, upstream.RefreshCount("a1"), "within 5 minutes of exp: refreshed")
	assert.NotEqual(t, access, cred.AccessToken)

	// A stale token after someone refreshed: nothing to do.
	cred2, err := r.AfterUnauthorized(ctx, acct, access)
	require.NoError(t, err)
	assert.Equal(t, cred.AccessToken, cred2.AccessToken)
	assert.Equal(t, 1, upstream.RefreshCount("a1"))
	// The current token refused: one forced refresh.
	cred3, err := r.AfterUnauthorized(ctx, acct, cred.AccessToken)
	require.NoError(t, err)
	assert.Equal(t, 2, upstream.RefreshCount("a1"))
	assert.NotEqual(t, cred.AccessToken, cred3.AccessToken)

	// A 4-minute token (iat known): the margin is 2 minutes, not 5.
	short := jwt(map[string]any{"iat": clk.Now().Unix(), "exp": clk.Now().Add(4 * time.Minute).Unix()})
	cur, _, err := st.TokenState(ctx, acct.ID)
	require.NoError(t, err)
	require.NoError(t, st.SetCredentials(ctx, acct.ID, store.Credentials{AccessToken: short, RefreshToken: cur.RefreshToken}, time.Time{}))
	cred, err = r.Token(ctx, acct)
	require.NoError(t, err)
	assert.Equal(t, short, cred.AccessToken)
	clk.Advance(2*time.Minute + time.Second)
	cred, err = r.Token(ctx, acct)
	require.NoError(t, err)
	assert.NotEqual(t, short, cred.AccessToken)
	assert.Equal(t, 3, upstream.RefreshCount("a1"))

	// The stored expiry counts when the token is opaque.
	opaque, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "o", ChatGPTAccountID: "cg-o", AccessExpiresAt: clk.Now().Add(time.Hour)},
		store.Credentials{AccessToken: "opaque-token", RefreshToken: "rt-unused"})
	require.NoError(t, err)
	cred, err = r.Token(ctx, opaque)
	require.NoError(t, err)
	assert.Equal(t, "opaque-token", cred.AccessToken)

	// API-key accounts are never refreshed.
	key, err := st.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "k"}, store.Credentials{APIKey: "sk-test"})
	require.NoError(t, err)
	for _, f := range []func() (store.Credentials, error){
		func() (store.Credentials, error) { return r.Token(ctx, key) },
		func() (store.Credentials, error) { return r.AfterUnauthorized(ctx, key, "sk-test") },
	} {
		cred, err = f()
		require.NoError(t, err)
		assert.Equal(t, "sk-test", cred.APIKey)
	}
	assert.Equal(t, 3, upstream.RefreshCount("a1"))
}
