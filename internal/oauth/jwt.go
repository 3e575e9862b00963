package oauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// Claims are the claims of an auth.openai.com id or access token that the
// relay uses. Tokens are read without verifying their signature: the relay
// got them from the auth server or from the operator, and only reads
// metadata from them (the upstream verifies what matters).
type Claims struct {
	Email     string
	IssuedAt  time.Time // zero: no iat claim
	ExpiresAt time.Time // zero: no exp claim
	// From the https://api.openai.com/auth claim.
	ChatGPTAccountID string
	PlanType         string
	UserID           string
	OrganizationID   string
	Organizations    []Organization
}

// Organization is one entry of the organizations claim, present when the
// login asked for it (id_token_add_organizations=true, as Codex does).
type Organization struct {
	ID      string `json:"id"`
	Title   string `json:"title,omitempty"`
	Role    string `json:"role,omitempty"`
	Default bool   `json:"is_default,omitempty"`
}

var errNotJWT = errors.New("not a JWT")

// ParseClaims decodes the payload of a JWT-shaped token
// (header.payload.signature, base64url) without verifying it. It fails when
// the token is not of that shape; unknown or mistyped claims are ignored.
func ParseClaims(token string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return Claims{}, errNotJWT
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return Claims{}, errNotJWT
	}
	// The claims by their exact names; each is read on its own, so one of
	// an unexpected type is ignored rather than failing the token.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Claims{}, errNotJWT
	}
	var profile, auth map[string]json.RawMessage
	_ = json.Unmarshal(raw["https://api.openai.com/profile"], &profile)
	_ = json.Unmarshal(raw["https://api.openai.com/auth"], &auth)
	c := Claims{Email: jsonString(raw["email"])}
	if c.Email == "" {
		c.Email = jsonString(profile["email"])
	}
	c.ExpiresAt, c.IssuedAt = unixClaim(raw["exp"]), unixClaim(raw["iat"])
	if a := auth; a != nil {
		c.ChatGPTAccountID = jsonString(a["chatgpt_account_id"])
		c.PlanType = jsonString(a["chatgpt_plan_type"])
		c.UserID = jsonString(a["chatgpt_user_id"])
		if c.UserID == "" {
			c.UserID = jsonString(a["user_id"])
		}
		c.OrganizationID = jsonString(a["organization_id"])
		if v, ok := a["organizations"]; ok {
			var orgs []Organization
			if json.Unmarshal(v, &orgs) == nil {
				for _, o := range orgs {
					if o.ID != "" {
						c.Organizations = append(c.Organizations, o)
					}
				}
			}
		}
	}
	return c, nil
}

// Organization returns the organisation a token acts for: the
// organization_id claim, else the default entry of organizations, else the
// only one; "" when the token names none or several without a default.
func (c Claims) Organization() string {
	if c.OrganizationID != "" {
		return c.OrganizationID
	}
	for _, o := range c.Organizations {
		if o.Default {
			return o.ID
		}
	}
	if len(c.Organizations) == 1 {
		return c.Organizations[0].ID
	}
	return ""
}

// maxClaimTime is the last second a NumericDate claim is read as (the end
// of year 9999): a larger one means "never", and must not wrap round to a
// time long past.
const maxClaimTime = 253402300799

// unixClaim reads a NumericDate claim; zero when absent or not a number.
func unixClaim(raw json.RawMessage) time.Time {
	var v float64
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || v <= 0 {
		return time.Time{}
	}
	return time.Unix(int64(min(v, maxClaimTime)), 0).UTC()
}

func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return strings.TrimSpace(s)
}

// accessExpiry is when an access token stops working: the earlier of its
// JWT exp claim and the stored expiry, whichever are known; zero when
// neither is.
func accessExpiry(accessToken string, stored time.Time) time.Time {
	exp := stored
	if c, err := ParseClaims(accessToken); err == nil && !c.ExpiresAt.IsZero() {
		if exp.IsZero() || c.ExpiresAt.Before(exp) {
			exp = c.ExpiresAt
		}
	}
	return exp
}
