-- +goose Up

-- The request log carries each request's usage and cost (issue 12): what
-- the terminal event reported, priced when the request settled (so a row
-- keeps its price when the table changes). charged is 1 when the request
-- counts toward its key's budgets: the upstream did work for it.
-- cost_nanos is billionths of a US dollar.
ALTER TABLE requests ADD COLUMN model_served TEXT NOT NULL DEFAULT '';
ALTER TABLE requests ADD COLUMN service_tier TEXT NOT NULL DEFAULT '';
ALTER TABLE requests ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN total_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN cost_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN charged INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN first_output_ms BIGINT;
ALTER TABLE requests ADD COLUMN policy TEXT NOT NULL DEFAULT '';
CREATE INDEX requests_key_started ON requests (client_key_id, started_at);

-- A key's limits (JSON list of {metric, window, max}) and model policy
-- (JSON: aliases, reasoning effort cap, priority tier).
ALTER TABLE client_keys ADD COLUMN limits TEXT NOT NULL DEFAULT '';
ALTER TABLE client_keys ADD COLUMN policy TEXT NOT NULL DEFAULT '';

-- key_reservations: requests admitted under a key with limits and not yet
-- settled. A reservation counts while its replica is alive; settling
-- deletes it in the transaction that writes the request's log row. done is
-- 1 once the response completed: tokens and cost are then its real use,
-- and it no longer counts as a request in flight.
CREATE TABLE key_reservations (
    request_id  TEXT PRIMARY KEY,
    key_id      TEXT NOT NULL,
    replica_id  TEXT NOT NULL,
    tokens      BIGINT NOT NULL,
    cost_nanos  BIGINT NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0,
    created_at  BIGINT NOT NULL
);
CREATE INDEX key_reservations_key ON key_reservations (key_id);

-- price_tables: every price table the relay used, newest current; rows
-- are never changed. entries is JSON (model, tier, USD per million input,
-- cached input and output tokens).
CREATE TABLE price_tables (
    id          TEXT PRIMARY KEY,
    source      TEXT NOT NULL,
    as_of       TEXT NOT NULL,
    entries     TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    created_by  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX price_tables_created ON price_tables (created_at);

-- +goose Down
DROP TABLE price_tables;
DROP TABLE key_reservations;
ALTER TABLE client_keys DROP COLUMN policy;
ALTER TABLE client_keys DROP COLUMN limits;
DROP INDEX requests_key_started;
ALTER TABLE requests DROP COLUMN policy;
ALTER TABLE requests DROP COLUMN first_output_ms;
ALTER TABLE requests DROP COLUMN charged;
ALTER TABLE requests DROP COLUMN cost_nanos;
ALTER TABLE requests DROP COLUMN total_tokens;
ALTER TABLE requests DROP COLUMN reasoning_tokens;
ALTER TABLE requests DROP COLUMN service_tier;
ALTER TABLE requests DROP COLUMN model_served;
