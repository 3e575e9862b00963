package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// DefaultUsageURL is the ChatGPT backend's usage endpoint.
const DefaultUsageURL = "https://chatgpt.com/backend-api/wham/usage"

// UsageURL is the usage endpoint that goes with an account's base URL: the
// base's /backend-api root followed by /wham/usage (DefaultUsageURL for the
// default base, the sim's own for an account on the sim). A base without a
// /backend-api root has no usage endpoint the operator configured, so it
// returns "": the relay calls no host an operator did not name, and such an
// account learns its usage from response headers and events alone.
func UsageURL(baseURL string) string {
	if i := strings.Index(baseURL, "/backend-api"); i >= 0 {
		return baseURL[:i] + "/backend-api/wham/usage"
	}
	return ""
}

// TokenSource hands out fresh credentials; *Refresher is one.
type TokenSource interface {
	Token(ctx context.Context, a store.Account) (store.Credentials, error)
	AfterUnauthorized(ctx context.Context, a store.Account, staleAccessToken string) (store.Credentials, error)
}

// UsagePollerConfig configures a UsagePoller. Store and Tokens are required.
type UsagePollerConfig struct {
	Store  *store.Store
	Tokens TokenSource
	// HTTPClient sends usage requests; default a client on
	// http.DefaultTransport. Each request is bounded by Timeout.
	HTTPClient *http.Client
	// ClientFor, when set, picks the client of an account's usage requests
	// instead of HTTPClient: the one of its proxy (relay.Upstream.Client).
	// An error fails the poll of that account.
	ClientFor func(store.Account) (*http.Client, error)
	// UsageURL, when set, is polled for every account instead of the URL
	// derived from its base URL (see UsageURL).
	UsageURL string
	// Now is the clock deciding resets and recovery; default time.Now.
	Now func() time.Time
	// Logger receives status changes; default discards.
	Logger *slog.Logger
	// Timeout bounds one usage request; default 20s.
	Timeout time.Duration
	// Concurrency bounds the accounts polled at once by PollAll; default 4.
	Concurrency int
}

// UsagePoller keeps ChatGPT accounts' usage windows current and brings
// rate_limited and quota_exceeded accounts back to active once their reset
// time has passed and a usage fetch confirms it. It is safe for concurrent
// use.
type UsagePoller struct {
	cfg UsagePollerConfig // static after NewUsagePoller
}

// NewUsagePoller returns a poller. It panics without Store or Tokens.
func NewUsagePoller(cfg UsagePollerConfig) *UsagePoller {
	if cfg.Store == nil || cfg.Tokens == nil {
		panic("oauth: UsagePollerConfig.Store and Tokens are required")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 20 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	return &UsagePoller{cfg: cfg}
}

// Usage is what the usage endpoint reported for one account.
type Usage struct {
	Primary      store.Window // the 5-hour window
	Secondary    store.Window // the weekly window
	PlanType     string
	LimitReached bool
}

// UsageError is a usage fetch that got an HTTP answer other than 200.
type UsageError struct {
	Status int
	Code   string
}

func (e *UsageError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("usage endpoint: HTTP %d %s", e.Status, e.Code)
	}
	return fmt.Sprintf("usage endpoint: HTTP %d", e.Status)
}

// Recover decides whether an account limited until a reset may be probed
// and, if the probe confirms, returned to active: a rate_limited or
// quota_exceeded account whose StatusUntil has passed (or that has none).
// It returns the status to move to and true then, else the account's
// status and false. It is pure: the poller's probe does the confirming.
func Recover(a store.Account, now time.Time) (store.Status, bool) {
	switch a.Status {
	case store.StatusRateLimited, store.StatusQuotaExceeded:
		if a.StatusUntil.IsZero() || !now.Before(a.StatusUntil) {
			return store.StatusActive, true
		}
	}
	return a.Status, false
}

// statusChange is what a usage report means for an account's status.
type statusChange struct {
	status store.Status
	reason string
	until  time.Time
}

// exhausted reports whether a window is used up until a reset still to come.
func exhausted(w store.Window, now time.Time) bool {
	return w.Known && w.UsedPercent >= 100 && w.ResetAt.After(now)
}

// decideStatus maps a usage report onto an account's status: an exhausted
// window limits an active account until its reset (the weekly window wins,
// as it resets later); a limited account whose reset passed comes back
// when no window is exhausted any more and the upstream does not say the
// limit is reached, or stays limited until the new reset. Paused, disabled and reauth_required accounts are left alone, and
// so is a limited account before its reset.
func decideStatus(a store.Account, u Usage, now time.Time) (statusChange, bool) {
	limited := func() (statusChange, bool) {
		switch {
		case exhausted(u.Secondary, now):
			return statusChange{store.StatusQuotaExceeded, "usage: weekly window used up", u.Secondary.ResetAt}, true
		case exhausted(u.Primary, now):
			return statusChange{store.StatusRateLimited, "usage: 5-hour window used up", u.Primary.ResetAt}, true
		}
		return statusChange{}, false
	}
	switch a.Status {
	case store.StatusActive:
		if c, ok := limited(); ok {
			return c, true
		}
	case store.StatusRateLimited, store.StatusQuotaExceeded:
		if _, due := Recover(a, now); !due {
			return statusChange{}, false
		}
		if c, ok := limited(); ok {
			if c.status == a.Status && c.until.Equal(a.StatusUntil) {
				return statusChange{}, false
			}
			return c, true
		}
		if u.LimitReached {
			// Still limited, but with no reset to wait for: probe again at
			// the next poll.
			return statusChange{}, false
		}
		return statusChange{store.StatusActive, "usage probe: limit reset", time.Time{}}, true
	}
	return statusChange{}, false
}

// PollOnce fetches the account's usage with a fresh token (refreshing once
// on a 401), stores its windows, and applies what they mean for its status
// (see decideStatus): this is the probe that returns a limited account to
// active after its reset. A failed fetch changes nothing. It returns the
// account as stored afterwards. Accounts other than chatgpt are returned
// unchanged, and so are accounts without a usage endpoint (see Polls).
func (p *UsagePoller) PollOnce(ctx context.Context, a store.Account) (store.Account, error) {
	if !p.Polls(a) {
		return a, nil
	}
	u, err := p.Fetch(ctx, a)
	if err != nil {
		return a, fmt.Errorf("poll usage of %s: %w", a.ID, err)
	}
	if err := p.cfg.Store.UpdateUsage(ctx, a.ID, u.Primary, u.Secondary); err != nil {
		return a, err
	}
	// Decide on the status as stored now, not as the caller saw it.
	cur, err := p.cfg.Store.Account(ctx, a.ID)
	if err != nil {
		return a, err
	}
	if c, ok := decideStatus(cur, u, p.cfg.Now()); ok {
		updated, err := p.cfg.Store.SetAccountStatus(ctx, a.ID, c.status, c.reason, c.until)
		if err != nil {
			return cur, err
		}
		p.cfg.Logger.Info("account status from usage", "account", a.ID, "from", cur.Status, "to", c.status, "reason", c.reason, "until", c.until)
		return updated, nil
	}
	return cur, nil
}

// Polls reports whether the poller reads this account's usage: a chatgpt
// account with a usage endpoint (the configured one, else its base URL's).
func (p *UsagePoller) Polls(a store.Account) bool {
	return a.Kind == store.KindChatGPT && p.usageURL(a) != ""
}

func (p *UsagePoller) usageURL(a store.Account) string {
	return firstNonBlank(p.cfg.UsageURL, UsageURL(a.BaseURL))
}

// Fetch reads the account's usage: GET {usage URL} with its access token
// and ChatGPT-Account-Id. After a 401 it asks Tokens for a refreshed token
// once and tries again.
func (p *UsagePoller) Fetch(ctx context.Context, a store.Account) (Usage, error) {
	cred, err := p.cfg.Tokens.Token(ctx, a)
	if err != nil {
		return Usage{}, err
	}
	u, err := p.fetch(ctx, a, cred.AccessToken)
	var ue *UsageError
	if errors.As(err, &ue) && ue.Status == http.StatusUnauthorized {
		if cred, err = p.cfg.Tokens.AfterUnauthorized(ctx, a, cred.AccessToken); err != nil {
			return Usage{}, err
		}
		u, err = p.fetch(ctx, a, cred.AccessToken)
	}
	return u, err
}

func (p *UsagePoller) fetch(ctx context.Context, a store.Account, accessToken string) (Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	u := p.usageURL(a)
	if u == "" {
		return Usage{}, fmt.Errorf("usage endpoint: account %s has none (base URL without /backend-api)", a.ID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Usage{}, err
	}
	req.Header.Set("Authorization", "Bearer "+accessToken)
	if a.ChatGPTAccountID != "" {
		req.Header.Set("ChatGPT-Account-Id", a.ChatGPTAccountID)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "codex-relay")
	hc := p.cfg.HTTPClient
	if p.cfg.ClientFor != nil {
		if hc, err = p.cfg.ClientFor(a); err != nil {
			return Usage{}, fmt.Errorf("usage endpoint: %w", err)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Usage{}, fmt.Errorf("usage endpoint: %w", a.Proxy.Redact(redactURLError(err)))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Usage{}, fmt.Errorf("usage endpoint: read: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		code, _ := tokenErrorDetail(raw)
		return Usage{}, &UsageError{Status: resp.StatusCode, Code: code}
	}
	return parseUsage(raw, p.cfg.Now())
}

// parseUsage reads the usage answer:
//
//	{"plan_type":"plus","rate_limit":{"allowed":true,"limit_reached":false,
//	  "primary_window":{"used_percent":12,"limit_window_seconds":18000,"reset_after_seconds":600,"reset_at":1700000000},
//	  "secondary_window":{...}}}
func parseUsage(raw []byte, now time.Time) (Usage, error) {
	type window struct {
		UsedPercent        *float64 `json:"used_percent"`
		LimitWindowSeconds int64    `json:"limit_window_seconds"`
		ResetAfterSeconds  int64    `json:"reset_after_seconds"`
		ResetAt            int64    `json:"reset_at"`
	}
	var body struct {
		PlanType  string `json:"plan_type"`
		RateLimit *struct {
			LimitReached bool    `json:"limit_reached"`
			Primary      *window `json:"primary_window"`
			Secondary    *window `json:"secondary_window"`
		} `json:"rate_limit"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return Usage{}, errors.New("usage endpoint: the answer is not the usage JSON")
	}
	conv := func(w *window) store.Window {
		if w == nil || w.UsedPercent == nil {
			return store.Window{}
		}
		sw := store.Window{UsedPercent: *w.UsedPercent, WindowMinutes: int(w.LimitWindowSeconds / 60), Known: true}
		switch {
		case w.ResetAt > 0:
			sw.ResetAt = time.Unix(w.ResetAt, 0).UTC()
		case w.ResetAfterSeconds > 0:
			sw.ResetAt = now.Add(time.Duration(w.ResetAfterSeconds) * time.Second).UTC()
		}
		return sw
	}
	u := Usage{PlanType: body.PlanType}
	if rl := body.RateLimit; rl != nil {
		u.LimitReached = rl.LimitReached
		u.Primary, u.Secondary = conv(rl.Primary), conv(rl.Secondary)
	}
	return u, nil
}

// PollAll polls every chatgpt account that is active, rate_limited or
// quota_exceeded, a few at once. It returns the errors of the accounts that
// failed, joined, and the earliest reset still to come among limited
// accounts (zero if none), when the next probe is due.
func (p *UsagePoller) PollAll(ctx context.Context) (time.Time, error) {
	accounts, err := p.cfg.Store.Accounts(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next time.Time
	)
	sem := make(chan struct{}, p.cfg.Concurrency)
	for _, a := range accounts {
		if !p.Polls(a) {
			continue
		}
		switch a.Status {
		case store.StatusActive, store.StatusRateLimited, store.StatusQuotaExceeded:
		default:
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return next, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			got, err := p.PollOnce(ctx, a)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if _, due := Recover(got, p.cfg.Now()); !due && !got.StatusUntil.IsZero() &&
				(got.Status == store.StatusRateLimited || got.Status == store.StatusQuotaExceeded) {
				if next.IsZero() || got.StatusUntil.Before(next) {
					next = got.StatusUntil
				}
			}
		})
	}
	wg.Wait()
	return next, errors.Join(errs...)
}

// Run polls every account now and then every interval, and also right after
// the earliest reset of a limited account, so an account comes back at its
// reset time without waiting for the next round. It returns when ctx ends.
func (p *UsagePoller) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	for {
		next, err := p.PollAll(ctx)
		if err != nil && ctx.Err() == nil {
			p.cfg.Logger.Debug("usage poll", "err", err)
		}
		wait := every
		if !next.IsZero() {
			// A little past the reset, so the probe finds it passed.
			if d := next.Sub(p.cfg.Now()) + 500*time.Millisecond; d < wait {
				wait = max(d, 10*time.Millisecond)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
