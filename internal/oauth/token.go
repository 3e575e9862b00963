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
	"strings"
	"time"
)

// The auth server Codex signs in with, and its public client id.
const (
	DefaultIssuer   = "https://auth.openai.com"
	DefaultTokenURL = DefaultIssuer + "/oauth/token"
	// CodexClientID is the OAuth client id of the Codex CLI; tokens issued to
	// it are refreshed with it.
	CodexClientID = "app_EMoamEEZ73f0CkXaXp7hrann"
)

// maxTokenAnswer bounds what is read of a token endpoint answer.
const maxTokenAnswer = 1 << 20

// grant is a successful answer of the token endpoint. A refresh may omit
// the id token or the refresh token (then the old ones stay valid).
type grant struct {
	IDToken      string
	AccessToken  string
	RefreshToken string
	ExpiresIn    time.Duration // zero: not given
}

// RejectedError is a token request the auth server refused (HTTP 400 or
// 401): the refresh token is spent, expired or revoked, or the grant is
// otherwise invalid. Retrying will not help; the account needs a new login.
// Its text never contains a token.
type RejectedError struct {
	Status  int    // HTTP status, 400 or 401
	Code    string // e.g. invalid_grant, refresh_token_reused, refresh_token_expired
	Message string // the auth server's message, tokens scrubbed, shortened
}

func (e *RejectedError) Error() string {
	return "token refresh rejected: " + e.Reason()
}

// Reason is the account status reason a rejection leaves:
// "HTTP 401 refresh_token_reused: <message>".
func (e *RejectedError) Reason() string {
	r := fmt.Sprintf("HTTP %d %s", e.Status, e.Code)
	if e.Message != "" {
		r += ": " + e.Message
	}
	return r
}

// TokenError is a token request that failed without a verdict on the
// grant: the auth server was unreachable, answered 5xx or 429, or sent an
// answer that could not be read. The account is left as it is.
type TokenError struct {
	Status int // 0 when no HTTP answer arrived
	Code   string
	Err    error
}

func (e *TokenError) Error() string {
	switch {
	case e.Status == 0:
		return fmt.Sprintf("token endpoint: %v", e.Err)
	case e.Code != "":
		return fmt.Sprintf("token endpoint: HTTP %d %s", e.Status, e.Code)
	case e.Err != nil:
		return fmt.Sprintf("token endpoint: HTTP %d: %v", e.Status, e.Err)
	}
	return fmt.Sprintf("token endpoint: HTTP %d", e.Status)
}

func (e *TokenError) Unwrap() error { return e.Err }

// postToken sends one request to a token endpoint and reads the grant.
// secrets are scrubbed from anything of the answer that ends up in an error.
func postToken(ctx context.Context, hc *http.Client, tokenURL, contentType string, body []byte, secrets ...string) (grant, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, bytes.NewReader(body))
	if err != nil {
		return grant{}, &TokenError{Err: err}
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return grant{}, &TokenError{Err: redactURLError(err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer))
	if err != nil {
		return grant{}, &TokenError{Status: resp.StatusCode, Err: errors.New("reading the answer failed")}
	}
	if resp.StatusCode != http.StatusOK {
		code, msg := tokenErrorDetail(raw)
		if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized {
			if code == "" {
				code = "http_" + fmt.Sprint(resp.StatusCode)
			}
			return grant{}, &RejectedError{Status: resp.StatusCode, Code: code, Message: scrub(msg, secrets...)}
		}
		return grant{}, &TokenError{Status: resp.StatusCode, Code: code}
	}
	var g struct {
		IDToken      string          `json:"id_token"`
		AccessToken  string          `json:"access_token"`
		RefreshToken string          `json:"refresh_token"`
		ExpiresIn    json.RawMessage `json:"expires_in"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		return grant{}, &TokenError{Status: resp.StatusCode, Err: errors.New("the answer is not a JSON token grant")}
	}
	out := grant{IDToken: g.IDToken, AccessToken: g.AccessToken, RefreshToken: g.RefreshToken}
	var secs float64
	if len(g.ExpiresIn) > 0 && json.Unmarshal(g.ExpiresIn, &secs) == nil && secs > 0 {
		out.ExpiresIn = time.Duration(secs * float64(time.Second))
	}
	return out, nil
}

// refreshGrant redeems a refresh token the way Codex does: a JSON body with
// the client id.
func refreshGrant(ctx context.Context, hc *http.Client, tokenURL, clientID, refreshToken string) (grant, error) {
	body, _ := json.Marshal(map[string]string{
		"client_id":     clientID,
		"grant_type":    "refresh_token",
		"refresh_token": refreshToken,
		"scope":         "openid profile email",
	})
	return postToken(ctx, hc, tokenURL, "application/json", body, refreshToken)
}

// tokenErrorDetail reads the error code and message of a token endpoint
// error answer, in either shape auth.openai.com uses: OAuth's
// {"error":"invalid_grant","error_description":"..."} or the API's
// {"error":{"code":"refresh_token_reused","type":"invalid_request_error","message":"..."}}.
func tokenErrorDetail(raw []byte) (code, msg string) {
	var body struct {
		Error       json.RawMessage `json:"error"`
		Code        string          `json:"code"`
		Description string          `json:"error_description"`
		Message     string          `json:"message"`
	}
	if json.Unmarshal(raw, &body) != nil {
		return "", ""
	}
	var s string
	var obj struct {
		Code    string `json:"code"`
		Type    string `json:"type"`
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	switch {
	case json.Unmarshal(body.Error, &s) == nil:
		code = s
	case json.Unmarshal(body.Error, &obj) == nil:
		code = firstNonBlank(obj.Code, obj.Error, obj.Type)
		msg = obj.Message
	}
	code = firstNonBlank(code, body.Code)
	msg = firstNonBlank(body.Description, msg, body.Message)
	return sanitizeCode(code), msg
}

// sanitizeCode keeps an error code to a short identifier.
func sanitizeCode(code string) string {
	code = strings.TrimSpace(code)
	if len(code) > 64 {
		code = code[:64]
	}
	for _, r := range code {
		if !(r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return "invalid_error_code"
		}
	}
	return code
}

// scrub removes secrets from a message meant for logs or a status reason,
// and shortens it.
func scrub(msg string, secrets ...string) string {
	for _, s := range secrets {
		if len(s) >= 6 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if r := []rune(msg); len(r) > 200 {
		msg = string(r[:200]) + "…"
	}
	return msg
}

// redactURLError drops the query of the URL a transport error names: token
// endpoints take no secrets in the URL, but a configured URL might.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			u.RawQuery, u.User, u.Fragment = "", nil, ""
			return &url.Error{Op: ue.Op, URL: u.String(), Err: ue.Err}
		}
	}
	return err
}

// firstNonBlank returns the first of v that is not blank, trimmed: the
// fields an auth server fills vary, and some hold only spaces.
func firstNonBlank(v ...string) string {
	for _, s := range v {
		if s = strings.TrimSpace(s); s != "" {
			return s
		}
	}
	return ""
}
