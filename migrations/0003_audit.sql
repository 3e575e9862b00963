-- +goose Up

-- audit_log: one row per admin action (console or API): who did it (actor
-- "admin" for the console, "api" for a bearer-token script) from which
-- address, what (action), to what (target), and a short human detail.
CREATE TABLE audit_log (
    id       TEXT PRIMARY KEY,
    at       BIGINT NOT NULL,
    actor    TEXT NOT NULL,
    address  TEXT NOT NULL DEFAULT '',
    action   TEXT NOT NULL,
    target   TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_action ON audit_log (action, at);

-- +goose Down
DROP TABLE audit_log;
