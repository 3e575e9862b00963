package oauth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// ImportedAccount is one upstream account read from a Codex auth.json or
// obtained by a device login, ready to be added to the relay.
type ImportedAccount struct {
	// Kind is chatgpt for a ChatGPT login (tokens), openai for a file that
	// holds only OPENAI_API_KEY.
	Kind store.Kind
	// ChatGPTAccountID is the workspace the tokens act for (sent upstream as
	// ChatGPT-Account-Id). It tells accounts apart: several workspaces of
	// one email are several accounts, matched by this id, never by email.
	ChatGPTAccountID string
	Email            string
	PlanType         string
	UserID           string
	// Organization is the organisation the tokens act for (organization_id
	// claim, else the default of organizations); Organizations lists all the
	// id token names.
	Organization    string
	Organizations   []Organization
	Credentials     store.Credentials
	AccessExpiresAt time.Time // from the access token's exp claim; zero when unknown
	LastRefresh     time.Time // auth.json's last_refresh; zero when absent
}

// Key identifies the upstream account: "chatgpt:<account id>", or for an API
// key "openai:<first 12 hex of its SHA-256>" (never the key itself).
func (a ImportedAccount) Key() string {
	if a.Kind == store.KindChatGPT {
		return "chatgpt:" + a.ChatGPTAccountID
	}
	return "openai:" + KeyFingerprint(a.Credentials.APIKey)
}

// KeyFingerprint is a short, irreversible name for a secret: the first 12
// hex digits of its SHA-256.
func KeyFingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:6])
}

// Label is a human name for the account: its email and plan, and for a
// ChatGPT account the end of its workspace id, so two workspaces of one
// email read apart.
func (a ImportedAccount) Label() string {
	if a.Kind != store.KindChatGPT {
		return "openai key " + KeyFingerprint(a.Credentials.APIKey)
	}
	ws := a.ChatGPTAccountID
	if len(ws) > 8 {
		ws = "…" + ws[len(ws)-8:]
	}
	name := firstNonBlank(a.Email, "chatgpt")
	if a.PlanType != "" {
		return fmt.Sprintf("%s (%s, %s)", name, a.PlanType, ws)
	}
	return fmt.Sprintf("%s (%s)", name, ws)
}

// authDotJSON is the shape of $CODEX_HOME/auth.json as Codex writes it
// (codex-rs/login, AuthDotJson):
//
//	{"auth_mode":"chatgpt","OPENAI_API_KEY":null|"sk-...",
//	 "tokens":{"id_token":"<JWT>","access_token":"<JWT>","refresh_token":"...","account_id":"..."},
//	 "last_refresh":"2025-01-01T00:00:00Z"}
type authDotJSON struct {
	AuthMode string  `json:"auth_mode"`
	APIKey   *string `json:"OPENAI_API_KEY"`
	Tokens   *struct {
		IDToken      string `json:"id_token"`
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
		AccountID    string `json:"account_id"`
	} `json:"tokens"`
	LastRefresh *time.Time `json:"last_refresh"`
}

// maxAuthJSON bounds the input of ParseAuthJSON.
const maxAuthJSON = 8 << 20

// ParseAuthJSON reads Codex auth.json content: one auth.json object, a JSON
// array of them, or several objects one after the other (for example the
// auth.json files of several workspaces concatenated). Each object yields
// one account: a ChatGPT account when it holds tokens (email, plan,
// workspace and organisations come from the id token's claims, falling back
// to the access token's), else an API-key account from OPENAI_API_KEY.
// Entries for the same account (same workspace, or same key) are merged,
// keeping the most recently refreshed. Errors never quote a token.
func ParseAuthJSON(data []byte) ([]ImportedAccount, error) {
	if len(data) > maxAuthJSON {
		return nil, fmt.Errorf("auth.json: larger than %d bytes", maxAuthJSON)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("auth.json: empty")
	}
	var entries []authDotJSON
	if data[0] == '[' {
		if err := json.Unmarshal(data, &entries); err != nil {
			return nil, fmt.Errorf("auth.json: %w", jsonProblem(err))
		}
	} else {
		dec := json.NewDecoder(bytes.NewReader(data))
		for {
			var e authDotJSON
			err := dec.Decode(&e)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("auth.json: entry %d: %w", len(entries)+1, jsonProblem(err))
			}
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		return nil, errors.New("auth.json: no entries")
	}
	var out []ImportedAccount
	index := map[string]int{}
	for i, e := range entries {
		a, err := e.account()
		if err != nil {
			if len(entries) == 1 {
				return nil, fmt.Errorf("auth.json: %w", err)
			}
			return nil, fmt.Errorf("auth.json: entry %d: %w", i+1, err)
		}
		if j, ok := index[a.Key()]; ok {
			if newer(a, out[j]) {
				out[j] = a
			}
			continue
		}
		index[a.Key()] = len(out)
		out = append(out, a)
	}
	return out, nil
}

// jsonProblem keeps a JSON error to its kind and position: an
// UnmarshalTypeError's text is safe, but be sure nothing of the input leaks.
func jsonProblem(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("malformed JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Errorf("field %q must be %s", te.Field, te.Type.String())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("malformed JSON: unexpected end")
	}
	return errors.New("malformed JSON")
}

func newer(a, b ImportedAccount) bool {
	if !a.LastRefresh.Equal(b.LastRefresh) {
		return a.LastRefresh.After(b.LastRefresh)
	}
	return a.AccessExpiresAt.After(b.AccessExpiresAt)
}

func (e authDotJSON) account() (ImportedAccount, error) {
	var a ImportedAccount
	if e.LastRefresh != nil {
		a.LastRefresh = e.LastRefresh.UTC()
	}
	t := e.Tokens
	if t == nil || t.AccessToken == "" && t.RefreshToken == "" && t.IDToken == "" {
		if e.APIKey == nil || strings.TrimSpace(*e.APIKey) == "" {
			return a, errors.New("holds neither tokens nor OPENAI_API_KEY")
		}
		a.Kind = store.KindOpenAI
		a.Credentials.APIKey = strings.TrimSpace(*e.APIKey)
		return a, nil
	}
	if t.AccessToken == "" && t.RefreshToken == "" {
		return a, errors.New("tokens: holds neither access_token nor refresh_token")
	}
	a.Kind = store.KindChatGPT
	a.Credentials = store.Credentials{AccessToken: strings.TrimSpace(t.AccessToken),
		RefreshToken: strings.TrimSpace(t.RefreshToken), IDToken: strings.TrimSpace(t.IDToken)}
	fillFromTokens(&a)
	if id := strings.TrimSpace(t.AccountID); id != "" {
		// What Codex sends as ChatGPT-Account-Id.
		a.ChatGPTAccountID = id
	}
	if a.ChatGPTAccountID == "" {
		return a, errors.New("no ChatGPT account id (tokens.account_id, or chatgpt_account_id in the id token)")
	}
	return a, nil
}

// fillFromTokens derives identity fields from the id token, falling back to
// the access token's claims, and the access expiry from the access token.
func fillFromTokens(a *ImportedAccount) {
	idc, _ := ParseClaims(a.Credentials.IDToken)
	acc, _ := ParseClaims(a.Credentials.AccessToken)
	a.ChatGPTAccountID = firstNonBlank(idc.ChatGPTAccountID, acc.ChatGPTAccountID)
	a.Email = firstNonBlank(idc.Email, acc.Email)
	a.PlanType = firstNonBlank(idc.PlanType, acc.PlanType)
	a.UserID = firstNonBlank(idc.UserID, acc.UserID)
	a.Organization = firstNonBlank(idc.Organization(), acc.Organization())
	a.Organizations = idc.Organizations
	if len(a.Organizations) == 0 {
		a.Organizations = acc.Organizations
	}
	a.AccessExpiresAt = acc.ExpiresAt
}

// AccountFromTokens builds the account a token grant (a device login, or
// tokens an operator pasted) belongs to, reading its identity from the
// tokens' claims. accountID, when given, wins over the claims.
func AccountFromTokens(idToken, accessToken, refreshToken, accountID string) (ImportedAccount, error) {
	a := ImportedAccount{Kind: store.KindChatGPT, Credentials: store.Credentials{
		IDToken: strings.TrimSpace(idToken), AccessToken: strings.TrimSpace(accessToken), RefreshToken: strings.TrimSpace(refreshToken)}}
	if a.Credentials.AccessToken == "" && a.Credentials.RefreshToken == "" {
		return a, errors.New("tokens: neither an access token nor a refresh token")
	}
	fillFromTokens(&a)
	if id := strings.TrimSpace(accountID); id != "" {
		a.ChatGPTAccountID = id
	}
	if a.ChatGPTAccountID == "" {
		return a, errors.New("no ChatGPT account id in the tokens' claims")
	}
	return a, nil
}
