-- +goose Up

-- webhooks: where alerts go (issue 35). events is the comma-separated list
-- of event types the receiver asked for; format is json (the signed generic
-- event) or slack ({"text": ...}). secret signs the JSON body (HMAC-SHA256)
-- and is sealed at rest like the accounts' credentials, bound to the row.
CREATE TABLE webhooks (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    events      TEXT NOT NULL,
    format      TEXT NOT NULL,
    secret      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    disabled    INTEGER NOT NULL DEFAULT 0
);

-- alert_states: whether each condition (an event type for one subject:
-- an account, a key's window and threshold, the pool) stands now, as the
-- replicas agreed. A change is written with the version it was read at, so
-- of two replicas seeing the same change one writes it and records its
-- event. subject and data are the condition's last fired event's (JSON),
-- for the event that clears it. quiet marks a condition that came back within the quiet period of
-- its last event: it stands, but neither it nor its clearing is sent.
CREATE TABLE alert_states (
    type         TEXT NOT NULL,
    subject_key  TEXT NOT NULL,
    firing       INTEGER NOT NULL,
    quiet        INTEGER NOT NULL DEFAULT 0,
    subject      TEXT NOT NULL DEFAULT '{}',
    data         TEXT NOT NULL DEFAULT '{}',
    changed_at   BIGINT NOT NULL,
    fired_at     BIGINT,
    version      BIGINT NOT NULL,
    PRIMARY KEY (type, subject_key)
);

-- alert_events: every event sent (or to be sent), state fired or cleared;
-- payload is the generic JSON event, exactly the body a json webhook gets.
CREATE TABLE alert_events (
    id           TEXT PRIMARY KEY,
    type         TEXT NOT NULL,
    subject_key  TEXT NOT NULL,
    at           BIGINT NOT NULL,
    state        TEXT NOT NULL,
    payload      TEXT NOT NULL
);
CREATE INDEX alert_events_at ON alert_events (at);

-- webhook_deliveries: one event to one webhook, tried until delivered or
-- out of tries (status pending, delivered or failed). A replica claims a
-- due delivery by writing claimed_by and claimed_until in one statement,
-- so with several replicas each try is made once.
CREATE TABLE webhook_deliveries (
    id                TEXT PRIMARY KEY,
    webhook_id        TEXT NOT NULL,
    event_id          TEXT NOT NULL,
    status            TEXT NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   BIGINT NOT NULL,
    last_status_code  INTEGER NOT NULL DEFAULT 0,
    last_latency_ms   BIGINT NOT NULL DEFAULT 0,
    last_error        TEXT NOT NULL DEFAULT '',
    claimed_by        TEXT NOT NULL DEFAULT '',
    claimed_until     BIGINT NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL,
    delivered_at      BIGINT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, created_at);

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE alert_events;
DROP TABLE alert_states;
DROP TABLE webhooks;
