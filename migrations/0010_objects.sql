-- +goose Up

-- objects: what clients created upstream through the relay (issue 34): a
-- file, a stored or background response. An object lives on the account
-- that created it, so every later request naming it goes there. id is the
-- upstream's id; client_scope is the scope of the key that created it (a
-- key outside it never learns the object exists: 404). expires_at is when
-- the upstream forgets it (NULL: until deleted); rows past it are deleted.
-- settled_at marks a background response whose usage was charged (once,
-- by the first answer that reported it complete).
CREATE TABLE objects (
    client_scope  TEXT NOT NULL,
    id            TEXT NOT NULL,
    kind          TEXT NOT NULL,
    account_id    TEXT NOT NULL,
    organization  TEXT NOT NULL DEFAULT '',
    client_key_id TEXT NOT NULL DEFAULT '',
    thread_key    TEXT NOT NULL DEFAULT '',
    request_id    TEXT NOT NULL DEFAULT '',
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT,
    settled_at    BIGINT,
    PRIMARY KEY (client_scope, id)
);
CREATE INDEX objects_thread ON objects (thread_key);
CREATE INDEX objects_account ON objects (account_id);
CREATE INDEX objects_expires ON objects (expires_at);

-- The request log names the route a row was (responses, images.generations,
-- files.create...) and the object it named or created.
ALTER TABLE requests ADD COLUMN route TEXT NOT NULL DEFAULT '';
ALTER TABLE requests ADD COLUMN object_id TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE requests DROP COLUMN object_id;
ALTER TABLE requests DROP COLUMN route;
DROP TABLE objects;
