-- +goose Up

-- token_refresh_claims: which replica is refreshing an account's ChatGPT
-- tokens right now. A replica takes the row with a compare-and-set (insert,
-- or take over a row whose expires_at has passed), refreshes, commits the
-- rotated tokens to accounts.credentials and deletes the row. A replica that
-- crashes mid-refresh leaves a row that lapses at expires_at (Unix ms), so
-- another replica can take over. At most one row per account.
CREATE TABLE token_refresh_claims (
    account_id  TEXT PRIMARY KEY,
    claim_id    TEXT NOT NULL,
    owner       TEXT NOT NULL,
    claimed_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);

-- +goose Down
DROP TABLE token_refresh_claims;
