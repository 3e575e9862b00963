package web

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func TestRoleMap(t *testing.T) {
	t.Parallel()
	m, err := ParseRoleMap(" admin=relay-admins, operator=relay-ops,operator=oncall ,viewer=* ")
	require.NoError(t, err)
	for _, tc := range []struct {
		groups []string
		want   roles.Role
	}{
		{[]string{"relay-admins", "relay-ops"}, roles.Admin}, // the highest role wins
		{[]string{"oncall"}, roles.Operator},
		{[]string{"elsewhere"}, roles.Viewer}, // * is everyone's default
		{nil, roles.Viewer},
	} {
		got, ok := m.RoleFor(tc.groups)
		assert.True(t, ok)
		assert.Equal(t, tc.want, got, "%v", tc.groups)
	}
	strict, err := ParseRoleMap("admin=relay-admins")
	require.NoError(t, err)
	_, ok := strict.RoleFor([]string{"relay-ops"})
	assert.False(t, ok, "no default: refused")
	for _, bad := range []string{"", "admin", "boss=relay-admins", "admin=", " , "} {
		_, err := ParseRoleMap(bad)
		assert.Error(t, err, "%q", bad)
	}
	assert.Equal(t, []string{"a", "b"}, claimValues([]any{"a", 7, "b"}))
	assert.Equal(t, []string{"a"}, claimValues("a"))
	assert.Nil(t, claimValues(map[string]any{}))
}

// localhostAddr names a loopback listener "localhost:port", so a provider
// on it is another site than a relay on 127.0.0.1 (a browser's cookies
// then see the redirect back as cross-site, as with a real provider).
type localhostListener struct{ net.Listener }

func (l localhostListener) Addr() net.Addr { return localhostAddr{l.Listener.Addr()} }

type localhostAddr struct{ net.Addr }

func (a localhostAddr) String() string {
	_, port, _ := net.SplitHostPort(a.Addr.String())
	return "localhost:" + port
}

// startProvider runs a mockoidc OpenID provider on loopback, as localhost.
func startProvider(t *testing.T) *mockoidc.MockOIDC {
	t.Helper()
	return startProviderWith(t, false)
}

// startProviderWith is startProvider; with consent, the provider's
// authorization endpoint first answers a page of its own, whose button
// goes on, as a real provider's sign-in form does: the redirect back to the
// relay is then a navigation the provider's site started (cross-site for
// the relay's cookies), not the tail of the relay's own.
func startProviderWith(t *testing.T, consent bool) *mockoidc.MockOIDC {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc(mockoidc.AuthorizationEndpoint, func(w http.ResponseWriter, r *http.Request) {
		if consent && r.URL.Query().Get("consented") == "" {
			q := r.URL.Query()
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = fmt.Fprintf(w, `<!doctype html><title>Provider</title><form action="%s"><input type="hidden" name="consented" value="1">`, mockoidc.AuthorizationEndpoint)
			for k, vs := range q {
				for _, v := range vs {
					_, _ = fmt.Fprintf(w, `<input type="hidden" name="%s" value="%s">`, html.EscapeString(k), html.EscapeString(v))
				}
			}
			_, _ = io.WriteString(w, `<button id="consent">Sign in</button></form>`)
			return
		}
		m.Authorize(w, r)
	})
	mux.HandleFunc(mockoidc.TokenEndpoint, m.Token)
	mux.HandleFunc(mockoidc.UserinfoEndpoint, m.Userinfo)
	mux.HandleFunc(mockoidc.JWKSEndpoint, m.JWKS)
	mux.HandleFunc(mockoidc.DiscoveryEndpoint, m.Discovery)
	lh := localhostListener{ln}
	m.Server = &http.Server{Addr: lh.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = m.Server.Serve(lh) }()
	t.Cleanup(func() { _ = m.Server.Close() })
	return m
}

// ssoRelay is a console with single sign-on at provider m, served on
// loopback, and its store.
type ssoRelay struct {
	srv   *httptest.Server
	store *store.Store
}

func startSSORelay(t *testing.T, m *mockoidc.MockOIDC, client *http.Client) ssoRelay {
	t.Helper()
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv := httptest.NewUnstartedServer(nil)
	roleMap, err := ParseRoleMap("admin=relay-admins,operator=relay-ops,viewer=relay-viewers")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	w := New(Config{Store: st, AdminTokenHash: HashAdminToken(testAdminToken), Registry: reg, Gatherer: reg,
		OIDC: &OIDC{Issuer: m.Issuer(), ClientID: m.ClientID, ClientSecret: m.ClientSecret, Roles: roleMap,
			PublicURL: "http://" + srv.Listener.Addr().String(), Client: client}})
	t.Cleanup(w.Close)
	srv.Config.Handler = w
	srv.Start()
	t.Cleanup(srv.Close)
	return ssoRelay{srv: srv, store: st}
}

// browserlike is an HTTP client with cookies that follows redirects and
// records where they went.
func browserlike(t *testing.T) (*http.Client, *[]string) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	var hops []string
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		hops = append(hops, req.URL.String())
		return nil
	}}
	return c, &hops
}

// stopAtCallback is a client that follows redirects until the relay's
// callback, and returns there unfollowed: its URL holds the code and state.
func stopAtCallback(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		if req.URL.Path == oidcPath+"/callback" {
			return http.ErrUseLastResponse
		}
		return nil
	}
	return &cc
}

func get(t *testing.T, c *http.Client, u string) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp
}

// signedIn reports whether the client's console session stands: the
// overview answers rather than sending it to the login page.
func signedIn(t *testing.T, c *http.Client, base string) bool {
	t.Helper()
	nc := *c
	nc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	code, _, _ := get(t, &nc, base+"/admin/")
	return code == http.StatusOK
}

// Single sign-on against a real OpenID provider (mockoidc): a person's
// first sign-in creates them with the role their groups map to, through the
// authorization code flow with PKCE; their next, with other groups, moves
// the role; and the console's pages answer their session.
func TestOIDCSignIn(t *testing.T) {
	t.Parallel()
	m := startProvider(t)
	r := startSSORelay(t, m, nil)
	base := r.srv.URL
	ctx := context.Background()

	code, body, _ := get(t, r.srv.Client(), base+"/admin/login")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `href="/admin/oidc/start?next=%2Fadmin%2F"`, "the login page offers single sign-on")

	m.QueueUser(&mockoidc.MockUser{Subject: "u1", Email: "ada@example.com", EmailVerified: true, Groups: []string{"relay-ops"}})
	c, hops := browserlike(t)
	code, body, _ = get(t, c, base+"/admin/oidc/start?next=/admin/keys")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `url=/admin/keys`, "the landing page moves on to the page asked for")
	require.GreaterOrEqual(t, len(*hops), 2)
	auth, err := url.Parse((*hops)[0])
	require.NoError(t, err)
	assert.Equal(t, "S256", auth.Query().Get("code_challenge_method"), "PKCE")
	assert.NotEmpty(t, auth.Query().Get("nonce"))
	assert.Contains(t, auth.Query().Get("scope"), "groups", "the role claim is asked for by its scope")
	assert.True(t, signedIn(t, c, base), "the session stands")

	u, err := r.store.UserByEmail(ctx, "ada@example.com")
	require.NoError(t, err, "the person appeared on their first sign-in")
	assert.Equal(t, roles.Operator, u.Role)
	entries, _, err := r.store.AuditLog(ctx, store.AuditFilter{Action: "user.create"})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "ada@example.com", entries[0].Actor)

	m.QueueUser(&mockoidc.MockUser{Subject: "u1", Email: "ada@example.com", EmailVerified: true, Groups: []string{"relay-admins"}})
	c2, _ := browserlike(t)
	code, body, _ = get(t, c2, base+"/admin/oidc/start")
	require.Equal(t, http.StatusOK, code, body)
	u, err = r.store.UserByEmail(ctx, "ada@example.com")
	require.NoError(t, err)
	assert.Equal(t, roles.Admin, u.Role, "the claim is the role's source: it moved")
	users, err := r.store.Users(ctx)
	require.NoError(t, err)
	assert.Len(t, users, 1, "the same person, not a second one")
}

// Each sign-in that must not stand is refused, with no session and no
// person made: a state this browser did not start, a callback replayed, an
// ID token past its expiry, an ID token of another issuer, groups that map
// to no role, a disabled person.
func TestOIDCRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	toCallback := func(t *testing.T, m *mockoidc.MockOIDC, r ssoRelay, user *mockoidc.MockUser) (*http.Client, *url.URL) {
		t.Helper()
		m.QueueUser(user)
		c, _ := browserlike(t)
		resp, err := stopAtCallback(c).Get(r.srv.URL + "/admin/oidc/start")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusFound, resp.StatusCode)
		cb, err := url.Parse(resp.Header.Get("Location"))
		require.NoError(t, err)
		require.Equal(t, oidcPath+"/callback", cb.Path)
		return c, cb
	}
	ada := func() *mockoidc.MockUser {
		return &mockoidc.MockUser{Subject: "u1", Email: "ada@example.com", EmailVerified: true, Groups: []string{"relay-viewers"}}
	}
	refused := func(t *testing.T, r ssoRelay, c *http.Client, callback string, status int, says string) {
		t.Helper()
		code, body, _ := get(t, c, callback)
		assert.Equal(t, status, code, body)
		assert.Contains(t, body, says)
		assert.False(t, signedIn(t, c, r.srv.URL), "no session")
	}

	t.Run("a state this browser did not start", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		r := startSSORelay(t, m, nil)
		_, cb := toCallback(t, m, r, ada())
		other, _ := browserlike(t) // another browser, without the state's cookie
		refused(t, r, other, cb.String(), http.StatusBadRequest, "not started in this browser")
		c, cb := toCallback(t, m, r, ada())
		q := cb.Query()
		q.Set("state", "forged")
		cb.RawQuery = q.Encode()
		refused(t, r, c, cb.String(), http.StatusBadRequest, "not started in this browser")
		_, err := r.store.UserByEmail(ctx, "ada@example.com")
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
	t.Run("a callback replayed", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		r := startSSORelay(t, m, nil)
		c, cb := toCallback(t, m, r, ada())
		code, body, _ := get(t, c, cb.String())
		require.Equal(t, http.StatusOK, code, body)
		// The same code and state again, with the state's cookie put back:
		// the state was taken by the first.
		replay, _ := browserlike(t)
		relayURL, _ := url.Parse(r.srv.URL + oidcPath)
		replay.Jar.SetCookies(relayURL, []*http.Cookie{{Name: oidcStateCookie, Value: cb.Query().Get("state"), Path: oidcPath}})
		refused(t, r, replay, cb.String(), http.StatusBadRequest, "expired or was used already")
	})
	t.Run("an ID token past its expiry", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		m.FastForward(-3 * time.Hour) // the provider's clock is behind: its tokens expired long ago
		r := startSSORelay(t, m, nil)
		c, cb := toCallback(t, m, r, ada())
		refused(t, r, c, cb.String(), http.StatusUnauthorized, "did not verify")
		_, err := r.store.UserByEmail(ctx, "ada@example.com")
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
	t.Run("an ID token of another issuer", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		other := startProvider(t)
		other.ClientID = m.ClientID // the same audience: only the issuer and its keys differ
		// The provider's token endpoint answers with a token the other
		// issuer signed for the same client and nonce.
		client := &http.Client{Timeout: 30 * time.Second, Transport: swapIDToken{t: t, at: m.TokenEndpoint(), from: other}}
		r := startSSORelay(t, m, client)
		c, cb := toCallback(t, m, r, ada())
		refused(t, r, c, cb.String(), http.StatusUnauthorized, "did not verify")
	})
	t.Run("groups that map to no role", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		r := startSSORelay(t, m, nil)
		c, cb := toCallback(t, m, r, &mockoidc.MockUser{Subject: "u2", Email: "bob@example.com", EmailVerified: true, Groups: []string{"marketing"}})
		refused(t, r, c, cb.String(), http.StatusForbidden, "no role on this relay")
		_, err := r.store.UserByEmail(ctx, "bob@example.com")
		assert.ErrorIs(t, err, store.ErrNotFound, "nobody was made")
	})
	t.Run("a disabled person", func(t *testing.T) {
		t.Parallel()
		m := startProvider(t)
		r := startSSORelay(t, m, nil)
		u, err := r.store.CreateUser(ctx, store.User{Email: "ada@example.com", Role: roles.Viewer})
		require.NoError(t, err)
		yes := true
		_, _, err = r.store.UpdateUser(ctx, u.ID, store.UserChange{Disabled: &yes})
		require.NoError(t, err)
		c, cb := toCallback(t, m, r, ada())
		refused(t, r, c, cb.String(), http.StatusForbidden, "disabled")
	})
}

// swapIDToken is a transport that, on the answer of the token endpoint at,
// replaces the ID token with one the provider from issues for the same
// nonce (read from the replaced token).
type swapIDToken struct {
	t    *testing.T
	at   string
	from *mockoidc.MockOIDC
}

func (s swapIDToken) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || req.URL.String() != s.at || resp.StatusCode != http.StatusOK {
		return resp, err // oauth2 tries the client's credentials in a header first, then in the form
	}
	var tok map[string]any
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if json.Unmarshal(raw, &tok) != nil {
		s.t.Errorf("the provider's token answer is not JSON: %s", raw)
		return nil, io.ErrUnexpectedEOF
	}
	idt, _ := tok["id_token"].(string)
	tok["id_token"] = s.foreignToken(nonceOf(idt))
	b, _ := json.Marshal(tok)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// foreignToken runs the other provider's flow for nonce and returns its
// ID token.
func (s swapIDToken) foreignToken(nonce string) string {
	s.from.QueueUser(&mockoidc.MockUser{Subject: "u1", Email: "ada@example.com", EmailVerified: true, Groups: []string{"relay-viewers"}})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	q := url.Values{"client_id": {s.from.ClientID}, "response_type": {"code"}, "scope": {"openid email groups"},
		"redirect_uri": {"http://127.0.0.1/cb"}, "state": {"x"}, "nonce": {nonce}}
	resp, err := noRedirect.Get(s.from.AuthorizationEndpoint() + "?" + q.Encode())
	require.NoError(s.t, err)
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	require.NoError(s.t, err)
	form := url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
		"client_id": {s.from.ClientID}, "client_secret": {s.from.ClientSecret}, "redirect_uri": {"http://127.0.0.1/cb"}}
	resp, err = http.PostForm(s.from.TokenEndpoint(), form)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	var tok struct {
		IDToken string `json:"id_token"`
	}
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&tok))
	require.NotEmpty(s.t, tok.IDToken)
	return tok.IDToken
}

// nonceOf reads the nonce claim of a JWT without verifying it.
func nonceOf(jwt string) string {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return ""
	}
	raw, err := base64RawURL(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Nonce string `json:"nonce"`
	}
	_ = json.Unmarshal(raw, &c)
	return c.Nonce
}

func base64RawURL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

// With the admin token's console sign-in turned off, it still signs in
// while no admin person exists (or nobody could), and is refused once one
// does; a personal token signs in either way, and the admin API keeps
// taking the admin token.
func TestAdminTokenLoginOff(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	reg := prometheus.NewRegistry()
	srv := New(Config{Store: st, AdminTokenHash: HashAdminToken(testAdminToken), Registry: reg, Gatherer: reg, NoAdminTokenLogin: true})
	t.Cleanup(srv.Close)
	ctx := context.Background()

	b := newBrowser(t, srv)
	loginWith(t, b, testAdminToken)
	assert.Equal(t, http.StatusOK, b.get("/admin/keys").Code, "no admin person yet: the admin token signs in")

	u, err := st.CreateUser(ctx, store.User{Email: "root@example.com", Role: roles.Admin})
	require.NoError(t, err)
	_, token, err := st.CreateUserToken(ctx, store.UserToken{UserID: u.ID, Name: "laptop"})
	require.NoError(t, err)
	refused := newBrowser(t, srv)
	require.Equal(t, http.StatusOK, refused.get("/admin/login").Code)
	rec := refused.post("/admin/login", url.Values{"token": {testAdminToken}, "next": {"/admin/"}})
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	assert.Contains(t, body(rec), "CODEX_RELAY_ADMIN_TOKEN_LOGIN=off")
	person := newBrowser(t, srv)
	loginWith(t, person, token)
	assert.Equal(t, http.StatusOK, person.get("/admin/keys").Code)
	code, _, _ := call(t, srv, http.MethodGet, "/api/v1/keys", testAdminToken, nil)
	assert.Equal(t, http.StatusOK, code, "the admin API keeps the admin token")
}
