package web

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/codexrelay/codex-relay/internal/roles"
)

// Request body limits: the admin API's JSON, and the console's forms (an
// imported auth.json included).
const (
	maxAPIBody     = 1 << 20
	maxConsoleBody = 1 << 20
)

// defaultBodyReadTimeout is how long a request to the console, the admin API
// or the operations endpoints has to send its whole body (Config.BodyReadTimeout).
// Their bodies are small forms and JSON objects: a client still sending
// after this is trickling bytes to hold a connection and its goroutine.
const defaultBodyReadTimeout = 30 * time.Second

// The roles of the route table: anyone marks the console's public routes
// (the login page, the static files).
const (
	anyone   roles.Role = ""
	viewer              = roles.Viewer
	operator            = roles.Operator
	admin               = roles.Admin
)

// routes is the one place every route of the server is declared, with the
// role each route of the API and the console needs (handle).
func (s *Server) routes() {
	e := s.echo
	e.Use(middleware.Recover())
	e.Use(s.metrics.middleware)
	e.Use(s.bodyDeadline)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", s.metricsHandler())
	// The bare address is where a newcomer's browser lands: the console.
	e.Any("/", rootRedirect)

	// The admin API: every route needs a bearer token, the admin token or a
	// personal one, and the role its line names.
	api := e.Group("/api/v1", s.requireBearer, limitBody(maxAPIBody))
	s.handle(api, http.MethodGet, "/openapi.json", viewer, s.openAPI)
	s.handle(api, http.MethodGet, "/accounts", viewer, s.listAccounts)
	s.handle(api, http.MethodPost, "/accounts", admin, s.createAccount)
	s.handle(api, http.MethodGet, "/accounts/:id", viewer, s.getAccount)
	s.handle(api, http.MethodPatch, "/accounts/:id", admin, s.patchAccount)
	s.handle(api, http.MethodDelete, "/accounts/:id", admin, s.deleteAccount)
	s.handle(api, http.MethodPost, "/accounts/:id/pause", operator, s.pauseAccount)
	s.handle(api, http.MethodPost, "/accounts/:id/probe", operator, s.probeAccountAPI)
	s.handle(api, http.MethodPost, "/accounts/:id/resume", operator, s.resumeAccount)
	s.handle(api, http.MethodGet, "/keys", viewer, s.listKeys)
	s.handle(api, http.MethodPost, "/keys", operator, s.createKey)
	s.handle(api, http.MethodGet, "/keys/:id", viewer, s.getKey)
	s.handle(api, http.MethodPatch, "/keys/:id", operator, s.patchKey)
	s.handle(api, http.MethodDelete, "/keys/:id", operator, s.revokeKey)
	s.handle(api, http.MethodGet, "/bindings", viewer, s.listBindings)
	s.handle(api, http.MethodPost, "/bindings", operator, s.createPin)
	s.handle(api, http.MethodPost, "/bindings/reset", operator, s.resetBindingsAPI)
	s.handle(api, http.MethodGet, "/bindings/:id", viewer, s.getBinding)
	s.handle(api, http.MethodDelete, "/bindings/:id", operator, s.deleteBinding)
	s.handle(api, http.MethodGet, "/lanes", viewer, s.listLanes)
	s.handle(api, http.MethodGet, "/replicas", viewer, s.listReplicas)
	s.handle(api, http.MethodGet, "/diagnostics", viewer, s.listDiagnostics)
	s.handle(api, http.MethodGet, "/requests", viewer, s.listRequests)
	s.handle(api, http.MethodGet, "/usage", viewer, s.usage) // format=csv, an export: operator
	s.handle(api, http.MethodGet, "/audit", viewer, s.listAudit)
	s.handle(api, http.MethodGet, "/prices", viewer, s.getPrices)
	s.handle(api, http.MethodPut, "/prices", admin, s.putPrices)
	s.handle(api, http.MethodGet, "/prices/history", viewer, s.priceHistory)
	// People: anyone reads the list; a user's tokens are theirs to list,
	// make and revoke (and any admin's): the handlers check whose they are.
	s.handle(api, http.MethodGet, "/users", viewer, s.listUsers)
	s.handle(api, http.MethodPost, "/users", admin, s.createUser)
	s.handle(api, http.MethodPatch, "/users/:id", admin, s.patchUser)
	s.handle(api, http.MethodDelete, "/users/:id", admin, s.deleteUser)
	s.handle(api, http.MethodGet, "/users/:id/tokens", viewer, s.listUserTokens)
	s.handle(api, http.MethodPost, "/users/:id/tokens", viewer, s.createUserToken)
	s.handle(api, http.MethodDelete, "/users/:id/tokens/:token_id", viewer, s.revokeUserToken)
	api.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	// The console. Only the login page and the static files are public;
	// every other page needs a session and its line's role, and every write
	// its CSRF token. A sign-in's pages show its user code (admin), and so
	// does its live view (live checks that topic's role itself).
	// Forms are read before either check looks at them (readForm).
	pub := e.Group("/admin", consoleHeaders, limitBody(maxConsoleBody), readForm)
	s.handle(pub, http.MethodGet, "/login", anyone, s.loginPage)
	s.handle(pub, http.MethodPost, "/login", anyone, s.login)
	s.handle(pub, http.MethodGet, "/static/*", anyone, s.static())
	s.handle(pub, http.MethodGet, "/oidc/start", anyone, s.oidcStart)
	s.handle(pub, http.MethodGet, "/oidc/callback", anyone, s.oidcCallback)

	con := e.Group("/admin", consoleHeaders, limitBody(maxConsoleBody), s.requireSession, readForm, s.requireCSRF, s.noteSeen)
	s.handle(con, http.MethodGet, "", viewer, func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, "/admin/") })
	s.handle(con, http.MethodGet, "/", viewer, s.overviewPage)
	s.handle(con, http.MethodGet, "/accounts", viewer, s.accountsPage)
	s.handle(con, http.MethodPost, "/accounts", admin, s.consoleAddAccount)
	s.handle(con, http.MethodPost, "/accounts/import", admin, s.consoleImportAccount)
	s.handle(con, http.MethodPost, "/accounts/signin", admin, s.consoleStartSignIn)
	s.handle(con, http.MethodGet, "/accounts/signin/:id", admin, s.signInPage)
	s.handle(con, http.MethodPost, "/accounts/signin/:id/cancel", admin, s.consoleCancelSignIn)
	s.handle(con, http.MethodGet, "/accounts/:id", viewer, s.accountPage)
	s.handle(con, http.MethodPost, "/accounts/:id", admin, s.consoleSaveAccount)
	s.handle(con, http.MethodGet, "/accounts/:id/remove", admin, s.removeAccountPage)
	s.handle(con, http.MethodPost, "/accounts/:id/remove", admin, s.consoleRemoveAccount)
	s.handle(con, http.MethodPost, "/accounts/:id/pause", operator, s.consolePauseAccount)
	s.handle(con, http.MethodPost, "/accounts/:id/probe", operator, s.consoleProbeAccount)
	s.handle(con, http.MethodPost, "/accounts/:id/resume", operator, s.consoleResumeAccount)
	s.handle(con, http.MethodGet, "/bindings", viewer, s.bindingsPage)
	s.handle(con, http.MethodPost, "/bindings/reset", operator, s.consoleResetBindings)
	s.handle(con, http.MethodPost, "/bindings/pin", operator, s.consolePin)
	s.handle(con, http.MethodGet, "/lanes", viewer, s.lanesPage)
	s.handle(con, http.MethodGet, "/diagnostics", viewer, s.diagnosticsPage)
	s.handle(con, http.MethodGet, "/requests", viewer, s.requestsPage)
	s.handle(con, http.MethodGet, "/requests/:id", viewer, s.requestPage)
	s.handle(con, http.MethodGet, "/search", viewer, s.searchPage)
	s.handle(con, http.MethodGet, "/usage", viewer, s.usagePage)
	s.handle(con, http.MethodGet, "/usage.csv", operator, s.usageCSV)
	s.handle(con, http.MethodGet, "/keys", viewer, s.keysPage)
	s.handle(con, http.MethodPost, "/keys", operator, s.consoleCreateKey)
	s.handle(con, http.MethodGet, "/keys/:id", viewer, s.keyPage)
	s.handle(con, http.MethodPost, "/keys/:id", operator, s.consoleUpdateKey)
	s.handle(con, http.MethodPost, "/keys/:id/revoke", operator, s.consoleRevokeKey)
	s.handle(con, http.MethodGet, "/settings", viewer, s.settingsPage)
	s.handle(con, http.MethodPost, "/settings/prices", admin, s.consoleSavePrices)
	s.handle(con, http.MethodGet, "/audit", viewer, s.auditPage)
	s.handle(con, http.MethodGet, "/people", admin, s.peoplePage)
	s.handle(con, http.MethodPost, "/people", admin, s.consoleAddUser)
	s.handle(con, http.MethodPost, "/people/:id", admin, s.consoleUpdateUser)
	// One's own tokens, or (an admin) anyone's: the handlers check whose.
	s.handle(con, http.MethodGet, "/tokens", viewer, s.tokensPage)
	s.handle(con, http.MethodPost, "/tokens", viewer, s.consoleMakeToken)
	s.handle(con, http.MethodPost, "/tokens/:id/revoke", viewer, s.consoleRevokeToken)
	s.handle(con, http.MethodPost, "/sessions/signout", viewer, s.consoleSignOutEverywhere) // one's own; another's need admin
	s.handle(con, http.MethodGet, "/live/:topic", viewer, s.live)
	s.handle(con, http.MethodPost, "/logout", viewer, s.logout)
	s.webhookRoutes(api, con)
	con.RouteNotFound("/*", func(c echo.Context) error { return echo.ErrNotFound })

	if s.cfg.Client != nil {
		e.Any(backendAPIRoute, echo.WrapHandler(s.cfg.Client))
		e.Any(openAIRoute, echo.WrapHandler(s.cfg.Client))
	}
	s.metrics.setRoutes(e.Routes())
}

// handle adds a route to g needing the role need (anyone: none), checked
// after g's own middleware (the session, the CSRF token), before the handler
// runs, and records it in roleOf: a route of the API or the console added
// any other way has no role, which TestEveryRouteDeclaresItsRole refuses.
func (s *Server) handle(g *echo.Group, method, path string, need roles.Role, h echo.HandlerFunc) {
	var mw []echo.MiddlewareFunc
	if need != anyone {
		mw = append(mw, requireRole(need))
	}
	r := g.Add(method, path, h, mw...)
	s.roleOf[method+" "+r.Path] = need
}

// rootRedirect sends a GET or HEAD of exactly / to the console; any other
// method there is answered 404, as every unknown route is.
func rootRedirect(c echo.Context) error {
	if m := c.Request().Method; m != http.MethodGet && m != http.MethodHead {
		return echo.ErrNotFound
	}
	return c.Redirect(http.StatusFound, "/admin/")
}

// The client routes: Codex's, served by Config.Client, which bounds its own
// reads (its bodies are large and its streams long).
const (
	backendAPIRoute = "/backend-api/*"
	openAIRoute     = "/v1/*"
)

func isClientRoute(path string) bool { return path == backendAPIRoute || path == openAIRoute }

// limitBody refuses a body over n bytes with 413: at once when its length
// is declared, else (a chunked body) when a read passes n, which readForm
// and decodeJSON answer as 413 too. http.MaxBytesReader also tells net/http
// to close the connection after the answer instead of reading the rest.
func limitBody(n int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if r.ContentLength > n {
				return tooLarge(n)
			}
			r.Body = http.MaxBytesReader(c.Response().Writer, r.Body, n)
			return next(c)
		}
	}
}

// bodyDeadline gives every request with a body, except on the client routes,
// Config.BodyReadTimeout to send all of it: a read past the deadline fails
// (answered 408), and so do net/http's own reads to drain a body the handler
// left unread, which closes the connection.
//
// Once the body has been read to its end, net/http starts a background read
// to notice a hang-up, and clears the read deadline as it does (server.go,
// startBackgroundRead): a deadline passing under that read would fail it and
// cancel the request's context, so the deadline must not outlive the body.
// TestBodyReadDeadline holds net/http to that. Nothing is reset when the
// handler returns: an error answer is written after this middleware returns,
// and net/http drains an unread body before writing it, which must stay
// bounded. Bodiless requests get no deadline (their background read runs
// from the start, so a deadline would cancel them), nor do upgrades.
func (s *Server) bodyDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Upgrade") != "" || isClientRoute(c.Path()) {
			return next(c)
		}
		// A writer without deadlines (a test recorder) has nothing to bound.
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
		return next(c)
	}
}
