-- +goose Up

-- console_sessions: the console's signed-in sessions, shared by every
-- replica (issue 36): the session cookie names a row, and a request is
-- admitted only while its row stands, so signing out (revoked_at) ends the
-- session on every replica at its next request. seen_at is the last page or
-- form, written at most once a minute, for the idle limit; expires_at is the
-- absolute end. Rows are deleted once past expires_at. user_id names who
-- signed in, for when the console has users (issue 35); NULL is the admin
-- token.
CREATE TABLE console_sessions (
    id          TEXT PRIMARY KEY,
    user_id     TEXT,
    created_at  BIGINT NOT NULL,
    seen_at     BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- +goose Down
DROP TABLE console_sessions;
