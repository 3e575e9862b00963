-- +goose Up

-- replicas: every relay process serving on this database. Each writes its
-- row at start and on every heartbeat, with a snapshot of its live lanes
-- (JSON) for the other replicas' operators; a row whose heartbeat stopped
-- is a dead replica, deleted by the next one to look.
CREATE TABLE replicas (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    lanes         TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX replicas_heartbeat ON replicas (heartbeat_at);

-- +goose Down
DROP TABLE replicas;
