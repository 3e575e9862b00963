package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// RefreshClaim is one replica's exclusive hold on refreshing an account's
// tokens. ClaimRefresh takes it; CommitRefresh or ReleaseRefresh gives it
// up; a claim whose holder crashed lapses at ExpiresAt, after which another
// replica may take the account over.
type RefreshClaim struct {
	AccountID string
	// ID is unique per claim: a claim taken over after it lapsed is another
	// claim, so a late release by the first holder drops nothing.
	ID        string
	Owner     string // the replica holding it
	ClaimedAt time.Time
	ExpiresAt time.Time
}

type refreshClaimRow struct {
	AccountID string `db:"account_id"`
	ClaimID   string `db:"claim_id"`
	Owner     string `db:"owner"`
	ClaimedAt int64  `db:"claimed_at"`
	ExpiresAt int64  `db:"expires_at"`
}

func (r refreshClaimRow) claim() RefreshClaim {
	return RefreshClaim{AccountID: r.AccountID, ID: r.ClaimID, Owner: r.Owner,
		ClaimedAt: time.UnixMilli(r.ClaimedAt).UTC(), ExpiresAt: time.UnixMilli(r.ExpiresAt).UTC()}
}

// TokenState reads an account's credentials and its access-token expiry
// (zero when unknown) in one query, so a refresher sees a pair that was
// written together by CommitRefresh.
func (s *Store) TokenState(ctx context.Context, id string) (Credentials, time.Time, error) {
	var row struct {
		Credentials     string `db:"credentials"`
		AccessExpiresAt *int64 `db:"access_expires_at"`
	}
	err := s.get(ctx, &row, `SELECT credentials, access_expires_at FROM accounts WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Credentials{}, time.Time{}, fmt.Errorf("account %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Credentials{}, time.Time{}, fmt.Errorf("read token state: %w", err)
	}
	c, err := s.openCredentials(id, row.Credentials)
	if err != nil {
		return Credentials{}, time.Time{}, err
	}
	return c, fromMillis(row.AccessExpiresAt), nil
}

// CurrentCredentials is TokenState for the request path: a read is reused
// for up to a second (accountsTTL, as the listing of the accounts), and a
// write to an account (new tokens above all) drops it at once, on every
// replica (announced like every account write). Every request needs its
// account's credentials; under a burst of new threads on PostgreSQL, this
// read queued for connections with the rest. A refresh, and the answer to
// a 401, read TokenState itself.
func (s *Store) CurrentCredentials(ctx context.Context, id string) (Credentials, time.Time, error) {
	now := s.now()
	c, exp, gen, ok := s.accts.cachedCred(id, now)
	if ok {
		return c, exp, nil
	}
	read, err := shared(ctx, &s.flight, flightKey("credentials", gen, id), func(ctx context.Context) (cachedCred, error) {
		c, exp, err := s.TokenState(ctx, id)
		if err != nil {
			return cachedCred{}, err
		}
		s.accts.keepCred(id, c, exp, gen, now)
		return cachedCred{cred: c, exp: exp}, nil
	})
	return read.cred, read.exp, err
}

// ClaimRefresh takes the refresh claim of an account for owner, valid for
// ttl, with one compare-and-set: it inserts the claim, or takes over a claim
// that has lapsed. When another live claim holds the account, ok is false
// and the holder's claim is returned. Two replicas racing for one account
// never both get ok.
func (s *Store) ClaimRefresh(ctx context.Context, accountID, owner string, ttl time.Duration) (RefreshClaim, bool, error) {
	if ttl <= 0 {
		return RefreshClaim{}, false, fmt.Errorf("claim refresh: ttl must be positive, got %v", ttl)
	}
	now := s.now()
	c := RefreshClaim{AccountID: accountID, ID: NewID("rcl", now), Owner: owner,
		ClaimedAt: now.Truncate(time.Millisecond).UTC(), ExpiresAt: now.Add(ttl).Truncate(time.Millisecond).UTC()}
	res, err := s.exec(ctx, `INSERT INTO token_refresh_claims (account_id, claim_id, owner, claimed_at, expires_at)
		VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (account_id) DO UPDATE SET claim_id = excluded.claim_id, owner = excluded.owner,
			claimed_at = excluded.claimed_at, expires_at = excluded.expires_at
		WHERE token_refresh_claims.expires_at <= ?`,
		c.AccountID, c.ID, c.Owner, c.ClaimedAt.UnixMilli(), c.ExpiresAt.UnixMilli(), now.UnixMilli())
	if err != nil {
		return RefreshClaim{}, false, fmt.Errorf("claim refresh of %s: %w", accountID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return RefreshClaim{}, false, fmt.Errorf("claim refresh of %s: %w", accountID, err)
	}
	if n == 1 {
		return c, true, nil
	}
	holder, ok, err := s.RefreshClaimOf(ctx, accountID)
	if err != nil {
		return RefreshClaim{}, false, err
	}
	if !ok {
		// Released between our attempt and the read: the caller retries.
		return RefreshClaim{}, false, nil
	}
	return holder, false, nil
}

// RefreshClaimOf returns the live refresh claim of an account; ok is false
// when there is none (or only a lapsed one).
func (s *Store) RefreshClaimOf(ctx context.Context, accountID string) (RefreshClaim, bool, error) {
	var r refreshClaimRow
	err := s.get(ctx, &r, `SELECT account_id, claim_id, owner, claimed_at, expires_at
		FROM token_refresh_claims WHERE account_id = ? AND expires_at > ?`, accountID, s.now().UnixMilli())
	if errors.Is(err, sql.ErrNoRows) {
		return RefreshClaim{}, false, nil
	}
	if err != nil {
		return RefreshClaim{}, false, fmt.Errorf("read refresh claim of %s: %w", accountID, err)
	}
	return r.claim(), true, nil
}

// ReleaseRefresh gives up a claim without new credentials (the refresh was
// not needed, failed, or was rejected). A claim that was taken over after it
// lapsed belongs to someone else and is left alone.
func (s *Store) ReleaseRefresh(ctx context.Context, c RefreshClaim) error {
	_, err := s.exec(ctx, `DELETE FROM token_refresh_claims WHERE account_id = ? AND claim_id = ?`, c.AccountID, c.ID)
	if err != nil {
		return fmt.Errorf("release refresh claim of %s: %w", c.AccountID, err)
	}
	return nil
}

// CommitRefresh stores the credentials a refresh returned (the rotated
// refresh token with the new access token, sealed together, and the access
// token's expiry) in one UPDATE, and gives up the claim, in one transaction.
//
// The write does not depend on the claim still being held: the auth server
// has already spent the old refresh token, so the rotated one is the only
// one that works, and losing it would lose the account.
func (s *Store) CommitRefresh(ctx context.Context, c RefreshClaim, cred Credentials, accessExpiresAt time.Time) error {
	defer s.accountsChanged(ctx)
	sealed, err := s.sealCredentials(c.AccountID, cred)
	if err != nil {
		return fmt.Errorf("commit refresh: %w", err)
	}
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE accounts SET credentials = ?, access_expires_at = ?, updated_at = ? WHERE id = ?`),
			sealed, millis(accessExpiresAt), s.now().UnixMilli(), c.AccountID)
		if err := affectedOne(res, err, "commit refresh", c.AccountID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM token_refresh_claims WHERE account_id = ? AND claim_id = ?`), c.AccountID, c.ID); err != nil {
			return fmt.Errorf("commit refresh: release claim: %w", err)
		}
		return nil
	})
}
