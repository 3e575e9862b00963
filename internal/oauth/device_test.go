package oauth_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
)

// approveLater approves the login shown to the user after a few pending
// polls, through the sim's control API over HTTP, as a person at a browser
// would.
func approveLater(t *testing.T, hc *http.Client, upstream *sim.Server, account string, codes <-chan oauth.DeviceCode, done *sync.WaitGroup) {
	done.Go(func() {
		dc := <-codes
		time.Sleep(80 * time.Millisecond)
		body := `{"user_code":"` + dc.UserCode + `","account":"` + account + `"}`
		resp, err := hc.Post(upstream.ControlURL()+"/deviceauth/approve", "application/json", strings.NewReader(body))
		if !assert.NoError(t, err) {
			return
		}
		resp.Body.Close()
		assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	})
}

func TestDeviceLoginAgainstTheSim(t *testing.T) {
	ctx := t.Context()
	clk := newClock()
	upstream := newSim(t, clk, simAccount("a1", "dev@example.com"), simAccount("a2", "dev@example.com"))
	require.NoError(t, upstream.SetDeviceLogin(0, 0))
	hc := httpClient(t)
	login := oauth.DeviceLogin{HTTPClient: hc, Issuer: upstream.URL + "/", MinInterval: 10 * time.Millisecond}

	t.Run("approved", func(t *testing.T) {
		codes := make(chan oauth.DeviceCode, 1)
		var wg sync.WaitGroup
		approveLater(t, hc, upstream, "a2", codes, &wg)
		a, err := login.Run(ctx, func(dc oauth.DeviceCode) {
			assert.Equal(t, upstream.URL+"/codex/device", dc.VerificationURL)
			assert.NotEmpty(t, dc.UserCode)
			codes <- dc
		})
		wg.Wait()
		require.NoError(t, err)
		assert.Equal(t, "cg-a2", a.ChatGPTAccountID)
		assert.Equal(t, "dev@example.com", a.Email)
		assert.Equal(t, "plus", a.PlanType)
		assert.Equal(t, "org-a2", a.Organization)
		assert.False(t, a.AccessExpiresAt.IsZero())
		assert.Equal(t, http.StatusOK, useToken(t, hc, upstream, "cg-a2", a.Credentials.AccessToken), "the access token works")
		status, _ := redeem(t, hc, upstream, a.Credentials.RefreshToken)
		assert.Equal(t, http.StatusOK, status, "the refresh token works")
		polls := upstream.Records(sim.RecordFilter{Route: sim.RouteDeviceToken})
		assert.GreaterOrEqual(t, len(polls), 2, "it polled while the login was pending")
	})

	t.Run("not approved in time", func(t *testing.T) {
		short := login
		short.MaxWait = 300 * time.Millisecond
		start := time.Now()
		_, err := short.Run(ctx, nil)
		assert.ErrorIs(t, err, oauth.ErrDeviceLoginTimeout)
		assert.Less(t, time.Since(start), 5*time.Second)

		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = login.Run(cctx, nil)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "the caller's context ends it")
	})

	t.Run("denied", func(t *testing.T) {
		dc, err := login.Start(ctx)
		require.NoError(t, err)
		require.NoError(t, upstream.DenyDeviceLogin(dc.UserCode))
		_, err = login.Wait(ctx, dc)
		assert.ErrorIs(t, err, oauth.ErrDeviceLoginDenied)
	})

	t.Run("expired", func(t *testing.T) {
		require.NoError(t, upstream.SetDeviceLogin(0, time.Minute))
		dc, err := login.Start(ctx)
		require.NoError(t, err)
		clk.Advance(time.Minute)
		_, err = login.Wait(ctx, dc)
		assert.ErrorIs(t, err, oauth.ErrDeviceCodeExpired)
	})
}

// The client honours the server's interval and slows down when told to.
func TestDeviceLoginIntervalAndSlowDown(t *testing.T) {
	var mu sync.Mutex
	var polls []time.Time
	var ts *httptest.Server
	ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/accounts/deviceauth/usercode":
			_, _ = io.WriteString(w, `{"device_auth_id":"dev-1","usercode":"ABCD-EFGH","interval":"0.05"}`)
		case "/api/accounts/deviceauth/token":
			var body map[string]string
			_ = json.Unmarshal(raw, &body)
			assert.Equal(t, "dev-1", body["device_auth_id"])
			assert.Equal(t, "ABCD-EFGH", body["user_code"])
			mu.Lock()
			polls = append(polls, time.Now())
			n := len(polls)
			mu.Unlock()
			switch {
			case n == 2:
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"error":"slow_down"}`)
			case n < 4:
				w.WriteHeader(http.StatusForbidden)
			default:
				_, _ = io.WriteString(w, `{"authorization_code":"ac-1","code_challenge":"ch","code_verifier":"ver-1"}`)
			}
		case "/oauth/token":
			form, _ := url.ParseQuery(string(raw))
			assert.Equal(t, "authorization_code", form.Get("grant_type"))
			assert.Equal(t, "ac-1", form.Get("code"))
			assert.Equal(t, "ver-1", form.Get("code_verifier"))
			assert.Equal(t, ts.URL+"/deviceauth/callback", form.Get("redirect_uri"))
			assert.Equal(t, oauth.CodexClientID, form.Get("client_id"))
			_, _ = io.WriteString(w, `{"id_token":"`+idToken("me@example.com", "ws-1", "pro")+`","access_token":"at-1","refresh_token":"rt-1","expires_in":3600}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer ts.Close()
	login := oauth.DeviceLogin{HTTPClient: httpClient(t), Issuer: ts.URL, MinInterval: time.Millisecond, SlowDownStep: 100 * time.Millisecond}
	dc, err := login.Start(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "ABCD-EFGH", dc.UserCode, "the usercode spelling is accepted too")
	assert.Equal(t, 50*time.Millisecond, dc.Interval)
	a, err := login.Wait(t.Context(), dc)
	require.NoError(t, err)
	assert.Equal(t, "ws-1", a.ChatGPTAccountID)
	assert.Equal(t, "at-1", a.Credentials.AccessToken)
	assert.WithinDuration(t, time.Now().Add(time.Hour), a.AccessExpiresAt, time.Minute, "expires_in when the token has no exp")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, polls, 4)
	assert.GreaterOrEqual(t, polls[1].Sub(polls[0]), 50*time.Millisecond, "the server's interval")
	assert.GreaterOrEqual(t, polls[2].Sub(polls[1]), 150*time.Millisecond, "slowed down by a step")
	assert.GreaterOrEqual(t, polls[3].Sub(polls[2]), 150*time.Millisecond, "and stays slower")

	_, err = oauth.DeviceLogin{HTTPClient: httpClient(t), Issuer: ts.URL + "/nowhere"}.Start(t.Context())
	assert.ErrorIs(t, err, oauth.ErrDeviceLoginOff)
}
