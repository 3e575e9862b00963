-- +goose Up

-- users: the people who run the relay (issue 35). email is unique whatever
-- its case: email_key is its lower-case form, written by the application
-- (SQLite's LOWER knows ASCII only, PostgreSQL's all of Unicode, so neither
-- is trusted to agree with the other). role is viewer, operator or admin.
-- A user is created by an admin or, later, on a first single sign-on;
-- last_seen_at is written at most once a minute; a disabled user
-- (disabled_at) is refused at their next request, tokens and sessions alike.
CREATE TABLE users (
    id            TEXT PRIMARY KEY,
    email         TEXT NOT NULL,
    email_key     TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    role          TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    last_seen_at  BIGINT,
    disabled_at   BIGINT
);
CREATE UNIQUE INDEX users_email_key ON users (email_key);

-- user_tokens: personal API tokens. Only the SHA-256 of the token is kept
-- (token_hash); prefix is its first characters, for display. role, when
-- not empty, narrows the user's own: the token acts with the lower of the
-- two. last_used_at is written at most once a minute. Rows go with their
-- user.
CREATE TABLE user_tokens (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    role          TEXT NOT NULL DEFAULT '',
    prefix        TEXT NOT NULL,
    token_hash    TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT,
    last_used_at  BIGINT,
    revoked_at    BIGINT
);
CREATE UNIQUE INDEX user_tokens_hash ON user_tokens (token_hash);
CREATE INDEX user_tokens_user ON user_tokens (user_id);

-- A console session signed in with a personal token names it, so the
-- session acts with the token's role and ends with it.
ALTER TABLE console_sessions ADD COLUMN token_id TEXT;

-- The audit log names the person behind a token: actor is token:<name>,
-- user_email the token's owner ('' for the admin token).
ALTER TABLE audit_log ADD COLUMN user_email TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE audit_log DROP COLUMN user_email;
ALTER TABLE console_sessions DROP COLUMN token_id;
DROP TABLE user_tokens;
DROP TABLE users;
