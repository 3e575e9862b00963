package sim

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// Routes of the device-code login.
const (
	RouteDeviceUserCode Route = "deviceauth/usercode"
	RouteDeviceToken    Route = "deviceauth/token"
)

// Device-login defaults: auth.openai.com's user codes live 15 minutes; the
// sim asks clients to poll every 5 seconds unless told otherwise.
const (
	defaultDeviceInterval = 5
	defaultDeviceTTL      = 15 * time.Minute
)

// deviceAuth is the sim's device-code login, as the Codex CLI drives it
// (codex-rs/login device_code_auth.rs) against auth.openai.com:
//
//	POST /api/accounts/deviceauth/usercode {"client_id"}
//	     -> {"device_auth_id","user_code","interval":"5"}
//	POST /api/accounts/deviceauth/token {"device_auth_id","user_code"}
//	     -> 403 {"error":"authorization_pending"} until approved,
//	        400 {"error":"slow_down"} when polled faster than the interval,
//	        400 {"error":"expired_token"} once the code expired,
//	        400 {"error":"access_denied"} when denied,
//	        200 {"authorization_code","code_challenge","code_verifier"} once approved
//	POST /oauth/token grant_type=authorization_code&code&redirect_uri&client_id&code_verifier
//	     -> the tokens of the account the login was approved for
//
// The user's side (opening {URL}/codex/device, entering the code, choosing an
// account) is the control API: a test approves or denies a login there.
//
//	GET  /_sim/deviceauth            pending logins
//	POST /_sim/deviceauth/approve    {"user_code","account"}: approve for a sim account
//	POST /_sim/deviceauth/deny       {"user_code"}
//	POST /_sim/deviceauth/settings   {"interval":seconds,"expires_in":"15m"}: for codes issued later
//
// Every other grant of POST /oauth/token goes to handleToken. State lives in
// the closures deviceRoutes registers; the Go methods below reach it through
// the control routes.
type deviceAuth struct {
	s *Server

	mu       sync.Mutex // guards the fields below
	interval int        // seconds, for codes issued later
	ttl      time.Duration
	logins   map[string]*deviceLogin // by device_auth_id
	codes    map[string]*authCode    // authorization codes, by code
}

type deviceLogin struct {
	id        string
	userCode  string
	interval  int
	expiresAt time.Time
	lastPoll  time.Time
	account   string // approved for this sim account
	denied    bool
	code      string // authorization code, once approved
	verifier  string
	challenge string
}

type authCode struct {
	account   string
	challenge string
	expiresAt time.Time
	used      bool
}

// DeviceLoginState is a pending device login, as the control API lists it.
type DeviceLoginState struct {
	UserCode  string    `json:"user_code"`
	ExpiresAt time.Time `json:"expires_at"`
	Approved  bool      `json:"approved"`
	Account   string    `json:"account,omitempty"`
	Denied    bool      `json:"denied"`
}

// deviceRoutes registers the device-code login, POST /oauth/token for every
// grant, and the device-login control routes.
func (s *Server) deviceRoutes(mux *http.ServeMux) {
	d := &deviceAuth{s: s, interval: defaultDeviceInterval, ttl: defaultDeviceTTL,
		logins: map[string]*deviceLogin{}, codes: map[string]*authCode{}}
	mux.HandleFunc("POST /api/accounts/deviceauth/usercode", d.handleUserCode)
	mux.HandleFunc("POST /api/accounts/deviceauth/token", d.handlePoll)
	mux.HandleFunc("POST /oauth/token", d.handleToken)
	p := controlPrefix + "/deviceauth"
	mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, d.list()) })
	mux.HandleFunc("POST "+p+"/approve", d.handleApprove)
	mux.HandleFunc("POST "+p+"/deny", d.handleDeny)
	mux.HandleFunc("POST "+p+"/settings", d.handleSettings)
}

// oauthError answers an OAuth-style error: {"error":code,"error_description":msg}.
func oauthError(w http.ResponseWriter, ref recordRef, now time.Time, status int, code, msg string) {
	ref.fail(status, wire.Error{Type: code, Code: code, Message: msg}, now)
	writeJSON(w, status, map[string]string{"error": code, "error_description": msg})
}

func (d *deviceAuth) handleUserCode(w http.ResponseWriter, r *http.Request) {
	now := d.s.cfg.Now()
	ref := d.s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteDeviceUserCode, now))
	var body struct {
		ClientID string `json:"client_id"`
	}
	raw, err := readBody(r, 1<<20)
	if err != nil || json.Unmarshal(raw, &body) != nil || body.ClientID == "" {
		oauthError(w, ref, now, http.StatusBadRequest, "invalid_request", "send JSON {\"client_id\":...}")
		return
	}
	d.mu.Lock()
	l := &deviceLogin{id: "deviceauth_" + randomHex(12), userCode: userCode(), interval: d.interval, expiresAt: now.Add(d.ttl)}
	d.logins[l.id] = l
	d.mu.Unlock()
	ref.finish(http.StatusOK, OutcomeOK, now)
	// The interval is a string of seconds, as auth.openai.com sends it.
	writeJSON(w, http.StatusOK, map[string]string{"device_auth_id": l.id, "user_code": l.userCode, "interval": fmt.Sprint(l.interval)})
}

// userCode returns a code like "K7QD-3MXR" from letters and digits that do
// not read alike.
func userCode() string {
	const alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	var b [8]byte
	_, _ = rand.Read(b[:])
	out := make([]byte, 0, 9)
	for i := 0; i < 8; i++ {
		if i == 4 {
			out = append(out, '-')
		}
		out = append(out, alphabet[int(b[i])%len(alphabet)])
	}
	return string(out)
}

func (d *deviceAuth) handlePoll(w http.ResponseWriter, r *http.Request) {
	now := d.s.cfg.Now()
	ref := d.s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteDeviceToken, now))
	var body struct {
		DeviceAuthID string `json:"device_auth_id"`
		UserCode     string `json:"user_code"`
	}
	raw, err := readBody(r, 1<<20)
	if err != nil || json.Unmarshal(raw, &body) != nil {
		oauthError(w, ref, now, http.StatusBadRequest, "invalid_request", "send JSON {\"device_auth_id\":...,\"user_code\":...}")
		return
	}
	d.mu.Lock()
	l, ok := d.logins[body.DeviceAuthID]
	if !ok || l.userCode != body.UserCode {
		d.mu.Unlock()
		oauthError(w, ref, now, http.StatusNotFound, "invalid_device_auth", "unknown device_auth_id or user_code")
		return
	}
	tooSoon := !l.lastPoll.IsZero() && now.Sub(l.lastPoll) < time.Duration(l.interval)*time.Second
	l.lastPoll = now
	switch {
	case !now.Before(l.expiresAt):
		delete(d.logins, l.id)
		d.mu.Unlock()
		oauthError(w, ref, now, http.StatusBadRequest, "expired_token", "the device code expired; start again")
	case l.denied:
		delete(d.logins, l.id)
		d.mu.Unlock()
		oauthError(w, ref, now, http.StatusBadRequest, "access_denied", "the sign-in was denied")
	case tooSoon:
		d.mu.Unlock()
		oauthError(w, ref, now, http.StatusBadRequest, "slow_down", fmt.Sprintf("poll at most every %d seconds", l.interval))
	case l.code == "":
		d.mu.Unlock()
		oauthError(w, ref, now, http.StatusForbidden, "authorization_pending", "the user has not approved the sign-in yet")
	default:
		delete(d.logins, l.id) // the code is handed out once
		d.codes[l.code] = &authCode{account: l.account, challenge: l.challenge, expiresAt: now.Add(10 * time.Minute)}
		answer := map[string]string{"authorization_code": l.code, "code_challenge": l.challenge, "code_verifier": l.verifier}
		account := l.account
		d.mu.Unlock()
		ref.update(func(rec *Record) { rec.Account = account })
		ref.finish(http.StatusOK, OutcomeOK, now)
		writeJSON(w, http.StatusOK, answer)
	}
}

// handleToken serves POST /oauth/token: grant_type=authorization_code here,
// every other grant by Server.handleToken.
func (d *deviceAuth) handleToken(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	form, _ := url.ParseQuery(string(raw))
	if r.Header.Get("Content-Encoding") != "" || form.Get("grant_type") != "authorization_code" {
		r.Body = io.NopCloser(bytes.NewReader(raw))
		d.s.handleToken(w, r)
		return
	}
	now := d.s.cfg.Now()
	ref := d.s.rec.add(headerRecord(r, RecordHTTP, TransportHTTP, RouteToken, now))
	code, verifier := form.Get("code"), form.Get("code_verifier")
	d.mu.Lock()
	c, ok := d.codes[code]
	valid := ok && !c.used && now.Before(c.expiresAt) && pkceChallenge(verifier) == c.challenge &&
		strings.HasSuffix(form.Get("redirect_uri"), "/deviceauth/callback")
	if ok {
		c.used = true // a code works once, even when the attempt was wrong
	}
	d.mu.Unlock()
	if !valid {
		oauthError(w, ref, now, http.StatusBadRequest, "invalid_grant", "invalid, spent or expired authorization code, or a wrong code_verifier or redirect_uri")
		return
	}
	ref.update(func(rec *Record) { rec.Account = c.account })
	grant, err := d.s.issueLoginTokens(c.account)
	if err != nil {
		oauthError(w, ref, now, http.StatusBadRequest, "invalid_grant", err.Error())
		return
	}
	ref.finish(http.StatusOK, OutcomeOK, now)
	writeJSON(w, http.StatusOK, grant)
}

// pkceChallenge is the S256 code challenge of a verifier.
func pkceChallenge(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// issueLoginTokens signs an account in: new access and refresh tokens (the
// account's current ones from now on; earlier ones keep working, as after a
// second login), with id and access tokens in auth.openai.com's layout.
func (s *Server) issueLoginTokens(accountID string) (tokenGrant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.accounts[accountID]
	if !ok || st.acct.Kind != KindChatGPT {
		return tokenGrant{}, fmt.Errorf("no chatgpt account %q", accountID)
	}
	now := s.cfg.Now()
	a := &st.acct
	ttl := time.Duration(a.AccessTokenTTL)
	if ttl <= 0 {
		ttl = 10 * 24 * time.Hour
	}
	exp := now.Add(ttl)
	grant := tokenGrant{
		IDToken:      jwtLike(s.tokenClaims(a, now, exp)),
		AccessToken:  jwtLike(s.tokenClaims(a, now, exp)),
		RefreshToken: "rt_sim_" + randomHex(16),
		TokenType:    "Bearer",
		ExpiresIn:    int64(ttl / time.Second),
		Scope:        "openid profile email offline_access",
	}
	entry := &tokenEntry{account: a.ID}
	if a.AccessTokenTTL > 0 {
		entry.expiresAt = exp
	}
	s.tokens[grant.AccessToken] = entry
	s.refreshTokens[grant.RefreshToken] = &refreshEntry{account: a.ID}
	a.AccessToken, a.RefreshToken = grant.AccessToken, grant.RefreshToken
	return grant, nil
}

func (d *deviceAuth) list() []DeviceLoginState {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []DeviceLoginState{}
	for _, l := range d.logins {
		out = append(out, DeviceLoginState{UserCode: l.userCode, ExpiresAt: l.expiresAt, Approved: l.code != "", Account: l.account, Denied: l.denied})
	}
	return out
}

// byUserCode finds a pending login. Caller holds d.mu.
func (d *deviceAuth) byUserCode(code string) *deviceLogin {
	code = strings.ToUpper(strings.TrimSpace(code))
	for _, l := range d.logins {
		if l.userCode == code {
			return l
		}
	}
	return nil
}

func (d *deviceAuth) handleApprove(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserCode string `json:"user_code"`
		Account  string `json:"account"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		controlError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return
	}
	st, ok := d.s.Account(body.Account)
	if !ok || st.Kind != KindChatGPT {
		controlError(w, http.StatusBadRequest, fmt.Errorf("no chatgpt account %q", body.Account))
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.byUserCode(body.UserCode)
	if l == nil || !d.s.cfg.Now().Before(l.expiresAt) {
		controlError(w, http.StatusNotFound, fmt.Errorf("no pending device login with user code %q", body.UserCode))
		return
	}
	l.account = body.Account
	l.code = "ac_sim_" + randomHex(16)
	l.verifier = randomHex(32)
	l.challenge = pkceChallenge(l.verifier)
	w.WriteHeader(http.StatusNoContent)
}

func (d *deviceAuth) handleDeny(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserCode string `json:"user_code"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		controlError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.byUserCode(body.UserCode)
	if l == nil {
		controlError(w, http.StatusNotFound, fmt.Errorf("no pending device login with user code %q", body.UserCode))
		return
	}
	l.denied = true
	w.WriteHeader(http.StatusNoContent)
}

func (d *deviceAuth) handleSettings(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Interval  *int      `json:"interval"`
		ExpiresIn *Duration `json:"expires_in"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		controlError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return
	}
	if body.Interval != nil && (*body.Interval < 0 || *body.Interval > 3600) ||
		body.ExpiresIn != nil && *body.ExpiresIn <= 0 {
		controlError(w, http.StatusBadRequest, fmt.Errorf("interval must be 0..3600 seconds and expires_in positive"))
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if body.Interval != nil {
		d.interval = *body.Interval
	}
	if body.ExpiresIn != nil {
		d.ttl = time.Duration(*body.ExpiresIn)
	}
	w.WriteHeader(http.StatusNoContent)
}

// control calls one control route in-process and returns an error for an
// answer other than 2xx.
func (s *Server) control(method, path string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req := httptest.NewRequest(method, controlPrefix+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.mux.ServeHTTP(rec, req)
	if rec.Code/100 != 2 {
		if e, ok := wire.ParseErrorBody(rec.Body.Bytes()); ok {
			return fmt.Errorf("%s %s: %s", method, path, e.Message)
		}
		return fmt.Errorf("%s %s: HTTP %d", method, path, rec.Code)
	}
	if out != nil {
		return json.Unmarshal(rec.Body.Bytes(), out)
	}
	return nil
}

// ApproveDeviceLogin approves the pending device login with userCode for
// the sim's chatgpt account accountID, as a user entering the code at
// {URL}/codex/device would (control route POST /_sim/deviceauth/approve).
func (s *Server) ApproveDeviceLogin(userCode, accountID string) error {
	return s.control(http.MethodPost, "/deviceauth/approve", map[string]string{"user_code": userCode, "account": accountID}, nil)
}

// DenyDeviceLogin denies the pending device login with userCode.
func (s *Server) DenyDeviceLogin(userCode string) error {
	return s.control(http.MethodPost, "/deviceauth/deny", map[string]string{"user_code": userCode}, nil)
}

// DeviceLogins lists the device logins not yet handed out or expired.
func (s *Server) DeviceLogins() []DeviceLoginState {
	var out []DeviceLoginState
	if err := s.control(http.MethodGet, "/deviceauth", nil, &out); err != nil {
		return nil
	}
	return out
}

// SetDeviceLogin sets the polling interval (seconds; 0 lets clients poll
// as fast as they like) and the lifetime of user codes issued from now on.
// A zero ttl keeps the current lifetime.
func (s *Server) SetDeviceLogin(intervalSeconds int, ttl time.Duration) error {
	body := map[string]any{"interval": intervalSeconds}
	if ttl > 0 {
		body["expires_in"] = Duration(ttl)
	}
	return s.control(http.MethodPost, "/deviceauth/settings", body, nil)
}
