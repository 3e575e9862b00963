-- +goose Up

-- replica_departures: replicas that stopped heartbeating without a clean
-- stop (a clean stop deletes its row at once; one that lapsed has its row
-- deleted by the next replica that lists the live ones, which records it
-- here first). The alert watcher reports each as replica.lost until a
-- replica started after it registers (its place taken); rows are kept a day.
CREATE TABLE replica_departures (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    address       TEXT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    departed_at   BIGINT NOT NULL
);

-- +goose Down
DROP TABLE replica_departures;
