package sim

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// AccountState is an account as the sim holds it now: its configuration
// with the current tokens (refreshes rotate them), its usage and counters.
type AccountState struct {
	Account
	// Requests counts the response requests the account's token made
	// (answered in any way, prewarms included).
	Requests int `json:"requests"`
	// Refreshes counts successful refresh-token grants; RefreshesRejected
	// counts grants refused because the refresh token was already used.
	Refreshes         int `json:"refreshes"`
	RefreshesRejected int `json:"refreshes_rejected"`
	// Usage is the current state of the usage windows.
	Usage Usage `json:"usage"`
}

// Usage is the state of an account's usage windows.
type Usage struct {
	Primary   wire.RateLimitWindow `json:"primary"`
	Secondary wire.RateLimitWindow `json:"secondary"`
}

// accountState is the sim's copy of one account. Owned by Server; guarded
// by Server.mu.
type accountState struct {
	acct              Account
	primaryReset      time.Time
	secondaryReset    time.Time
	primaryUsed       float64
	secondaryUsed     float64
	requests          int
	refreshes         int
	refreshesRejected int
}

// tokenEntry is one access token the sim knows.
type tokenEntry struct {
	account   string
	expiresAt time.Time // zero: never
	revokeAt  time.Time // zero: not revoked; the token stops working then
}

// refreshEntry is one refresh token the sim issued or was given.
type refreshEntry struct {
	account string
	used    bool
}

// tokenStatus is the verdict on a presented access token.
type tokenStatus int

const (
	tokenValid tokenStatus = iota
	tokenUnknown
	tokenExpired
)

func (st *accountState) rateLimits() wire.RateLimits {
	return wire.RateLimits{
		Primary: &wire.RateLimitWindow{UsedPercent: st.primaryUsed,
			WindowMinutes: st.acct.Primary.WindowMinutes, ResetAt: st.primaryReset.Unix()},
		Secondary: &wire.RateLimitWindow{UsedPercent: st.secondaryUsed,
			WindowMinutes: st.acct.Secondary.WindowMinutes, ResetAt: st.secondaryReset.Unix()},
		Credits:     st.acct.Credits,
		ActiveLimit: "codex",
	}
}

func (st *accountState) snapshot() AccountState {
	rl := st.rateLimits()
	return AccountState{
		Account:           st.acct,
		Requests:          st.requests,
		Refreshes:         st.refreshes,
		RefreshesRejected: st.refreshesRejected,
		Usage:             Usage{Primary: *rl.Primary, Secondary: *rl.Secondary},
	}
}

// addAccountLocked adds a or replaces the account with its ID, keeping the
// counters of a replaced account. Caller holds s.mu.
func (s *Server) addAccountLocked(a Account) error {
	a.withDefaults()
	if err := a.validate(); err != nil {
		return err
	}
	if e, ok := s.tokens[a.AccessToken]; ok && e.account != a.ID {
		return fmt.Errorf("account %s: access token already belongs to account %s", a.ID, e.account)
	}
	if a.RefreshToken != "" {
		if e, ok := s.refreshTokens[a.RefreshToken]; ok && e.account != a.ID {
			return fmt.Errorf("account %s: refresh token already belongs to account %s", a.ID, e.account)
		}
	}
	now := s.cfg.Now()
	st := &accountState{}
	if old, ok := s.accounts[a.ID]; ok {
		st.requests, st.refreshes, st.refreshesRejected = old.requests, old.refreshes, old.refreshesRejected
		s.forgetTokensLocked(a.ID)
	} else {
		s.accountOrder = append(s.accountOrder, a.ID)
	}
	st.acct = a
	st.primaryUsed, st.secondaryUsed = min(a.Primary.UsedPercent, 100), min(a.Secondary.UsedPercent, 100)
	st.primaryReset = now.Add(windowReset(a.Primary))
	st.secondaryReset = now.Add(windowReset(a.Secondary))
	s.accounts[a.ID] = st
	entry := &tokenEntry{account: a.ID}
	if a.AccessTokenTTL > 0 {
		entry.expiresAt = now.Add(time.Duration(a.AccessTokenTTL))
	}
	s.tokens[a.AccessToken] = entry
	if a.RefreshToken != "" {
		s.refreshTokens[a.RefreshToken] = &refreshEntry{account: a.ID}
	}
	return nil
}

func windowReset(w Window) time.Duration {
	if w.ResetsIn > 0 {
		return time.Duration(w.ResetsIn)
	}
	return time.Duration(w.WindowMinutes) * time.Minute
}

// forgetTokensLocked drops every access and refresh token of an account.
// Caller holds s.mu.
func (s *Server) forgetTokensLocked(id string) {
	for tok, e := range s.tokens {
		if e.account == id {
			delete(s.tokens, tok)
		}
	}
	for tok, e := range s.refreshTokens {
		if e.account == id {
			delete(s.refreshTokens, tok)
		}
	}
}

// lookupTokenLocked finds the account of an access token. Caller holds s.mu.
func (s *Server) lookupTokenLocked(token string) (*accountState, tokenStatus) {
	e, ok := s.tokens[token]
	if !ok {
		return nil, tokenUnknown
	}
	st, ok := s.accounts[e.account]
	if !ok {
		return nil, tokenUnknown
	}
	now := s.cfg.Now()
	if !e.expiresAt.IsZero() && !now.Before(e.expiresAt) || !e.revokeAt.IsZero() && !now.Before(e.revokeAt) {
		return st, tokenExpired
	}
	return st, tokenValid
}

// tokenGrant is the answer of a successful refresh.
type tokenGrant struct {
	IDToken      string `json:"id_token"`
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	Scope        string `json:"scope"`
}

// refreshLocked redeems a refresh token: it issues a new access token and a
// new refresh token, and marks the old refresh token used, so presenting it
// again fails with refresh_token_reused. Caller holds s.mu.
func (s *Server) refreshLocked(refreshToken string) (tokenGrant, string, int, *wire.Error) {
	e, ok := s.refreshTokens[refreshToken]
	if !ok {
		return tokenGrant{}, "", http.StatusBadRequest, &wire.Error{Type: wire.TypeInvalidGrant, Code: wire.TypeInvalidGrant,
			Message: "Invalid refresh token."}
	}
	st, ok := s.accounts[e.account]
	if !ok {
		return tokenGrant{}, "", http.StatusBadRequest, &wire.Error{Type: wire.TypeInvalidGrant, Code: wire.TypeInvalidGrant,
			Message: "Invalid refresh token."}
	}
	if e.used {
		st.refreshesRejected++
		return tokenGrant{}, st.acct.ID, http.StatusUnauthorized, &wire.Error{Type: wire.TypeInvalidGrant, Code: wire.CodeRefreshTokenReused,
			Message: "Your refresh token has already been used to generate a new access token. Please try signing in again."}
	}
	now := s.cfg.Now()
	a := &st.acct
	ttl := time.Duration(a.AccessTokenTTL)
	expiresIn := int64(ttl / time.Second)
	if ttl <= 0 {
		expiresIn = int64((10 * 24 * time.Hour) / time.Second)
	}
	exp := now.Add(time.Duration(expiresIn) * time.Second)
	grant := tokenGrant{
		IDToken:      jwtLike(s.tokenClaims(a, now, exp)),
		AccessToken:  jwtLike(s.tokenClaims(a, now, exp)),
		RefreshToken: "rt_sim_" + randomHex(16),
		TokenType:    "Bearer",
		ExpiresIn:    expiresIn,
		Scope:        "openid profile email offline_access",
	}
	e.used = true
	if old, ok := s.tokens[a.AccessToken]; ok && a.RevokeOldAccessToken != nil {
		old.revokeAt = now.Add(time.Duration(*a.RevokeOldAccessToken))
	}
	entry := &tokenEntry{account: a.ID}
	if ttl > 0 {
		entry.expiresAt = now.Add(ttl)
	}
	s.tokens[grant.AccessToken] = entry
	s.refreshTokens[grant.RefreshToken] = &refreshEntry{account: a.ID}
	a.AccessToken, a.RefreshToken = grant.AccessToken, grant.RefreshToken
	st.refreshes++
	return grant, a.ID, http.StatusOK, nil
}

// tokenClaims are the claims of the id and access tokens the sim issues, in
// the layout of auth.openai.com tokens, so a relay can read the ChatGPT
// account id, plan and email from them.
func (s *Server) tokenClaims(a *Account, iat, exp time.Time) map[string]any {
	email := a.Email
	if email == "" {
		email = a.ID + "@sim.invalid"
	}
	return map[string]any{
		"iss":   "https://auth.openai.com",
		"aud":   []string{"https://api.openai.com/v1"},
		"sub":   "user-" + a.ID,
		"iat":   iat.Unix(),
		"exp":   exp.Unix(),
		"jti":   randomHex(12),
		"email": email,
		"https://api.openai.com/auth": map[string]any{
			"chatgpt_account_id": a.ChatGPTAccountID,
			"chatgpt_plan_type":  a.PlanType,
			"chatgpt_user_id":    "user-" + a.ID,
			"organization_id":    a.Organization,
		},
	}
}

// jwtLike returns an unsigned JWT-shaped token holding claims: readable like
// a real one, accepted only by this sim.
func jwtLike(claims map[string]any) string {
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"sim"}`))
	body, _ := json.Marshal(claims)
	return header + "." + base64.RawURLEncoding.EncodeToString(body) + ".sim"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// AddAccounts adds accounts, or replaces those with the same ID (keeping
// their counters; a replaced account's old tokens stop working). Either all
// are added or, on an error, none.
func (s *Server) AddAccounts(accts ...Account) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range accts {
		a := accts[i]
		a.withDefaults()
		if err := a.validate(); err != nil {
			return err
		}
		if e, ok := s.tokens[a.AccessToken]; ok && e.account != a.ID {
			return fmt.Errorf("account %s: access token already belongs to account %s", a.ID, e.account)
		}
		if e, ok := s.refreshTokens[a.RefreshToken]; ok && a.RefreshToken != "" && e.account != a.ID {
			return fmt.Errorf("account %s: refresh token already belongs to account %s", a.ID, e.account)
		}
		for _, b := range accts[:i] {
			switch {
			case b.ID == a.ID:
				return fmt.Errorf("account %s: given twice", a.ID)
			case b.AccessToken == a.AccessToken:
				return fmt.Errorf("accounts %s and %s: same access token", b.ID, a.ID)
			case a.RefreshToken != "" && b.RefreshToken == a.RefreshToken:
				return fmt.Errorf("accounts %s and %s: same refresh token", b.ID, a.ID)
			}
		}
	}
	for _, a := range accts {
		if err := s.addAccountLocked(a); err != nil {
			return err
		}
	}
	return nil
}

// RemoveAccount removes an account and its tokens; it reports whether the
// account existed. Its open WebSocket connections stay open.
func (s *Server) RemoveAccount(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.accounts[id]; !ok {
		return false
	}
	s.forgetTokensLocked(id)
	delete(s.accounts, id)
	s.accountOrder = slices.DeleteFunc(s.accountOrder, func(x string) bool { return x == id })
	return true
}

// Account returns the current state of an account.
func (s *Server) Account(id string) (AccountState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.accounts[id]
	if !ok {
		return AccountState{}, false
	}
	return st.snapshot(), true
}

// Accounts returns every account, in the order they were first added.
func (s *Server) Accounts() []AccountState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]AccountState, 0, len(s.accountOrder))
	for _, id := range s.accountOrder {
		out = append(out, s.accounts[id].snapshot())
	}
	return out
}

// RefreshCount returns how many refresh-token grants succeeded for account
// id (0 for an unknown account).
func (s *Server) RefreshCount(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.accounts[id]; ok {
		return st.refreshes
	}
	return 0
}

// bearerToken returns the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) string {
	v := strings.TrimSpace(r.Header.Get("Authorization"))
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}
