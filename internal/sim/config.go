package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// Kind is the upstream flavour an account belongs to, which decides the
// routes its token is valid on.
type Kind string

const (
	// KindChatGPT is a ChatGPT subscription account: /backend-api/... routes,
	// with ChatGPT-Account-Id, refreshable through /oauth/token.
	KindChatGPT Kind = "chatgpt"
	// KindOpenAI is an OpenAI API key: /v1/... routes.
	KindOpenAI Kind = "openai"
)

// Transport is how a request reached the sim.
type Transport string

const (
	// TransportHTTP is a POST answered with JSON or an SSE stream.
	TransportHTTP Transport = "http"
	// TransportWS is a Responses WebSocket (its handshake and messages).
	TransportWS Transport = "ws"
)

// Duration is a time.Duration that JSON encodes as a Go duration string
// ("90s", "1h30m") and decodes from such a string or from a number of
// seconds.
type Duration time.Duration

// MarshalJSON encodes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON decodes a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration: want a string like \"90s\" or a number of seconds, got %s", b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// Window configures one usage window of an account.
type Window struct {
	// UsedPercent is how much of the window is used, 0 to 100.
	UsedPercent float64 `json:"used_percent"`
	// WindowMinutes is the window's length; zero selects 300 (5 hours) for
	// the primary and 10080 (a week) for the secondary window.
	WindowMinutes int `json:"window_minutes,omitempty"`
	// ResetsIn is when the window resets, counted from when the account is
	// added; zero selects the window's length.
	ResetsIn Duration `json:"resets_in,omitempty"`
}

// Account is one upstream credential the sim serves. It is plain data: the
// sim copies it when the account is added, and rotating tokens change the
// sim's copy, which AccountState reports.
type Account struct {
	// ID names the account in records, faults and the control API. Required.
	ID string `json:"id"`
	// Label is a human name, shown by `codex-relay sim`; defaults to ID.
	Label string `json:"label,omitempty"`
	// Kind selects the routes the token works on; default chatgpt.
	Kind Kind `json:"kind,omitempty"`
	// AccessToken is the bearer token (the API key, for openai accounts).
	// Required, and unique across accounts.
	AccessToken string `json:"access_token"`
	// RefreshToken is accepted once by /oauth/token (chatgpt accounts).
	RefreshToken string `json:"refresh_token,omitempty"`
	// ChatGPTAccountID is the ChatGPT-Account-Id the backend routes demand
	// with the token; defaults to ID for chatgpt accounts.
	ChatGPTAccountID string `json:"chatgpt_account_id,omitempty"`
	// Organization issued the account's ciphertext: only accounts of the
	// same organisation can read it. Defaults to ID (an organisation alone).
	Organization string `json:"organization,omitempty"`
	// Email and PlanType appear in id tokens and the usage answer; PlanType
	// defaults to "plus".
	Email    string `json:"email,omitempty"`
	PlanType string `json:"plan_type,omitempty"`
	// Primary (5-hour) and Secondary (weekly) usage windows.
	Primary   Window `json:"primary"`
	Secondary Window `json:"secondary"`
	// Credits, when set, is reported by the credits headers and usage.
	Credits *wire.Credits `json:"credits,omitempty"`
	// UsagePerRequest is added to both windows' used percent (capped at
	// 100) for every response the account completes.
	UsagePerRequest float64 `json:"usage_per_request,omitempty"`
	// SealMessages makes every assistant message the account emits carry
	// its own encrypted_content (an encrypted agent-message body), and
	// SealToolCalls does the same for tool calls. A relay cannot strip such
	// ciphertext; another organisation rejects it with a 400 that has no
	// code and says "could not be decrypted".
	SealMessages  bool `json:"seal_messages,omitempty"`
	SealToolCalls bool `json:"seal_tool_calls,omitempty"`
	// AccessTokenTTL, when positive, is the lifetime of the account's access
	// tokens (the configured one counted from when the account is added, a
	// refreshed one from its refresh); past it they are rejected with 401
	// token_expired. Zero: tokens do not expire.
	AccessTokenTTL Duration `json:"access_token_ttl,omitempty"`
	// RevokeOldAccessToken, when set, makes the previous access token stop
	// working this long after a refresh replaces it (zero: at once). Nil:
	// the previous token keeps working until it expires.
	RevokeOldAccessToken *Duration `json:"revoke_old_access_token,omitempty"`
}

func (a *Account) withDefaults() {
	if a.Kind == "" {
		a.Kind = KindChatGPT
	}
	if a.Label == "" {
		a.Label = a.ID
	}
	if a.Organization == "" {
		a.Organization = a.ID
	}
	if a.PlanType == "" {
		a.PlanType = "plus"
	}
	if a.Kind == KindChatGPT && a.ChatGPTAccountID == "" {
		a.ChatGPTAccountID = a.ID
	}
	if a.Primary.WindowMinutes == 0 {
		a.Primary.WindowMinutes = 300
	}
	if a.Secondary.WindowMinutes == 0 {
		a.Secondary.WindowMinutes = 10080
	}
}

func (a *Account) validate() error {
	if a.ID == "" {
		return errors.New("account: id is required")
	}
	if a.AccessToken == "" {
		return fmt.Errorf("account %s: access_token is required", a.ID)
	}
	if a.Kind != KindChatGPT && a.Kind != KindOpenAI {
		return fmt.Errorf("account %s: kind %q is not chatgpt or openai", a.ID, a.Kind)
	}
	for _, w := range []Window{a.Primary, a.Secondary} {
		if w.UsedPercent < 0 || w.WindowMinutes < 0 || w.ResetsIn < 0 {
			return fmt.Errorf("account %s: usage window values must not be negative", a.ID)
		}
	}
	return nil
}

// Config configures a Server. The zero value is usable: a sim with no
// accounts, which accounts can be added to later.
type Config struct {
	// Accounts served from the start.
	Accounts []Account
	// Faults installed from the start.
	Faults []Fault
	// Models lists the model slugs the models routes report; default
	// gpt-5.5-codex, gpt-5.4 and gpt-5.4-mini. The responses routes accept
	// any model.
	Models []string
	// CipherSecret is the root of every organisation's ciphertext key. Give
	// one to keep ciphertext valid across restarts; default random.
	CipherSecret []byte
	// Now is the clock for timestamps, reset times and token expiry;
	// default time.Now. Waits (delays, gaps, WebSocket age) use real time.
	Now func() time.Time
	// Logger receives the few things worth logging (a failed WebSocket
	// upgrade, a failed close); default discards. Tests pass one that writes
	// to t.Logf.
	Logger *slog.Logger
	// MaxBodyBytes bounds a request body after decompression; default 64 MiB.
	MaxBodyBytes int64
	// WSReadLimit bounds one WebSocket message; default 16 MiB (Codex's
	// first message alone is tens of KiB, well past coder/websocket's 32 KiB
	// default).
	WSReadLimit int64
	// WSCompression is how WebSocket clients offering permessage-deflate
	// are answered: "" or "pooled" (no context takeover, messages of 512 B
	// and more compressed), "takeover" (context takeover as offered: a
	// compressor per connection, messages of 128 B and more) or "off".
	WSCompression string
	// WriteTimeout bounds every write of one event or answer; default 10s.
	WriteTimeout time.Duration
	// MaxRecords bounds the request records kept; the oldest are dropped
	// first. Default 10000.
	MaxRecords int
	// MaxObjects bounds the objects kept per account and kind (files,
	// stored responses, realtime calls); past it the oldest is dropped
	// (a background response still running is cancelled). Default 1000.
	MaxObjects int
	// MaxFileBytes bounds one uploaded file (POST .../files, the upload
	// URL of /backend-api/files) and the file parts of multipart requests,
	// which are read as they stream in; past it the answer is 413.
	// Default 64 MiB.
	MaxFileBytes int64
	// Stateless makes WebSocket connections keep no response chains: every
	// previous_response_id is not found, as on upstreams that serve each
	// request on its own.
	Stateless bool
}

func (c *Config) withDefaults() {
	if len(c.Models) == 0 {
		c.Models = []string{"gpt-5.5-codex", "gpt-5.4", "gpt-5.4-mini"}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 64 << 20
	}
	if c.WSReadLimit <= 0 {
		c.WSReadLimit = 16 << 20
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxRecords <= 0 {
		c.MaxRecords = 10000
	}
	if c.MaxObjects <= 0 {
		c.MaxObjects = 1000
	}
	if c.MaxFileBytes <= 0 {
		c.MaxFileBytes = 64 << 20
	}
}

// wsCompression is Config.WSCompression as coder/websocket takes it.
func (c *Config) wsCompression() websocket.CompressionMode {
	switch c.WSCompression {
	case "takeover":
		return websocket.CompressionContextTakeover
	case "off":
		return websocket.CompressionDisabled
	}
	return websocket.CompressionNoContextTakeover
}
