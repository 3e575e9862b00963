package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Kind is an account's upstream flavour.
type Kind string

const (
	KindChatGPT    Kind = "chatgpt"    // ChatGPT subscription: access/refresh tokens, ChatGPT-Account-Id
	KindOpenAI     Kind = "openai"     // OpenAI API key
	KindCompatible Kind = "compatible" // any Responses-compatible provider with an API key
)

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return k == KindChatGPT || k == KindOpenAI || k == KindCompatible }

// Status is whether an account may serve, and if not, why.
type Status string

const (
	StatusActive         Status = "active"
	StatusRateLimited    Status = "rate_limited"    // until the primary window resets
	StatusQuotaExceeded  Status = "quota_exceeded"  // until the secondary window resets
	StatusPaused         Status = "paused"          // by an operator
	StatusReauthRequired Status = "reauth_required" // refresh rejected; needs a new login
	StatusDisabled       Status = "disabled"
)

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	switch s {
	case StatusActive, StatusRateLimited, StatusQuotaExceeded, StatusPaused, StatusReauthRequired, StatusDisabled:
		return true
	}
	return false
}

// Window is one usage window of an account, as the upstream last reported it.
type Window struct {
	UsedPercent   float64
	WindowMinutes int
	ResetAt       time.Time
	// Known is false when the upstream never reported this window.
	Known bool
}

// Account is one upstream credential and its state. Credentials are not part
// of it: they are read with Store.Credentials, only by the upstream client.
type Account struct {
	ID               string
	Kind             Kind
	Label            string
	BaseURL          string
	Organization     string
	ChatGPTAccountID string
	Email            string
	PlanType         string
	Tags             []string
	Status           Status
	StatusReason     string
	StatusUntil      time.Time // zero: no set end
	StatusChangedAt  time.Time
	Priority         int
	MaxConcurrency   int // 0: no cap
	// Proxy is the outbound proxy everything for this account goes
	// through (zero: none, the relay's default egress). It prints without
	// its password; its URL is sealed at rest.
	Proxy           Proxy
	AccessExpiresAt time.Time
	Primary         Window
	Secondary       Window
	UsageUpdatedAt  time.Time
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// Credentials are an account's secrets, encrypted at rest.
type Credentials struct {
	APIKey       string `json:"api_key,omitempty"`
	AccessToken  string `json:"access_token,omitempty"`
	RefreshToken string `json:"refresh_token,omitempty"`
	IDToken      string `json:"id_token,omitempty"`
}

type accountRow struct {
	ID                     string   `db:"id"`
	Kind                   string   `db:"kind"`
	Label                  string   `db:"label"`
	BaseURL                string   `db:"base_url"`
	Organization           string   `db:"organization"`
	ChatGPTAccountID       string   `db:"chatgpt_account_id"`
	Email                  string   `db:"email"`
	PlanType               string   `db:"plan_type"`
	Tags                   string   `db:"tags"`
	Status                 string   `db:"status"`
	StatusReason           string   `db:"status_reason"`
	StatusUntil            *int64   `db:"status_until"`
	StatusChangedAt        int64    `db:"status_changed_at"`
	Priority               int      `db:"priority"`
	MaxConcurrency         int      `db:"max_concurrency"`
	Credentials            string   `db:"credentials"`
	ProxyURL               string   `db:"proxy_url"`
	ProxyDisplay           string   `db:"proxy_display"`
	AccessExpiresAt        *int64   `db:"access_expires_at"`
	PrimaryUsedPercent     *float64 `db:"primary_used_percent"`
	PrimaryWindowMinutes   *int64   `db:"primary_window_minutes"`
	PrimaryResetAt         *int64   `db:"primary_reset_at"`
	SecondaryUsedPercent   *float64 `db:"secondary_used_percent"`
	SecondaryWindowMinutes *int64   `db:"secondary_window_minutes"`
	SecondaryResetAt       *int64   `db:"secondary_reset_at"`
	UsageUpdatedAt         *int64   `db:"usage_updated_at"`
	CreatedAt              int64    `db:"created_at"`
	UpdatedAt              int64    `db:"updated_at"`
}

func window(used *float64, minutes, reset *int64) Window {
	w := Window{ResetAt: fromMillis(reset)}
	if used != nil {
		w.UsedPercent, w.Known = *used, true
	}
	if minutes != nil {
		w.WindowMinutes = int(*minutes)
	}
	return w
}

// account converts a row; its sealed proxy URL is opened with s's key.
func (s *Store) account(r accountRow) Account {
	return Account{
		ID: r.ID, Kind: Kind(r.Kind), Label: r.Label, BaseURL: r.BaseURL,
		Organization: r.Organization, ChatGPTAccountID: r.ChatGPTAccountID,
		Email: r.Email, PlanType: r.PlanType, Tags: splitList(r.Tags),
		Status: Status(r.Status), StatusReason: r.StatusReason,
		StatusUntil: fromMillis(r.StatusUntil), StatusChangedAt: time.UnixMilli(r.StatusChangedAt).UTC(),
		Priority: r.Priority, MaxConcurrency: r.MaxConcurrency,
		Proxy:           s.openProxy(r.ID, r.ProxyURL, r.ProxyDisplay),
		AccessExpiresAt: fromMillis(r.AccessExpiresAt),
		Primary:         window(r.PrimaryUsedPercent, r.PrimaryWindowMinutes, r.PrimaryResetAt),
		Secondary:       window(r.SecondaryUsedPercent, r.SecondaryWindowMinutes, r.SecondaryResetAt),
		UsageUpdatedAt:  fromMillis(r.UsageUpdatedAt),
		CreatedAt:       time.UnixMilli(r.CreatedAt).UTC(), UpdatedAt: time.UnixMilli(r.UpdatedAt).UTC(),
	}
}

const accountColumns = `id, kind, label, base_url, organization, chatgpt_account_id, email, plan_type, tags,
	status, status_reason, status_until, status_changed_at, priority, max_concurrency, credentials,
	proxy_url, proxy_display, access_expires_at, primary_used_percent, primary_window_minutes, primary_reset_at,
	secondary_used_percent, secondary_window_minutes, secondary_reset_at, usage_updated_at,
	created_at, updated_at`

// credentialsAAD binds an account's sealed credentials to its row.
func credentialsAAD(id string) []byte { return []byte("account:" + id) }

func (s *Store) sealCredentials(id string, c Credentials) (string, error) {
	if s.sealer == nil {
		return "", ErrNoSecretKey
	}
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return s.sealer.Seal(b, credentialsAAD(id))
}

// openCredentials decrypts a sealed credentials column of account id.
func (s *Store) openCredentials(id, sealed string) (Credentials, error) {
	if s.sealer == nil {
		return Credentials{}, ErrNoSecretKey
	}
	pt, err := s.sealer.Open(sealed, credentialsAAD(id))
	if err != nil {
		return Credentials{}, fmt.Errorf("account %s: %w", id, err)
	}
	var c Credentials
	if err := json.Unmarshal(pt, &c); err != nil {
		return Credentials{}, fmt.Errorf("account %s: credentials: %w", id, err)
	}
	return c, nil
}

// CreateAccount stores a new account with its credentials and its proxy
// URL, both encrypted, in one statement: the account never serves before its
// proxy is in place. The id, status (active unless set), and timestamps are
// filled in.
func (s *Store) CreateAccount(ctx context.Context, a Account, c Credentials) (Account, error) {
	defer s.accountsChanged(ctx)
	now := s.now()
	if a.ID == "" {
		a.ID = NewID("acc", now)
	}
	if a.Status == "" {
		a.Status = StatusActive
	}
	if !a.Kind.Valid() {
		return Account{}, fmt.Errorf("create account: unknown kind %q", a.Kind)
	}
	sealed, err := s.sealCredentials(a.ID, c)
	if err != nil {
		return Account{}, fmt.Errorf("create account: %w", err)
	}
	proxySealed, proxyDisplay, err := s.sealProxy(a.ID, a.Proxy)
	if err != nil {
		return Account{}, fmt.Errorf("create account: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO accounts (id, kind, label, base_url, organization,
		chatgpt_account_id, email, plan_type, tags, status, status_reason, status_until, status_changed_at,
		priority, max_concurrency, credentials, proxy_url, proxy_display, access_expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, string(a.Kind), a.Label, a.BaseURL, a.Organization, a.ChatGPTAccountID, a.Email, a.PlanType,
		joinList(a.Tags), string(a.Status), a.StatusReason, millis(a.StatusUntil), now.UnixMilli(),
		a.Priority, a.MaxConcurrency, sealed, proxySealed, proxyDisplay, millis(a.AccessExpiresAt), now.UnixMilli(), now.UnixMilli())
	if err != nil {
		if isUniqueViolation(err) {
			return Account{}, fmt.Errorf("create account %s: %w", a.ID, ErrConflict)
		}
		return Account{}, fmt.Errorf("create account: %w", err)
	}
	return s.Account(ctx, a.ID)
}

// Account reads one account by id.
func (s *Store) Account(ctx context.Context, id string) (Account, error) {
	var r accountRow
	err := s.get(ctx, &r, `SELECT `+accountColumns+` FROM accounts WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Account{}, fmt.Errorf("account %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Account{}, fmt.Errorf("read account: %w", err)
	}
	return s.account(r), nil
}

// Accounts lists every account, highest priority first, then by creation.
// A listing is reused for up to a second (see accountsTTL) unless a write
// through this Store changed an account.
func (s *Store) Accounts(ctx context.Context) ([]Account, error) {
	at := s.now()
	list, gen, ok := s.accts.cached(at)
	if ok {
		return list, nil
	}
	list, err := shared(ctx, &s.flight, flightKey("accounts", gen, ""), func(ctx context.Context) ([]Account, error) {
		var rows []accountRow
		if err := s.selectAll(ctx, &rows, `SELECT `+accountColumns+` FROM accounts ORDER BY priority DESC, created_at, id`); err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		out := make([]Account, len(rows))
		for i, r := range rows {
			out[i] = s.account(r)
		}
		s.accts.keep(out, gen, at)
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	// Each caller its own copy: the read may be shared.
	return slices.Clone(list), nil
}

// AccountPatch changes some of an account's settings; nil fields are kept.
type AccountPatch struct {
	Label            *string
	BaseURL          *string
	Organization     *string
	ChatGPTAccountID *string
	Email            *string
	PlanType         *string
	Tags             *[]string
	Priority         *int
	MaxConcurrency   *int
	// Proxy replaces the account's proxy; a zero Proxy removes it.
	Proxy *Proxy
	// Credentials replaces the account's credentials (sealed, as
	// SetCredentials seals them; the access token's expiry is kept).
	Credentials *Credentials
}

// UpdateAccount applies p to the account, in one statement (all of it or
// nothing), and returns it as stored.
func (s *Store) UpdateAccount(ctx context.Context, id string, p AccountPatch) (Account, error) {
	defer s.accountsChanged(ctx)
	var sets []string
	var args []any
	add := func(col string, v any) { sets = append(sets, col+" = ?"); args = append(args, v) }
	if p.Label != nil {
		add("label", *p.Label)
	}
	if p.BaseURL != nil {
		add("base_url", *p.BaseURL)
	}
	if p.Organization != nil {
		add("organization", *p.Organization)
	}
	if p.ChatGPTAccountID != nil {
		add("chatgpt_account_id", *p.ChatGPTAccountID)
	}
	if p.Email != nil {
		add("email", *p.Email)
	}
	if p.PlanType != nil {
		add("plan_type", *p.PlanType)
	}
	if p.Tags != nil {
		add("tags", joinList(*p.Tags))
	}
	if p.Priority != nil {
		add("priority", *p.Priority)
	}
	if p.MaxConcurrency != nil {
		add("max_concurrency", *p.MaxConcurrency)
	}
	if p.Proxy != nil {
		sealed, display, err := s.sealProxy(id, *p.Proxy)
		if err != nil {
			return Account{}, fmt.Errorf("update account: %w", err)
		}
		add("proxy_url", sealed)
		add("proxy_display", display)
	}
	if p.Credentials != nil {
		sealed, err := s.sealCredentials(id, *p.Credentials)
		if err != nil {
			return Account{}, fmt.Errorf("update account: %w", err)
		}
		add("credentials", sealed)
	}
	add("updated_at", s.now().UnixMilli())
	args = append(args, id)
	res, err := s.execUnprepared(ctx, `UPDATE accounts SET `+strings.Join(sets, ", ")+` WHERE id = ?`, args...)
	if err := affectedOne(res, err, "update account", id); err != nil {
		return Account{}, err
	}
	return s.Account(ctx, id)
}

// SetAccountStatus records a new status with its reason and end time (zero
// for none). It returns the account as stored.
func (s *Store) SetAccountStatus(ctx context.Context, id string, st Status, reason string, until time.Time) (Account, error) {
	defer s.accountsChanged(ctx)
	if !st.Valid() {
		return Account{}, fmt.Errorf("set status: unknown status %q", st)
	}
	now := s.now().UnixMilli()
	res, err := s.exec(ctx, `UPDATE accounts SET status = ?, status_reason = ?, status_until = ?,
		status_changed_at = ?, updated_at = ? WHERE id = ?`, string(st), reason, millis(until), now, now, id)
	if err := affectedOne(res, err, "set account status", id); err != nil {
		return Account{}, err
	}
	return s.Account(ctx, id)
}

// DeleteAccount removes an account and every binding that points at it.
func (s *Store) DeleteAccount(ctx context.Context, id string) error {
	defer s.accountsChanged(ctx)
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM accounts WHERE id = ?`), id)
		if err := affectedOne(res, err, "delete account", id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM bindings WHERE account_id = ?`), id); err != nil {
			return fmt.Errorf("delete account bindings: %w", err)
		}
		return nil
	})
}

// Credentials decrypts an account's secrets.
func (s *Store) Credentials(ctx context.Context, id string) (Credentials, error) {
	var sealed string
	err := s.get(ctx, &sealed, `SELECT credentials FROM accounts WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Credentials{}, fmt.Errorf("account %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Credentials{}, fmt.Errorf("read credentials: %w", err)
	}
	return s.openCredentials(id, sealed)
}

// SetCredentials replaces an account's secrets and access-token expiry.
func (s *Store) SetCredentials(ctx context.Context, id string, c Credentials, accessExpiresAt time.Time) error {
	defer s.accountsChanged(ctx)
	sealed, err := s.sealCredentials(id, c)
	if err != nil {
		return fmt.Errorf("set credentials: %w", err)
	}
	res, err := s.exec(ctx, `UPDATE accounts SET credentials = ?, access_expires_at = ?, updated_at = ? WHERE id = ?`,
		sealed, millis(accessExpiresAt), s.now().UnixMilli(), id)
	return affectedOne(res, err, "set credentials", id)
}

func affectedOne(res sql.Result, err error, op, id string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s %s: %w", op, id, ErrNotFound)
	}
	return nil
}

// splitList parses a comma-separated column; joinList writes one. Entries are
// trimmed and blanks dropped.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func joinList(l []string) string {
	clean := make([]string, 0, len(l))
	for _, p := range l {
		if p = strings.TrimSpace(p); p != "" {
			clean = append(clean, p)
		}
	}
	return strings.Join(clean, ",")
}
