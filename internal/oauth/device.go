package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Device-login outcomes other than success.
var (
	ErrDeviceCodeExpired  = errors.New("device login: the code expired before it was approved; start again")
	ErrDeviceLoginDenied  = errors.New("device login: the sign-in was denied")
	ErrDeviceLoginTimeout = errors.New("device login: not approved in time")
	ErrDeviceLoginOff     = errors.New("device login: this auth server does not offer device-code login (404); check the URL")
)

// DeviceLogin runs the ChatGPT device-code login, as `codex login
// --device-auth` does: it asks the auth server for a user code, shows the
// user where to enter it, polls until the login is approved, and exchanges
// the authorization code it gets for tokens. The zero value signs in at
// auth.openai.com.
type DeviceLogin struct {
	// HTTPClient sends the requests; default a client on
	// http.DefaultTransport.
	HTTPClient *http.Client
	// Issuer is the auth server's base URL; default DefaultIssuer. Tests
	// point it at the sim's URL.
	Issuer string
	// ClientID identifies the client; default CodexClientID.
	ClientID string
	// MaxWait bounds how long Wait polls; default 15 minutes (the life of a
	// user code).
	MaxWait time.Duration
	// MinInterval is the shortest wait between polls, whatever the server
	// says; default 1s.
	MinInterval time.Duration
	// SlowDownStep is added to the interval each time the server says
	// slow_down (or 429); default 5s, as RFC 8628 asks.
	SlowDownStep time.Duration
}

// DeviceCode is a pending device login: the user opens VerificationURL and
// enters UserCode.
type DeviceCode struct {
	VerificationURL string
	UserCode        string
	// Interval is the wait between polls the server asked for.
	Interval time.Duration
	// DeviceAuthID names the login when polling; it is not a secret the
	// user needs to see.
	DeviceAuthID string
}

func (d DeviceLogin) issuer() string {
	return strings.TrimRight(firstNonBlank(d.Issuer, DefaultIssuer), "/")
}

func (d DeviceLogin) client() *http.Client {
	if d.HTTPClient != nil {
		return d.HTTPClient
	}
	return &http.Client{}
}

func (d DeviceLogin) clientID() string { return firstNonBlank(d.ClientID, CodexClientID) }

func (d DeviceLogin) minInterval() time.Duration {
	if d.MinInterval > 0 {
		return d.MinInterval
	}
	return time.Second
}

func (d DeviceLogin) slowDownStep() time.Duration {
	if d.SlowDownStep > 0 {
		return d.SlowDownStep
	}
	return 5 * time.Second
}

// Start asks for a user code: POST {issuer}/api/accounts/deviceauth/usercode.
func (d DeviceLogin) Start(ctx context.Context) (DeviceCode, error) {
	body, _ := json.Marshal(map[string]string{"client_id": d.clientID()})
	status, raw, err := d.postJSON(ctx, d.issuer()+"/api/accounts/deviceauth/usercode", body)
	if err != nil {
		return DeviceCode{}, fmt.Errorf("device login: request a code: %w", err)
	}
	switch {
	case status == http.StatusNotFound:
		return DeviceCode{}, ErrDeviceLoginOff
	case status != http.StatusOK:
		code, _ := tokenErrorDetail(raw)
		return DeviceCode{}, fmt.Errorf("device login: request a code: HTTP %d %s", status, code)
	}
	var uc struct {
		DeviceAuthID string          `json:"device_auth_id"`
		UserCode     string          `json:"user_code"`
		UserCodeAlt  string          `json:"usercode"`
		Interval     json.RawMessage `json:"interval"`
	}
	if err := json.Unmarshal(raw, &uc); err != nil {
		return DeviceCode{}, errors.New("device login: the code answer is not JSON")
	}
	dc := DeviceCode{
		VerificationURL: d.issuer() + "/codex/device",
		UserCode:        firstNonBlank(uc.UserCode, uc.UserCodeAlt),
		DeviceAuthID:    uc.DeviceAuthID,
		Interval:        parseInterval(uc.Interval),
	}
	if dc.UserCode == "" || dc.DeviceAuthID == "" {
		return DeviceCode{}, errors.New("device login: the code answer lacks device_auth_id or user_code")
	}
	return dc, nil
}

// parseInterval reads the polling interval, in seconds, sent as a string
// ("5", as auth.openai.com does) or a number; zero when absent.
func parseInterval(raw json.RawMessage) time.Duration {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(strings.TrimSpace(s))
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || v < 0 || v > 3600 {
		return 0
	}
	return time.Duration(v * float64(time.Second))
}

// Wait polls POST {issuer}/api/accounts/deviceauth/token until the login
// is approved, then exchanges the authorization code at {issuer}/oauth/token
// and returns the account the tokens belong to. It honours the server's
// interval, slows down when told to (slow_down, or 429), and ends with
// ErrDeviceCodeExpired, ErrDeviceLoginDenied, ErrDeviceLoginTimeout (after
// MaxWait) or ctx's error.
func (d DeviceLogin) Wait(ctx context.Context, dc DeviceCode) (ImportedAccount, error) {
	maxWait := d.MaxWait
	if maxWait <= 0 {
		maxWait = 15 * time.Minute
	}
	wctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	interval := max(dc.Interval, d.minInterval())
	body, _ := json.Marshal(map[string]string{"device_auth_id": dc.DeviceAuthID, "user_code": dc.UserCode})
	transportFailures := 0
	for {
		status, raw, err := d.postJSON(wctx, d.issuer()+"/api/accounts/deviceauth/token", body)
		switch {
		case err != nil && wctx.Err() != nil:
			return ImportedAccount{}, d.waitEnded(ctx)
		case err != nil:
			if transportFailures++; transportFailures >= 3 {
				return ImportedAccount{}, fmt.Errorf("device login: poll: %w", err)
			}
		case status == http.StatusOK:
			return d.exchange(wctx, raw)
		default:
			transportFailures = 0
			code, _ := tokenErrorDetail(raw)
			switch {
			case code == "slow_down" || status == http.StatusTooManyRequests:
				interval += d.slowDownStep()
			case code == "expired_token" || code == "device_code_expired":
				return ImportedAccount{}, ErrDeviceCodeExpired
			case code == "access_denied":
				return ImportedAccount{}, ErrDeviceLoginDenied
			case code == "authorization_pending" || status == http.StatusForbidden || status == http.StatusNotFound || status >= 500:
				// Not approved yet (auth.openai.com answers 403 or 404), or a
				// passing server error: poll again.
			default:
				return ImportedAccount{}, fmt.Errorf("device login: poll: HTTP %d %s", status, code)
			}
		}
		t := time.NewTimer(interval)
		select {
		case <-wctx.Done():
			t.Stop()
			return ImportedAccount{}, d.waitEnded(ctx)
		case <-t.C:
		}
	}
}

// waitEnded says why polling stopped: the caller's context, or MaxWait.
func (d DeviceLogin) waitEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("device login: %w", err)
	}
	return ErrDeviceLoginTimeout
}

// exchange trades the approved login's authorization code for tokens, with
// the PKCE verifier the auth server handed back.
func (d DeviceLogin) exchange(ctx context.Context, raw []byte) (ImportedAccount, error) {
	var ok struct {
		AuthorizationCode string `json:"authorization_code"`
		CodeChallenge     string `json:"code_challenge"`
		CodeVerifier      string `json:"code_verifier"`
	}
	if json.Unmarshal(raw, &ok) != nil || ok.AuthorizationCode == "" {
		return ImportedAccount{}, errors.New("device login: the approval answer lacks authorization_code")
	}
	form := url.Values{
		"grant_type":    {"authorization_code"},
		"code":          {ok.AuthorizationCode},
		"redirect_uri":  {d.issuer() + "/deviceauth/callback"},
		"client_id":     {d.clientID()},
		"code_verifier": {ok.CodeVerifier},
	}
	g, err := postToken(ctx, d.client(), d.issuer()+"/oauth/token", "application/x-www-form-urlencoded",
		[]byte(form.Encode()), ok.AuthorizationCode, ok.CodeVerifier)
	if err != nil {
		return ImportedAccount{}, fmt.Errorf("device login: exchange the code: %w", err)
	}
	a, err := AccountFromTokens(g.IDToken, g.AccessToken, g.RefreshToken, "")
	if err != nil {
		return ImportedAccount{}, fmt.Errorf("device login: %w", err)
	}
	if a.AccessExpiresAt.IsZero() && g.ExpiresIn > 0 {
		a.AccessExpiresAt = time.Now().Add(g.ExpiresIn).UTC()
	}
	a.LastRefresh = time.Now().UTC()
	return a, nil
}

// Run starts a login, shows the code with show, and waits for approval.
func (d DeviceLogin) Run(ctx context.Context, show func(DeviceCode)) (ImportedAccount, error) {
	dc, err := d.Start(ctx)
	if err != nil {
		return ImportedAccount{}, err
	}
	if show != nil {
		show(dc)
	}
	return d.Wait(ctx, dc)
}

func (d DeviceLogin) postJSON(ctx context.Context, u string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := d.client().Do(req)
	if err != nil {
		return 0, nil, redactURLError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, raw, nil
}
