package oauth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// ErrRefreshBusy means another replica held the account's refresh claim for
// longer than a caller may wait. The account is left as it is.
var ErrRefreshBusy = errors.New("token refresh: another replica is still refreshing this account")

// ErrRefreshTimeout means a caller gave up waiting for a refresh in flight;
// the refresh itself goes on and commits its result.
var ErrRefreshTimeout = errors.New("token refresh: timed out waiting for the refresh in flight")

// ErrClosed is returned by a Refresher after Close.
var ErrClosed = errors.New("token refresh: refresher closed")

// RefresherConfig configures a Refresher. Only Store is required.
type RefresherConfig struct {
	// Store holds the accounts, their sealed credentials and the refresh
	// claims. Required.
	Store *store.Store
	// HTTPClient sends token requests; default a client on
	// http.DefaultTransport. Each request is bounded by RefreshTimeout.
	HTTPClient *http.Client
	// ClientFor, when set, picks the client of an account's token requests
	// instead of HTTPClient: the one of its proxy (relay.Upstream.Client).
	// An error fails the refresh and leaves the account as it is.
	ClientFor func(store.Account) (*http.Client, error)
	// TokenURL is the OAuth token endpoint; default DefaultTokenURL. Tests
	// point it at the sim's TokenURL().
	TokenURL string
	// ClientID is sent with each refresh; default CodexClientID.
	ClientID string
	// Now is the clock deciding expiry; default time.Now. Waits (for a
	// refresh in flight, for another replica's claim) use real time.
	Now func() time.Time
	// Replica names this process in refresh claims; default
	// hostname-pid-random. Two Refreshers sharing a database must have
	// different names.
	Replica string
	// Logger receives refreshes, rejections and failures, never a token;
	// default discards.
	Logger *slog.Logger
	// Margin: an access token expiring within it is refreshed before use;
	// default 5 minutes (capped at half the token's lifetime when its iat
	// claim is known, so a short-lived token is not refreshed on every use).
	Margin time.Duration
	// RefreshTimeout bounds one token request; default 30s.
	RefreshTimeout time.Duration
	// ClaimTTL is how long a refresh claim holds before it lapses (a crashed
	// replica's claim lapses then); default 2 minutes, and always more than
	// RefreshTimeout so a live holder never loses its claim mid-request.
	ClaimTTL time.Duration
	// WaitTimeout bounds how long a caller waits for a refresh in flight,
	// in this process or on another replica; default 45s.
	WaitTimeout time.Duration
	// PollInterval is how often a replica that lost the claim re-reads the
	// account while it waits; default 200ms.
	PollInterval time.Duration
}

func (c *RefresherConfig) withDefaults() {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.TokenURL == "" {
		c.TokenURL = DefaultTokenURL
	}
	if c.ClientID == "" {
		c.ClientID = CodexClientID
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Replica == "" {
		c.Replica = defaultReplica()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Margin <= 0 {
		c.Margin = 5 * time.Minute
	}
	if c.RefreshTimeout <= 0 {
		c.RefreshTimeout = 30 * time.Second
	}
	if c.ClaimTTL <= 0 {
		c.ClaimTTL = 2 * time.Minute
	}
	if c.ClaimTTL < c.RefreshTimeout+10*time.Second {
		c.ClaimTTL = c.RefreshTimeout + 10*time.Second
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = 45 * time.Second
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 200 * time.Millisecond
	}
}

func defaultReplica() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Refresher hands out ChatGPT credentials whose access token is fresh, and
// refreshes them when needed: single-flight per account in this process, and
// across replicas through a database claim. It is safe for concurrent use.
//
// A refresh runs in a goroutine the Refresher owns, detached from the
// caller's context: a client hanging up must not abandon a refresh half-way,
// after the auth server spent the old refresh token but before the new one
// is stored. Close waits for those goroutines.
type Refresher struct {
	cfg RefresherConfig // static after NewRefresher
	log *slog.Logger    // static after NewRefresher
	wg  sync.WaitGroup  // counts flight goroutines

	mu      sync.Mutex // guards the fields below
	flights map[string]*flight
	closed  bool
}

// flight is one refresh of one account in this process; callers of that
// account wait on done, then read the result.
type flight struct {
	done chan struct{}
	// Written by the flight's goroutine before done is closed.
	cred      store.Credentials
	exp       time.Time
	refreshed bool
	err       error
}

// NewRefresher returns a Refresher. It panics without a store.
func NewRefresher(cfg RefresherConfig) *Refresher {
	if cfg.Store == nil {
		panic("oauth: RefresherConfig.Store is required")
	}
	cfg.withDefaults()
	return &Refresher{cfg: cfg, log: cfg.Logger.With("replica", cfg.Replica), flights: map[string]*flight{}}
}

// Close waits for the refreshes in flight to commit or fail (each is
// bounded by WaitTimeout and RefreshTimeout); later calls fail with
// ErrClosed.
func (r *Refresher) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}

// need decides, from the stored credentials and access-token expiry,
// whether a refresh is (still) needed.
type need func(cred store.Credentials, exp time.Time) bool

// Token returns the account's credentials with an access token that does
// not expire within the margin, refreshing first when it does. Accounts
// that are not chatgpt accounts get their credentials unchanged.
//
// A rejected refresh marks the account reauth_required and returns a
// *RejectedError; any other failure (transport, 5xx, a replica holding the
// claim too long) returns an error and leaves the account as it is.
func (r *Refresher) Token(ctx context.Context, a store.Account) (store.Credentials, error) {
	cred, exp, err := r.cfg.Store.CurrentCredentials(ctx, a.ID)
	if err != nil || a.Kind != store.KindChatGPT {
		return cred, err
	}
	if !r.expiring(cred, exp) {
		return cred, nil
	}
	return r.refresh(ctx, a, r.expiring, "expiring")
}

// AfterUnauthorized forces one refresh after the upstream answered 401 to
// staleAccessToken, unless the stored access token already differs from it
// (someone refreshed meanwhile): then it returns the stored credentials.
// Concurrent callers for one account share one refresh. Errors as for Token.
func (r *Refresher) AfterUnauthorized(ctx context.Context, a store.Account, staleAccessToken string) (store.Credentials, error) {
	if a.Kind != store.KindChatGPT {
		return r.cfg.Store.Credentials(ctx, a.ID)
	}
	cred, _, err := r.cfg.Store.TokenState(ctx, a.ID)
	if err != nil {
		return store.Credentials{}, err
	}
	if cred.AccessToken != staleAccessToken {
		return cred, nil
	}
	isStale := func(c store.Credentials, _ time.Time) bool { return c.AccessToken == staleAccessToken }
	return r.refresh(ctx, a, isStale, "unauthorized")
}

// expiring reports whether an access token expires within the margin. A
// token of unknown expiry is used until the upstream refuses it.
func (r *Refresher) expiring(cred store.Credentials, storedExp time.Time) bool {
	if cred.AccessToken == "" {
		return true
	}
	exp := accessExpiry(cred.AccessToken, storedExp)
	if exp.IsZero() {
		return false
	}
	margin := r.cfg.Margin
	if c, err := ParseClaims(cred.AccessToken); err == nil && !c.IssuedAt.IsZero() && exp.After(c.IssuedAt) {
		margin = min(margin, exp.Sub(c.IssuedAt)/2)
	}
	return !r.cfg.Now().Add(margin).Before(exp)
}

// refresh joins the account's flight or starts one, and waits for it. A
// caller that joined someone else's flight which did not do what it needs
// (a flight that found the token fresh, while this caller was refused with
// it) starts its own.
func (r *Refresher) refresh(ctx context.Context, a store.Account, needed need, why string) (store.Credentials, error) {
	wait := time.NewTimer(r.cfg.WaitTimeout + r.cfg.RefreshTimeout)
	defer wait.Stop()
	for range 3 {
		f, leader, err := r.join(ctx, a, needed, why)
		if err != nil {
			return store.Credentials{}, err
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return store.Credentials{}, ctx.Err()
		case <-wait.C:
			return store.Credentials{}, ErrRefreshTimeout
		}
		if f.err != nil {
			return store.Credentials{}, f.err
		}
		if leader || f.refreshed || !needed(f.cred, f.exp) {
			return f.cred, nil
		}
	}
	return store.Credentials{}, fmt.Errorf("token refresh of %s: no refresh satisfied the caller", a.ID)
}

// join returns the account's flight, starting it (leader true) when there
// is none.
func (r *Refresher) join(ctx context.Context, a store.Account, needed need, why string) (*flight, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false, ErrClosed
	}
	if f, ok := r.flights[a.ID]; ok {
		return f, false, nil
	}
	f := &flight{done: make(chan struct{})}
	r.flights[a.ID] = f
	r.wg.Add(1)
	// Detached from the caller's cancellation (values kept), bounded by the
	// longest a refresh may take: waiting for a claim, then one request and
	// its commit.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.WaitTimeout+r.cfg.RefreshTimeout+30*time.Second)
	go func() {
		defer r.wg.Done()
		defer cancel()
		f.cred, f.exp, f.refreshed, f.err = r.refreshShared(fctx, a, needed, why)
		r.mu.Lock()
		delete(r.flights, a.ID)
		r.mu.Unlock()
		close(f.done)
	}()
	return f, true, nil
}

// refreshShared takes the account's database claim and refreshes, or, while
// another replica holds the claim, waits and re-reads what it commits.
func (r *Refresher) refreshShared(ctx context.Context, a store.Account, needed need, why string) (store.Credentials, time.Time, bool, error) {
	log := r.log.With("account", a.ID)
	deadline := time.Now().Add(r.cfg.WaitTimeout)
	waiting := false
	for {
		cred, exp, err := r.cfg.Store.TokenState(ctx, a.ID)
		if err != nil {
			return store.Credentials{}, time.Time{}, false, err
		}
		if !needed(cred, exp) {
			if waiting {
				log.Debug("token refreshed by another replica")
			}
			return cred, exp, false, nil
		}
		claim, ok, err := r.cfg.Store.ClaimRefresh(ctx, a.ID, r.cfg.Replica, r.cfg.ClaimTTL)
		if err != nil {
			return store.Credentials{}, time.Time{}, false, err
		}
		if ok {
			return r.refreshClaimed(ctx, log, a, claim, needed, why)
		}
		if !waiting {
			log.Debug("waiting for another replica's token refresh", "holder", claim.Owner)
			waiting = true
		}
		if time.Now().After(deadline) {
			return store.Credentials{}, time.Time{}, false, fmt.Errorf("account %s: %w (held by %s)", a.ID, ErrRefreshBusy, claim.Owner)
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return store.Credentials{}, time.Time{}, false, ctx.Err()
		case <-t.C:
		}
	}
}

// refreshClaimed refreshes under a held claim: it re-reads the credentials
// (another replica may have committed between our read and our claim),
// redeems the refresh token, and commits the rotated credentials before
// returning them.
func (r *Refresher) refreshClaimed(ctx context.Context, log *slog.Logger, a store.Account, claim store.RefreshClaim, needed need, why string) (store.Credentials, time.Time, bool, error) {
	committed := false
	defer func() {
		if committed {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.cfg.Store.ReleaseRefresh(rctx, claim); err != nil {
			log.Warn("release refresh claim", "err", err)
		}
	}()

	cred, exp, err := r.cfg.Store.TokenState(ctx, a.ID)
	if err != nil {
		return store.Credentials{}, time.Time{}, false, err
	}
	if !needed(cred, exp) {
		return cred, exp, false, nil
	}
	if cred.RefreshToken == "" {
		rej := &RejectedError{Status: http.StatusUnauthorized, Code: "no_refresh_token", Message: "no refresh token is stored; sign in again"}
		if why == "unauthorized" || (!exp.IsZero() && !r.cfg.Now().Before(exp)) {
			r.markReauth(ctx, log, a, rej)
			return store.Credentials{}, time.Time{}, false, fmt.Errorf("account %s: %w", a.ID, rej)
		}
		return cred, exp, false, nil // still valid for a little while
	}

	hc, err := r.client(a)
	if err != nil {
		log.Warn("token refresh: no client for the account; account left as it is", "err", err)
		return store.Credentials{}, time.Time{}, false, &TokenError{Err: err}
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RefreshTimeout)
	g, err := refreshGrant(rctx, hc, r.cfg.TokenURL, r.cfg.ClientID, cred.RefreshToken)
	cancel()
	err = a.Proxy.Redact(err)
	if err != nil {
		var rej *RejectedError
		if errors.As(err, &rej) {
			rej.Message = scrub(rej.Message, cred.RefreshToken, cred.AccessToken, cred.IDToken)
			// An operator may have stored a new login meanwhile: that one
			// was not rejected.
			if cur, _, rerr := r.cfg.Store.TokenState(ctx, a.ID); rerr == nil && cur.RefreshToken != cred.RefreshToken {
				return cur, time.Time{}, true, nil
			}
			r.markReauth(ctx, log, a, rej)
			return store.Credentials{}, time.Time{}, false, fmt.Errorf("account %s: %w", a.ID, rej)
		}
		if why == "expiring" && !exp.IsZero() && r.cfg.Now().Before(exp) {
			// Refreshed early, and the auth server is out of reach: the
			// token still works until it expires; the next use tries again.
			log.Warn("token refresh failed; using the current token until it expires", "err", err, "expires_in", exp.Sub(r.cfg.Now()).Round(time.Second))
			return cred, exp, false, nil
		}
		log.Warn("token refresh failed; account left as it is", "why", why, "err", err, "took", time.Since(start))
		return store.Credentials{}, time.Time{}, false, fmt.Errorf("account %s: %w", a.ID, err)
	}

	next := store.Credentials{
		APIKey:       cred.APIKey,
		AccessToken:  firstNonBlank(g.AccessToken, cred.AccessToken),
		RefreshToken: firstNonBlank(g.RefreshToken, cred.RefreshToken),
		IDToken:      firstNonBlank(g.IDToken, cred.IDToken),
	}
	var nextExp time.Time
	if g.ExpiresIn > 0 {
		nextExp = r.cfg.Now().Add(g.ExpiresIn)
	}
	nextExp = accessExpiry(next.AccessToken, nextExp)
	if err := r.commit(ctx, claim, next, nextExp); err != nil {
		log.Error("token refreshed but the rotated refresh token could not be stored; the account will need a new login", "err", err)
		return store.Credentials{}, time.Time{}, false, fmt.Errorf("account %s: store refreshed tokens: %w", a.ID, err)
	}
	committed = true
	if g.AccessToken == "" {
		log.Warn("token endpoint answered without an access token", "why", why)
		return store.Credentials{}, time.Time{}, false, &TokenError{Status: http.StatusOK, Err: fmt.Errorf("account %s: no access token in the answer", a.ID)}
	}
	r.updateIdentity(ctx, log, a, next.IDToken)
	log.Info("token refreshed", "why", why, "access_expires_at", nextExp, "rotated", g.RefreshToken != "", "took", time.Since(start))
	return next, nextExp, true, nil
}

// client is the client of a's token requests (see ClientFor).
func (r *Refresher) client(a store.Account) (*http.Client, error) {
	if r.cfg.ClientFor != nil {
		return r.cfg.ClientFor(a)
	}
	return r.cfg.HTTPClient, nil
}

// commit stores the rotated credentials, retrying a few times: they are the
// only ones the auth server accepts now. It is not cut short by the
// caller's context.
func (r *Refresher) commit(ctx context.Context, claim store.RefreshClaim, cred store.Credentials, exp time.Time) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var err error
	for i := range 4 {
		if err = r.cfg.Store.CommitRefresh(ctx, claim, cred, exp); err == nil || errors.Is(err, store.ErrNotFound) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(100<<i) * time.Millisecond):
		}
	}
	return err
}

// markReauth records a rejected refresh on the account.
func (r *Refresher) markReauth(ctx context.Context, log *slog.Logger, a store.Account, rej *RejectedError) {
	log.Warn("token refresh rejected; account needs a new login", "status", rej.Status, "code", rej.Code)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := r.cfg.Store.SetAccountStatus(sctx, a.ID, store.StatusReauthRequired, "token refresh rejected: "+rej.Reason(), time.Time{}); err != nil {
		log.Warn("mark account reauth_required", "err", err)
	}
}

// updateIdentity keeps the account's plan and email in step with a new id
// token; best effort.
func (r *Refresher) updateIdentity(ctx context.Context, log *slog.Logger, a store.Account, idToken string) {
	c, err := ParseClaims(idToken)
	if err != nil {
		return
	}
	var p store.AccountPatch
	if c.PlanType != "" && c.PlanType != a.PlanType {
		p.PlanType = &c.PlanType
	}
	if c.Email != "" && c.Email != a.Email {
		p.Email = &c.Email
	}
	if p.PlanType == nil && p.Email == nil {
		return
	}
	if _, err := r.cfg.Store.UpdateAccount(ctx, a.ID, p); err != nil {
		log.Warn("update account from id token", "err", err)
	}
}
