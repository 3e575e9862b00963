-- +goose Up

-- accounts: one upstream credential each. credentials is AES-GCM ciphertext
-- (base64) of a JSON object under the relay's secret key; it never leaves the
-- store in clear except to the upstream client.
CREATE TABLE accounts (
    id                       TEXT PRIMARY KEY,
    kind                     TEXT NOT NULL,
    label                    TEXT NOT NULL,
    base_url                 TEXT NOT NULL,
    organization             TEXT NOT NULL DEFAULT '',
    chatgpt_account_id       TEXT NOT NULL DEFAULT '',
    email                    TEXT NOT NULL DEFAULT '',
    plan_type                TEXT NOT NULL DEFAULT '',
    tags                     TEXT NOT NULL DEFAULT '',
    status                   TEXT NOT NULL DEFAULT 'active',
    status_reason            TEXT NOT NULL DEFAULT '',
    status_until             BIGINT,
    status_changed_at        BIGINT NOT NULL,
    priority                 INTEGER NOT NULL DEFAULT 0,
    max_concurrency          INTEGER NOT NULL DEFAULT 0,
    credentials              TEXT NOT NULL,
    access_expires_at        BIGINT,
    primary_used_percent     DOUBLE PRECISION,
    primary_window_minutes   INTEGER,
    primary_reset_at         BIGINT,
    secondary_used_percent   DOUBLE PRECISION,
    secondary_window_minutes INTEGER,
    secondary_reset_at       BIGINT,
    usage_updated_at         BIGINT,
    created_at               BIGINT NOT NULL,
    updated_at               BIGINT NOT NULL
);
CREATE INDEX accounts_status ON accounts (status);
CREATE INDEX accounts_chatgpt_account_id ON accounts (chatgpt_account_id);

-- client_keys: relay keys Codex sends as Authorization: Bearer crk_...; only
-- the SHA-256 of the key is kept. scope_accounts is a comma-separated list of
-- account ids (empty: all), scope_tag an account tag (empty: none).
CREATE TABLE client_keys (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    prefix          TEXT NOT NULL,
    key_hash        TEXT NOT NULL UNIQUE,
    scope_accounts  TEXT NOT NULL DEFAULT '',
    scope_tag       TEXT NOT NULL DEFAULT '',
    models          TEXT NOT NULL DEFAULT '',
    expires_at      BIGINT,
    created_at      BIGINT NOT NULL,
    last_used_at    BIGINT,
    revoked_at      BIGINT,
    request_count   BIGINT NOT NULL DEFAULT 0
);

-- bindings: "this key is served by that account". key is an opaque derived
-- key (thread key, process-session key) or, for kind raw_session, the raw
-- session id an operator pinned. abandoned_scope, when set, records that the
-- row was retired for that interpretation (seed 003) and by what source.
CREATE TABLE bindings (
    id               TEXT PRIMARY KEY,
    binding_key      TEXT NOT NULL,
    kind             TEXT NOT NULL,
    strength         TEXT NOT NULL,
    account_id       TEXT NOT NULL,
    client_scope     TEXT NOT NULL DEFAULT '',
    session_id       TEXT NOT NULL DEFAULT '',
    thread_id        TEXT NOT NULL DEFAULT '',
    source           TEXT NOT NULL DEFAULT '',
    created_at       BIGINT NOT NULL,
    last_seen_at     BIGINT NOT NULL,
    expires_at       BIGINT,
    abandoned_scope  TEXT,
    UNIQUE (kind, binding_key, client_scope)
);
CREATE INDEX bindings_account ON bindings (account_id);
CREATE INDEX bindings_session ON bindings (session_id);
CREATE INDEX bindings_thread ON bindings (thread_id);

-- requests: one row per client request (the request log).
CREATE TABLE requests (
    id             TEXT PRIMARY KEY,
    client_key_id  TEXT NOT NULL DEFAULT '',
    thread_key     TEXT NOT NULL DEFAULT '',
    session_id     TEXT NOT NULL DEFAULT '',
    thread_id      TEXT NOT NULL DEFAULT '',
    account_id     TEXT NOT NULL DEFAULT '',
    transport      TEXT NOT NULL,
    path           TEXT NOT NULL,
    model          TEXT NOT NULL DEFAULT '',
    status         INTEGER NOT NULL,
    error_code     TEXT NOT NULL DEFAULT '',
    recovery       TEXT NOT NULL DEFAULT '',
    started_at     BIGINT NOT NULL,
    first_event_ms BIGINT,
    duration_ms    BIGINT NOT NULL,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    cached_tokens  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX requests_started ON requests (started_at);
CREATE INDEX requests_thread ON requests (thread_id);
CREATE INDEX requests_account ON requests (account_id);

-- attempts: one diagnostic record per try of a request on an account,
-- classified once when it ended.
CREATE TABLE attempts (
    id              TEXT PRIMARY KEY,
    request_id      TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    thread_key      TEXT NOT NULL DEFAULT '',
    session_id      TEXT NOT NULL DEFAULT '',
    thread_id       TEXT NOT NULL DEFAULT '',
    account_id      TEXT NOT NULL DEFAULT '',
    from_account_id TEXT NOT NULL DEFAULT '',
    transport       TEXT NOT NULL DEFAULT '',
    class           TEXT NOT NULL,
    recovery        TEXT NOT NULL DEFAULT '',
    action          TEXT NOT NULL DEFAULT '',
    status          INTEGER NOT NULL DEFAULT 0,
    error_code      TEXT NOT NULL DEFAULT '',
    detail          TEXT NOT NULL DEFAULT '',
    started_at      BIGINT NOT NULL,
    ended_at        BIGINT NOT NULL,
    first_event_ms  BIGINT
);
CREATE INDEX attempts_request ON attempts (request_id);
CREATE INDEX attempts_class ON attempts (class, started_at);
CREATE INDEX attempts_started ON attempts (started_at);

-- settings: small key/value configuration kept by the relay itself (for
-- example the hash of a generated admin token).
CREATE TABLE settings (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE settings;
DROP TABLE attempts;
DROP TABLE requests;
DROP TABLE bindings;
DROP TABLE client_keys;
DROP TABLE accounts;
