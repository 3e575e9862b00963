package relay

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/bridge"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// target is one account as the upstream client needs it.
type target struct {
	Account store.Account
	Cred    store.Credentials
}

// ResponsesURL is the account's Responses endpoint; sub is "" or "/compact".
func (t target) ResponsesURL(sub string) string {
	return strings.TrimRight(t.Account.BaseURL, "/") + "/responses" + sub
}

// URL joins a path below the account's base URL.
func (t target) URL(path string) string {
	return strings.TrimRight(t.Account.BaseURL, "/") + path
}

// authorize sets the account's credentials on an upstream request.
func (t target) authorize(h http.Header) {
	switch t.Account.Kind {
	case store.KindChatGPT:
		h.Set("Authorization", "Bearer "+t.Cred.AccessToken)
		if t.Account.ChatGPTAccountID != "" {
			h.Set("ChatGPT-Account-Id", t.Account.ChatGPTAccountID)
		}
	default:
		h.Set("Authorization", "Bearer "+t.Cred.APIKey)
	}
}

// droppedHeaders never go upstream: hop-by-hop headers, the client's own
// credentials and account selectors, what the transport sets itself, and
// proxy bookkeeping. Everything else (identity headers, originator,
// User-Agent, unknown x-codex-* headers) passes through.
var droppedHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Authorization": true, "Cookie": true, "Chatgpt-Account-Id": true, "Openai-Organization": true,
	"Openai-Project": true, "X-Api-Key": true, "Api-Key": true,
	"Host": true, "Content-Length": true, "Content-Encoding": true, "Accept-Encoding": true,
	"X-Codex-Relay-Hop": true,
	"Forwarded":         true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true, "X-Real-Ip": true,
	"Sec-Websocket-Key": true, "Sec-Websocket-Version": true, "Sec-Websocket-Extensions": true,
	"Sec-Websocket-Protocol": true, "Sec-Websocket-Accept": true, "Origin": true,
}

// forwardHeaders copies the client's headers that may go upstream.
func forwardHeaders(dst, src http.Header) {
	var connListed map[string]bool
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if connListed == nil {
					connListed = map[string]bool{}
				}
				connListed[headerName(f)] = true
			}
		}
	}
	for k, vs := range src {
		ck := http.CanonicalHeaderKey(k)
		n := ck
		if strings.IndexByte(k, '_') >= 0 {
			n = headerName(k)
		}
		if droppedHeaders[n] || connListed[n] {
			continue
		}
		dst[ck] = append([]string(nil), vs...)
	}
}

// headerName is the name a header is dropped by: canonical, with "_" read
// as "-", as many servers and proxies read it (nginx's
// underscores_in_headers, CGI's HTTP_ variables, the relay's own session_id):
// chatgpt_account_id is dropped as Chatgpt-Account-Id is.
func headerName(k string) string {
	return http.CanonicalHeaderKey(strings.ReplaceAll(k, "_", "-"))
}

// Upstream reaches accounts over HTTP and WebSocket, each account through
// its own proxy when it names one (store.Account.Proxy), else through the
// default egress. Safe for concurrent use.
type Upstream struct {
	// HTTP is the client of accounts that name no proxy: direct, or through
	// the environment's proxy (UpstreamOptions.EnvProxy). Static after
	// construction.
	HTTP *http.Client
	// DialTimeout bounds connecting and the WebSocket handshake.
	DialTimeout time.Duration
	// Compression is what upstream WebSockets offer; the zero value is
	// pooled (see Compression). Static after construction.
	Compression Compression

	tls      *tls.Config                           // static after construction; nil: the defaults
	envProxy func(*http.Request) (*url.URL, error) // static after construction; nil: none

	mu sync.Mutex
	// proxied holds one client per proxy URL (password included: two
	// passwords are two clients), shared by every account naming that
	// proxy, so their connection pools are too. Guarded by mu.
	proxied map[string]*http.Client
	// egress is the proxy URL ("" none) each account's lanes were last
	// dialed through, so a changed proxy retires them. Guarded by mu.
	egress map[string]string
}

// UpstreamOptions configures NewUpstreamWith.
type UpstreamOptions struct {
	// EnvProxy picks the proxy of accounts that name none, as
	// http.ProxyFromEnvironment does (HTTPS_PROXY, HTTP_PROXY, NO_PROXY;
	// loopback hosts never proxied). Nil sends them direct. An account's
	// own proxy always wins, and applies to loopback upstreams too.
	EnvProxy func(*http.Request) (*url.URL, error)
	// TLS is the client TLS configuration for upstreams and https proxies
	// (tests trust their own CA with it); nil: the system's roots.
	TLS *tls.Config
	// Compression is what upstream WebSockets offer (zero: pooled).
	Compression Compression
}

// maxProxyClients bounds the cached per-proxy clients (proxies edited many
// times leave stale entries); past it an arbitrary one is let go, its idle
// connections closed.
const maxProxyClients = 256

// NewUpstream returns an Upstream whose unproxied accounts go through the
// environment's proxy variables (http.ProxyFromEnvironment).
func NewUpstream() *Upstream {
	return NewUpstreamWith(UpstreamOptions{EnvProxy: http.ProxyFromEnvironment})
}

// NewUpstreamWith returns an Upstream with pooled connections and deadlines
// on connecting and on waiting for response headers; streams themselves are
// bounded by the caller's idle deadline, not a total timeout.
func NewUpstreamWith(o UpstreamOptions) *Upstream {
	u := &Upstream{DialTimeout: 15 * time.Second, Compression: o.Compression, tls: o.TLS, envProxy: o.EnvProxy, proxied: map[string]*http.Client{}, egress: map[string]string{}}
	u.HTTP = &http.Client{Transport: u.transport(o.EnvProxy)}
	return u
}

func (u *Upstream) transport(proxy func(*http.Request) (*url.URL, error)) *http.Transport {
	var tc *tls.Config
	if u.tls != nil {
		tc = u.tls.Clone()
	}
	return &http.Transport{
		Proxy:                 proxy,
		DialContext:           laneDialer.DialContext,
		TLSClientConfig:       tc,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		ExpectContinueTimeout: time.Second,
	}
}

// Client returns the client for everything sent for account a: the one of
// its proxy, or HTTP when it names none. An account whose proxy cannot be
// read (its sealed URL does not open) gets an error, never a direct client.
func (u *Upstream) Client(a store.Account) (*http.Client, error) {
	hc, err := u.Via(a.Proxy)
	if err != nil {
		return nil, fmt.Errorf("account %s: %w", a.ID, err)
	}
	return hc, nil
}

// Via returns the client that sends through proxy p (HTTP for no proxy),
// made on first use and shared afterwards.
func (u *Upstream) Via(p store.Proxy) (*http.Client, error) {
	pu, err := p.URL()
	if err != nil {
		return nil, err
	}
	if pu == nil {
		return u.HTTP, nil
	}
	key := pu.String()
	u.mu.Lock()
	defer u.mu.Unlock()
	if hc, ok := u.proxied[key]; ok {
		return hc, nil
	}
	if len(u.proxied) >= maxProxyClients {
		for k, hc := range u.proxied {
			hc.CloseIdleConnections() // requests under way keep their connections
			delete(u.proxied, k)
			break
		}
	}
	hc := &http.Client{Transport: u.transport(http.ProxyURL(pu))}
	u.proxied[key] = hc
	return hc, nil
}

// CloseIdleConnections closes the idle connections of every client, the
// proxies' included.
func (u *Upstream) CloseIdleConnections() {
	u.HTTP.CloseIdleConnections()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, hc := range u.proxied {
		hc.CloseIdleConnections()
	}
}

// egressChanged reports whether a's proxy differs from the one it named
// when this was last asked, and remembers the current one: lanes pooled
// across requests must not outlive the proxy they were dialed through.
func (u *Upstream) egressChanged(a store.Account) bool {
	key := "!unreadable"
	if pu, err := a.Proxy.URL(); err == nil {
		key = ""
		if pu != nil {
			key = pu.String()
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	prev, seen := u.egress[a.ID]
	u.egress[a.ID] = key
	return seen && prev != key
}

// post sends a body to url for target with the client's forwardable headers.
func (u *Upstream) post(ctx context.Context, t target, url string, clientHeader http.Header, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	forwardHeaders(req.Header, clientHeader)
	t.authorize(req.Header)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(body))
	return u.do(t, req)
}

// get fetches url for target (the models route).
func (u *Upstream) get(ctx context.Context, t target, url string, clientHeader http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	forwardHeaders(req.Header, clientHeader)
	t.authorize(req.Header)
	return u.do(t, req)
}

// do sends req through t's client.
func (u *Upstream) do(t target, req *http.Request) (*http.Response, error) {
	hc, err := u.Client(t.Account)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", t.Account.ID, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", t.Account.ID, t.Account.Proxy.Redact(err))
	}
	return resp, nil
}

// openLane dials an upstream WebSocket for t and starts a lane on it.
func (s *Server) openLane(ctx context.Context, t target, clientHeader http.Header) (*bridge.Lane, error) {
	var raw net.Conn // the connection under it, which a hang-up half-closes
	conn, resp, err := s.cfg.Upstream.dialWebSocket(ctx, t, clientHeader, &raw)
	if err != nil {
		if resp != nil && upgradeUnsupported(resp.StatusCode) {
			return nil, &upgradeRefusedError{status: resp.StatusCode}
		}
		if resp != nil && resp.StatusCode >= 400 {
			// The upstream answered the upgrade like a request: classify it so.
			de := &dialStatusError{status: resp.StatusCode}
			if resp.Body != nil {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
				if e, ok := wire.ParseErrorBody(body); ok {
					de.err = &e
				}
			}
			return nil, de
		}
		return nil, err
	}
	var h http.Header
	if resp != nil {
		h = resp.Header
	}
	l := bridge.NewLane(conn, t.Account.ID, h, s.cfg.Now())
	l.Raw = raw
	return l, nil
}

// upgradeUnsupported reports an upgrade answer that means the upstream has
// no WebSocket endpoint (it speaks HTTP only), as opposed to an answer about
// the account (401, 402, 403, 429) or a server fault (5xx).
func upgradeUnsupported(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUpgradeRequired, http.StatusNotImplemented:
		return true
	}
	return false
}

// upgradeRefusedError is an upstream that answered a WebSocket upgrade with
// a plain HTTP status (426 and the like): it serves HTTP only.
type upgradeRefusedError struct{ status int }

func (e *upgradeRefusedError) Error() string {
	return fmt.Sprintf("upstream refused the WebSocket upgrade with %d", e.status)
}

// accountMarks remembers accounts until a time each: those whose upstream
// refused WebSocket upgrades (served over plain HTTP for a while), and
// those whose upstream did not answer (passed over by new threads).
type accountMarks struct {
	mu    sync.Mutex
	until map[string]time.Time // guarded by mu
}

func (h *accountMarks) mark(account string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.until == nil {
		h.until = map[string]time.Time{}
	}
	h.until[account] = until
}

func (h *accountMarks) clear(account string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.until, account)
}

func (h *accountMarks) has(account string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := h.until[account]
	if ok && !now.Before(u) {
		delete(h.until, account)
		return false
	}
	return ok
}

// dialStatusError is an upgrade the upstream answered with an error status.
type dialStatusError struct {
	status int
	err    *wire.Error
}

func (e *dialStatusError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("upstream refused the WebSocket with %d: %s", e.status, e.err.Error())
	}
	return fmt.Sprintf("upstream refused the WebSocket with %d", e.status)
}

// MaxMessageBytes bounds one WebSocket message in either direction. Codex's
// first request is easily 40 KB; full rebuilt histories are far larger.
const MaxMessageBytes = 64 << 20

// dialWebSocket opens an upstream Responses WebSocket for target. The
// returned response carries the upgrade's headers (rate limits, turn state).
func (u *Upstream) dialWebSocket(ctx context.Context, t target, clientHeader http.Header, raw *net.Conn) (*websocket.Conn, *http.Response, error) {
	return u.dialWebSocketURL(ctx, t, t.ResponsesURL(""), clientHeader, raw, wire.OpenAIBetaWebSockets)
}

// dialWebSocketURL opens an upstream WebSocket at url (http or https, made
// ws or wss) for target, with the client's forwardable headers; beta, when
// set, is the OpenAI-Beta header sent (else the client's, if any).
func (u *Upstream) dialWebSocketURL(ctx context.Context, t target, url string, clientHeader http.Header, raw *net.Conn, beta string) (*websocket.Conn, *http.Response, error) {
	switch {
	case strings.HasPrefix(url, "https://"):
		url = "wss://" + strings.TrimPrefix(url, "https://")
	case strings.HasPrefix(url, "http://"):
		url = "ws://" + strings.TrimPrefix(url, "http://")
	}
	h := http.Header{}
	forwardHeaders(h, clientHeader)
	t.authorize(h)
	if beta != "" {
		h.Set("OpenAI-Beta", beta)
	}
	hc, err := u.laneClient(t.Account, url, raw)
	if err != nil {
		return nil, nil, fmt.Errorf("dial upstream websocket %s: %w", t.Account.ID, err)
	}
	dctx, cancel := context.WithTimeout(ctx, u.DialTimeout)
	defer cancel()
	if _, direct := hc.Transport.(*upgrader); !direct {
		dctx = httptrace.WithClientTrace(dctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { *raw = info.Conn }})
	}
	conn, resp, err := websocket.Dial(dctx, url, &websocket.DialOptions{
		HTTPClient:           hc,
		HTTPHeader:           h,
		CompressionMode:      u.Compression.websocketMode(),
		CompressionThreshold: u.Compression.threshold(),
	})
	if err != nil {
		return nil, resp, fmt.Errorf("dial upstream websocket %s: %w", t.Account.ID, t.Account.Proxy.Redact(err))
	}
	conn.SetReadLimit(MaxMessageBytes)
	return conn, resp, nil
}

// laneClient is the client a lane to wsURL is dialed with: an upgrader in
// the caller's goroutine, which sets raw, when the account names no proxy
// and the environment's proxy does not apply; else the account's pooled
// client.
func (u *Upstream) laneClient(a store.Account, wsURL string, raw *net.Conn) (*http.Client, error) {
	pu, err := a.Proxy.URL()
	if err != nil {
		return nil, err
	}
	if pu == nil && !u.envProxied(wsURL) {
		return &http.Client{Transport: &upgrader{dialer: laneDialer, tls: u.tls, raw: raw}}, nil
	}
	return u.Client(a)
}

// envProxied reports whether the environment's proxy applies to the
// WebSocket URL wsURL (one it cannot judge counts as proxied, so that
// net/http decides).
func (u *Upstream) envProxied(wsURL string) bool {
	if u.envProxy == nil {
		return false
	}
	pu, err := url.Parse(wsURL)
	if err != nil {
		return true
	}
	switch pu.Scheme {
	case "ws":
		pu.Scheme = "http"
	case "wss":
		pu.Scheme = "https"
	}
	p, err := u.envProxy(&http.Request{URL: pu})
	return err != nil || p != nil
}
