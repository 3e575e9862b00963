-- +goose Up

-- oidc_logins: console sign-ins with OpenID Connect under way (issue 35),
-- shared by every replica, as the provider's redirect back may reach any:
-- the state the browser carries (in the authorization request and in a
-- cookie of its own), the nonce the ID token must name and the PKCE
-- verifier of the code. A callback takes its row (deletes it), so a state
-- serves one callback; rows past expires_at are refused, and deleted.
CREATE TABLE oidc_logins (
    state       TEXT PRIMARY KEY,
    nonce       TEXT NOT NULL,
    verifier    TEXT NOT NULL,
    next        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX oidc_logins_expires ON oidc_logins (expires_at);

-- +goose Down
DROP TABLE oidc_logins;
