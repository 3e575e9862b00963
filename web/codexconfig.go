package web

import (
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"
)

// CodexConfig is the block of $CODEX_HOME/config.toml that points Codex at
// the relay at baseURL (its address, without a trailing slash): the model
// provider "relay" on its Codex route, speaking the Responses API over
// HTTP/SSE and WebSocket, with the client key read from CODEX_RELAY_KEY.
// `codex-relay keys create` prints it and the console shows it with a new
// key, from this one function, so the two cannot drift apart.
func CodexConfig(baseURL string) string {
	return `model_provider = "relay"

[model_providers.relay]
name = "relay"
base_url = "` + strings.TrimRight(baseURL, "/") + `/backend-api/codex"
wire_api = "responses"
env_key = "CODEX_RELAY_KEY"
supports_websockets = true
`
}

// relayBaseURL is the relay's address as the browser reached it: the
// scheme the console was served over and the Host the browser asked for.
// The relay has no public-URL setting: behind a proxy that rewrites Host,
// the proxy must pass the original one on, as it must for the console's
// own links.
func relayBaseURL(c echo.Context) string {
	u := url.URL{Scheme: c.Scheme(), Host: c.Request().Host}
	return u.String()
}
