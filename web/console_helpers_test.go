package web

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// fakeRelay stands in for the relay: settable lanes and in-flight counts,
// and a record of what it was told to forget.
type fakeRelay struct {
	mu        sync.Mutex
	lanes     []relay.LaneInfo
	inflight  map[string]int
	forgotten [][]store.Binding
	draining  bool
}

func (f *fakeRelay) Lanes() []relay.LaneInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]relay.LaneInfo(nil), f.lanes...)
}

func (f *fakeRelay) InFlight(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inflight[id]
}

func (f *fakeRelay) AccountLanes(id string) (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.lanes {
		if l.AccountID == id {
			n++
		}
	}
	return n, 64
}

func (f *fakeRelay) Forget(reset []store.Binding) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, reset)
}

// forgottenIDs lists the ids of every binding the relay was told to forget.
func (f *fakeRelay) ReplicaID() string { return "rep_test" }

func (f *fakeRelay) Draining() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.draining }

func (f *fakeRelay) ReplicaLiveSince() time.Time { return time.Now().Add(-15 * time.Second) }

func (f *fakeRelay) forgottenIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, r := range f.forgotten {
		for _, b := range r {
			ids = append(ids, b.ID)
		}
	}
	return ids
}

// testClock is a settable clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// consoleServer is a server with a fake relay, for console tests.
func consoleServer(t *testing.T, s *store.Store) (*Server, *fakeRelay) {
	t.Helper()
	fr := &fakeRelay{inflight: map[string]int{}}
	return New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: fr,
		SessionKey: []byte("test session key"), LiveInterval: 20 * time.Millisecond}), fr
}

// browser is a cookie-keeping client of a handler, as a browser on one
// address would be.
type browser struct {
	t       *testing.T
	h       http.Handler
	addr    string
	cookies map[string]*http.Cookie
	csrf    string // the last CSRF token seen on a page
}

func newBrowser(t *testing.T, h http.Handler) *browser {
	return &browser{t: t, h: h, addr: "192.0.2.10:40000", cookies: map[string]*http.Cookie{}}
}

var csrfInput = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// do sends one request and keeps the cookies and CSRF token it gets back.
func (b *browser) do(req *http.Request) *httptest.ResponseRecorder {
	b.t.Helper()
	req.RemoteAddr = b.addr
	for _, c := range b.cookies {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	b.h.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.MaxAge < 0 {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c
		}
	}
	if m := csrfInput.FindStringSubmatch(rec.Body.String()); m != nil {
		b.csrf = m[1]
	}
	return rec
}

func (b *browser) get(path string) *httptest.ResponseRecorder {
	b.t.Helper()
	return b.do(httptest.NewRequest(http.MethodGet, path, nil))
}

// post sends a form; the session's CSRF token is added unless the form has
// a _csrf entry already (an empty one sends none).
func (b *browser) post(path string, form url.Values) *httptest.ResponseRecorder {
	b.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if _, ok := form["_csrf"]; !ok {
		form.Set("_csrf", b.csrf)
	} else if form.Get("_csrf") == "" {
		form.Del("_csrf")
	}
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

// login logs in with the admin token and checks it worked.
func (b *browser) login() {
	b.t.Helper()
	rec := b.get("/admin/login")
	require.Equal(b.t, http.StatusOK, rec.Code)
	rec = b.post("/admin/login", url.Values{"token": {testAdminToken}, "next": {"/admin/"}})
	require.Equal(b.t, http.StatusSeeOther, rec.Code, rec.Body.String())
	require.Contains(b.t, b.cookies, sessionCookie)
	rec = b.get("/admin/")
	require.Equal(b.t, http.StatusOK, rec.Code, rec.Body.String())
}

func body(rec *httptest.ResponseRecorder) string { return rec.Body.String() }

func strconvItoa(i int) string { return strconv.Itoa(i) }

func regexpFind(pattern, s string) string {
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		return ""
	}
	return m[1]
}
