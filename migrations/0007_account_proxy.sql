-- +goose Up

-- An account's outbound proxy (issue 13): proxy_url is the URL sealed like
-- the credentials (AES-GCM under the secret key, bound to the row), since
-- it may carry a password; proxy_display is the same URL with the password
-- replaced by ***, for listings. Both '' when the account names no proxy.
ALTER TABLE accounts ADD COLUMN proxy_url TEXT NOT NULL DEFAULT '';
ALTER TABLE accounts ADD COLUMN proxy_display TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE accounts DROP COLUMN proxy_display;
ALTER TABLE accounts DROP COLUMN proxy_url;
