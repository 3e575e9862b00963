// Package codexauth writes the auth.json of a Codex that is signed in
// "with ChatGPT" where its ChatGPT is the relay: the access token is a
// relay client key, and the ID token an unsigned JWT with the claims
// Codex reads (an email, a plan, a workspace). Codex sends the access
// token as its bearer token and offers what only a ChatGPT sign-in gets
// (its image tool, the /status card's limits), at the chatgpt_base_url
// its config.toml names: the relay's.
package codexauth

import (
	"encoding/base64"
	"encoding/json"
	"time"
)

// Workspace is the ChatGPT-Account-Id Codex sends with such a sign-in,
// and the workspace the relay's wham/accounts/check lists for it.
const Workspace = "relay"

// Email is the address the ID token names (Codex shows it in /status).
const Email = "codex@codex-relay.invalid"

// AuthJSON is the auth.json of a ChatGPT sign-in whose access token is key,
// last refreshed at now (Codex refreshes a sign-in it thinks stale; the
// refresh token is a placeholder the relay never sees). Codex does not
// verify the ID token's signature: it is unsigned.
func AuthJSON(key string, now time.Time) ([]byte, error) {
	claims, err := json.Marshal(map[string]any{
		"email": Email,
		"iat":   now.Unix(),
		"exp":   now.Add(10 * 365 * 24 * time.Hour).Unix(),
		"https://api.openai.com/auth": map[string]any{
			"chatgpt_account_id": Workspace,
			"chatgpt_plan_type":  "team",
			"chatgpt_user_id":    "codex-relay",
			"user_id":            "codex-relay",
		},
		"https://api.openai.com/profile": map[string]any{"email": Email},
	})
	if err != nil {
		return nil, err
	}
	enc := base64.RawURLEncoding
	idToken := enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc.EncodeToString(claims) + "." + enc.EncodeToString([]byte("unsigned"))
	out, err := json.MarshalIndent(map[string]any{
		"OPENAI_API_KEY": nil,
		"auth_mode":      "chatgpt",
		"tokens": map[string]any{
			"id_token":      idToken,
			"access_token":  key,
			"refresh_token": "unused: the relay signs nothing in",
			"account_id":    Workspace,
		},
		"last_refresh": now.UTC().Format(time.RFC3339),
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
