package sim

import (
	"bytes"
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

// deviceClient speaks the device-code login to a sim, as Codex does.
type deviceClient struct {
	t   *testing.T
	sim *Server
	hc  *http.Client
}

func newDeviceClient(t *testing.T, upstream *Server) *deviceClient {
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return &deviceClient{t: t, sim: upstream, hc: hc}
}

func (c *deviceClient) post(path, ctype, body string) (int, map[string]any) {
	c.t.Helper()
	resp, err := c.hc.Post(c.sim.URL+path, ctype, strings.NewReader(body))
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func (c *deviceClient) userCode() (id, code, interval string) {
	c.t.Helper()
	status, body := c.post("/api/accounts/deviceauth/usercode", "application/json", `{"client_id":"app_x"}`)
	require.Equal(c.t, http.StatusOK, status, "%v", body)
	return body["device_auth_id"].(string), body["user_code"].(string), body["interval"].(string)
}

func (c *deviceClient) poll(id, code string) (int, map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]string{"device_auth_id": id, "user_code": code})
	return c.post("/api/accounts/deviceauth/token", "application/json", string(b))
}

func (c *deviceClient) exchange(code, verifier, redirect string) (int, map[string]any) {
	c.t.Helper()
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect},
		"client_id": {"app_x"}, "code_verifier": {verifier}}
	return c.post("/oauth/token", "application/x-www-form-urlencoded", form.Encode())
}

// The whole device login: a code, pending polls, approval through the
// control API, the authorization code once, and its exchange for tokens of
// the approved account that work on the backend and refresh like any other.
func TestDeviceLoginApproved(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	require.NoError(t, upstream.SetDeviceLogin(0, 0))
	c := newDeviceClient(t, upstream)

	id, code, interval := c.userCode()
	assert.Equal(t, "0", interval, "the interval is a string of seconds")
	assert.Regexp(t, `^[A-Z2-9]{4}-[A-Z2-9]{4}$`, code)

	status, body := c.poll(id, code)
	assert.Equal(t, http.StatusForbidden, status, "pending answers 403, as auth.openai.com does")
	assert.Equal(t, "authorization_pending", body["error"])
	status, _ = c.poll(id, "WRNG-CODE")
	assert.Equal(t, http.StatusNotFound, status)

	pending := upstream.DeviceLogins()
	require.Len(t, pending, 1)
	assert.Equal(t, code, pending[0].UserCode)
	assert.False(t, pending[0].Approved)

	// The control API over HTTP, as a test in another process would use it.
	resp, err := c.hc.Post(upstream.ControlURL()+"/deviceauth/approve", "application/json",
		bytes.NewReader([]byte(`{"user_code":"`+strings.ToLower(code)+`","account":"a2"}`)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)

	status, body = c.poll(id, code)
	require.Equal(t, http.StatusOK, status, "%v", body)
	authCode, verifier := body["authorization_code"].(string), body["code_verifier"].(string)
	require.NotEmpty(t, authCode)
	require.NotEmpty(t, body["code_challenge"])
	status, _ = c.poll(id, code)
	assert.Equal(t, http.StatusNotFound, status, "the authorization code is handed out once")

	status, _ = c.exchange(authCode, "wrong-verifier", upstream.URL+"/deviceauth/callback")
	assert.Equal(t, http.StatusBadRequest, status, "PKCE: a wrong verifier is refused")
	status, _ = c.exchange(authCode, verifier, upstream.URL+"/deviceauth/callback")
	assert.Equal(t, http.StatusBadRequest, status, "and the code is spent by any attempt")

	// A second, clean login.
	id, code, _ = c.userCode()
	require.NoError(t, upstream.ApproveDeviceLogin(code, "a2"))
	status, body = c.poll(id, code)
	require.Equal(t, http.StatusOK, status)
	status, grant := c.exchange(body["authorization_code"].(string), body["code_verifier"].(string), upstream.URL+"/deviceauth/callback")
	require.Equal(t, http.StatusOK, status, "%v", grant)
	access, refreshTok := grant["access_token"].(string), grant["refresh_token"].(string)
	require.NotEmpty(t, access)
	require.NotEmpty(t, refreshTok)
	require.NotEmpty(t, grant["id_token"])

	st, _ := upstream.Account("a2")
	assert.Equal(t, access, st.AccessToken, "the login's tokens are the account's current ones")
	assert.Equal(t, 0, st.Refreshes, "a login is not a refresh")
	cl := clientFor(t, upstream, "a2")
	_, _, err = cl.turn(prompt(t, "hi"))
	assert.NoError(t, err, "the access token works on the backend")
	status2, g2, _ := refresh(t, upstream, refreshTok, true)
	assert.Equal(t, http.StatusOK, status2)
	assert.NotEmpty(t, g2.AccessToken)

	recs := upstream.Records(RecordFilter{Route: RouteDeviceToken, Account: "a2"})
	assert.Len(t, recs, 2, "approved polls are recorded with their account")
}

func TestDeviceLoginDeniedExpiredAndSlowDown(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	upstream := newSim(t, Config{Now: clock})
	c := newDeviceClient(t, upstream)

	// Default: poll every 5 seconds; faster polls are told to slow down.
	id, code, interval := c.userCode()
	assert.Equal(t, "5", interval)
	status, _ := c.poll(id, code)
	assert.Equal(t, http.StatusForbidden, status, "pending")
	status, body := c.poll(id, code)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, "slow_down", body["error"])
	advance(5 * time.Second)
	status, _ = c.poll(id, code)
	assert.Equal(t, http.StatusForbidden, status, "polling at the interval is fine")

	require.NoError(t, upstream.DenyDeviceLogin(code))
	advance(5 * time.Second)
	status, body = c.poll(id, code)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, "access_denied", body["error"])

	require.NoError(t, upstream.SetDeviceLogin(0, time.Minute))
	id, code, _ = c.userCode()
	advance(time.Minute)
	assert.Error(t, upstream.ApproveDeviceLogin(code, "a1"), "an expired code cannot be approved")
	status, body = c.poll(id, code)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, "expired_token", body["error"])

	_, code, _ = c.userCode()
	assert.Error(t, upstream.ApproveDeviceLogin(code, "k1"), "only chatgpt accounts sign in this way")
	assert.Error(t, upstream.ApproveDeviceLogin(code, "nobody"))
	assert.Error(t, upstream.ApproveDeviceLogin("NONE-SUCH", "a1"))
	assert.Error(t, upstream.SetDeviceLogin(-1, 0))
}

// The token endpoint keeps serving refresh grants, form or JSON, and still
// refuses grants it does not know, now that it also takes authorization codes.
func TestTokenEndpointKeepsRefreshGrants(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	status, _, _ := refresh(t, upstream, "rt-a1", false)
	assert.Equal(t, http.StatusOK, status)
	status, _, _ = refresh(t, upstream, "rt-b1", true)
	assert.Equal(t, http.StatusOK, status)
	c := newDeviceClient(t, upstream)
	status, body := c.exchange("never-issued", "v", upstream.URL+"/deviceauth/callback")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, wire.TypeInvalidGrant, body["error"])
	status, _ = c.post("/oauth/token", "application/x-www-form-urlencoded", "grant_type=password&username=x")
	assert.Equal(t, http.StatusBadRequest, status)
}
