-- +goose Up

-- A replica's address is where the others forward requests for threads
-- whose lane it holds ('' when it takes no forwarded requests).
ALTER TABLE replicas ADD COLUMN address TEXT NOT NULL DEFAULT '';

-- lane_leases: which replica serves a thread's HTTP requests (it holds the
-- thread's bridge lane). A lease counts while its replica's heartbeat is
-- fresh; a dead replica's leases are taken over (epoch + 1) by the next
-- replica the thread reaches. Leases not renewed for a while are deleted.
CREATE TABLE lane_leases (
    thread_key    TEXT NOT NULL,
    client_scope  TEXT NOT NULL,
    replica_id    TEXT NOT NULL,
    epoch         BIGINT NOT NULL,
    renewed_at    BIGINT NOT NULL,
    PRIMARY KEY (thread_key, client_scope)
);
CREATE INDEX lane_leases_renewed ON lane_leases (renewed_at);

-- +goose Down
DROP TABLE lane_leases;
ALTER TABLE replicas DROP COLUMN address;
