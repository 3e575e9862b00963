package main

import (
	"net/url"
	"strings"
)

// envPrefix starts every variable codex-relay reads.
const envPrefix = "CODEX_RELAY_"

// configEnv names the configuration file when no -config flag does.
const configEnv = envPrefix + "CONFIG"

// fileSuffix turns a variable into the one naming a file that holds its value
// (CODEX_RELAY_SECRET_KEY_FILE=/run/secrets/secret_key), as container
// platforms mount secrets.
const fileSuffix = "_FILE"

// secrecy says whether a setting's value is a credential, which a
// configuration file other users can read must not hold.
type secrecy int

const (
	notSecret secrecy = iota
	secret
	secretWithPassword // a URL: secret when it carries a password
)

// setting is one CODEX_RELAY_* variable the commands read. Its key in the
// configuration file is its name without the prefix, in lower case
// (CODEX_RELAY_DATABASE_URL is database_url).
type setting struct {
	env     string
	secrecy secrecy
}

// key is the setting's key in a configuration file.
func (s setting) key() string { return strings.ToLower(strings.TrimPrefix(s.env, envPrefix)) }

// holdsSecret reports whether value, given for s, is a credential.
func (s setting) holdsSecret(value string) bool {
	switch s.secrecy {
	case secret:
		return true
	case secretWithPassword:
		return urlHasPassword(value)
	}
	return false
}

// settings lists every variable any command reads (a test checks that none is
// missing). Each one may be given in the environment, as a file named by its
// _FILE variable, or as a key of the configuration file.
var settings = []setting{
	// serve, and every command that opens the database
	{envPrefix + "ADDR", notSecret},
	{envPrefix + "DATABASE_URL", secretWithPassword},
	{envPrefix + "ADMIN_TOKEN", secret},
	{envPrefix + "SECRET_KEY", secret},
	{envPrefix + "TOKEN_URL", notSecret},
	{envPrefix + "AUTH_URL", notSecret}, // serve's console sign-in, and accounts login
	{envPrefix + "FALLBACK_MODEL", notSecret},
	{envPrefix + "RETENTION", notSecret},
	{envPrefix + "TIMEZONE", notSecret},
	{envPrefix + "ADVERTISE_URL", notSecret},
	{envPrefix + "ENV_PROXY", notSecret},
	{envPrefix + "LANE_MAX_AGE", notSecret},
	{envPrefix + "STREAM_IDLE_TIMEOUT", notSecret},
	{envPrefix + "WS_COMPRESSION", notSecret},
	{envPrefix + "UPSTREAM_WS_COMPRESSION", notSecret},
	{envPrefix + "WS_COMPRESSION_THRESHOLD", notSecret},
	{envPrefix + "LOG_FORMAT", notSecret},
	{envPrefix + "LOG_LEVEL", notSecret},
	{envPrefix + "OIDC_ISSUER", notSecret},
	{envPrefix + "OIDC_CLIENT_ID", notSecret},
	{envPrefix + "OIDC_CLIENT_SECRET", secret},
	{envPrefix + "OIDC_ROLE_CLAIM", notSecret},
	{envPrefix + "OIDC_ROLES", notSecret},
	{envPrefix + "PUBLIC_URL", notSecret},
	{envPrefix + "ADMIN_TOKEN_LOGIN", notSecret},
	// the admin commands (accounts, keys, bindings, usage)
	{envPrefix + "URL", notSecret},
	{envPrefix + "API_TOKEN", secret}, // a person's token, before the admin token
	{envPrefix + "ACCOUNT_PROXY_URL", secretWithPassword},
	{envPrefix + "ACCOUNT_API_KEY", secret},
	{envPrefix + "ACCOUNT_ACCESS_TOKEN", secret},
	{envPrefix + "ACCOUNT_REFRESH_TOKEN", secret},
	{envPrefix + "ACCOUNT_ID_TOKEN", secret},
	// sim and demo
	{envPrefix + "SIM_ADDR", notSecret},
	{envPrefix + "SIM_ACCOUNTS", notSecret},
	{envPrefix + "SIM_CIPHER_SECRET", secret},
	{envPrefix + "SIM_MODELS", notSecret},
}

// settingByKey finds a setting by its configuration file key.
func settingByKey(key string) (setting, bool) {
	for _, s := range settings {
		if s.key() == key {
			return s, true
		}
	}
	return setting{}, false
}

// urlHasPassword reports whether a URL carries a password, in its user
// information or as a password or sslpassword query parameter (libpq's).
func urlHasPassword(raw string) bool {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		// Unparsable: assume the worst rather than let a password through.
		return strings.Contains(raw, "@") || strings.Contains(strings.ToLower(raw), "password")
	}
	if _, ok := u.User.Password(); ok {
		return true
	}
	q := u.Query()
	return q.Has("password") || q.Has("sslpassword")
}
