package web

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// replicaPair is two console replicas on one database, each with its own
// store handle (as two processes have), on the same clock.
type replicaPair struct {
	a, b   *Server
	sa, sb *store.Store
	clk    *testClock
}

// eachReplicaPair runs f on a pair of replicas of every backend.
func eachReplicaPair(t *testing.T, f func(t *testing.T, p replicaPair)) {
	for _, be := range storetest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			dbURL := be.URL(t)
			p := replicaPair{clk: &testClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}}
			p.sa = storetest.Open(t, dbURL, store.Options{})
			p.sb = storetest.Open(t, dbURL, store.Options{})
			replica := func(s *store.Store) *Server {
				srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Relay: &fakeRelay{inflight: map[string]int{}},
					SessionKey: []byte("test session key"), Now: p.clk.Now, LiveInterval: 20 * time.Millisecond})
				t.Cleanup(srv.Close)
				return srv
			}
			p.a, p.b = replica(p.sa), replica(p.sb)
			f(t, p)
		})
	}
}

// Signing out on one replica ends the session on every replica at its next
// request: its cookie, replayed, and its CSRF token are refused there, and
// the form they carried does nothing.
func TestSignOutEndsTheSessionOnEveryReplica(t *testing.T) {
	eachReplicaPair(t, func(t *testing.T, p replicaPair) {
		ctx := context.Background()
		br := newBrowser(t, p.a)
		br.login()
		br.h = p.b
		require.Equal(t, http.StatusOK, br.get("/admin/keys").Code, "replica B accepts the session signed in on A")
		csrf := br.csrf
		require.NotEmpty(t, csrf)

		tsB := httptest.NewServer(p.b)
		t.Cleanup(tsB.Close)
		live, stop := openLive(t, tsB, br, "/admin/live/overview")
		defer stop()
		assert.Contains(t, nextEvent(t, live), "Accounts available", "B streams the overview")

		br.h = p.a
		cookie := *br.cookies[sessionCookie]
		require.Equal(t, http.StatusSeeOther, br.post("/admin/logout", nil).Code)
		_, err := io.Copy(io.Discard, live)
		assert.NoError(t, err, "B's open live view ends at its next update")
		require.NotContains(t, br.cookies, sessionCookie, "A clears the cookie")

		// A stolen copy of the cookie, and the page's CSRF token, on B.
		br.h = p.b
		br.cookies[sessionCookie] = &cookie
		rec := br.post("/admin/keys", url.Values{"_csrf": {csrf}, "name": {"after sign-out"}})
		var keys []store.ClientKey
		assert.Equal(t, http.StatusUnauthorized, rec.Code, "B refuses the signed-out session's form")
		keys, err = p.sb.ClientKeys(ctx)
		require.NoError(t, err)
		assert.Empty(t, keys, "nothing was created")

		rec = br.get("/admin/keys")
		assert.Equal(t, http.StatusSeeOther, rec.Code, "B sends the signed-out session to the login page")
		assert.Equal(t, "/admin/login?next=%2Fadmin%2Fkeys", rec.Header().Get("Location"))
		br.h = p.a
		assert.Equal(t, http.StatusSeeOther, br.get("/admin/").Code, "and so does A")
	})
}

// A session's last sighting is written at most once a minute, by pages and
// forms but not by live views; it ends after sessionIdle without one, on
// every replica (an open live view too), and sessionTTL after it began
// however busy it was.
func TestSessionIdleAndAbsoluteLifetimes(t *testing.T) {
	eachReplicaPair(t, func(t *testing.T, p replicaPair) {
		ctx := context.Background()
		tsA, tsB := httptest.NewServer(p.a), httptest.NewServer(p.b)
		t.Cleanup(tsA.Close)
		t.Cleanup(tsB.Close)
		br := newBrowser(t, p.a)
		br.login()
		id := cookieSessionID(t, br)
		seen := func() time.Time {
			t.Helper()
			cs, err := p.sb.ConsoleSession(ctx, id)
			require.NoError(t, err)
			return cs.Seen
		}
		t0 := p.clk.Now()
		require.Equal(t, t0, seen(), "signing in is a sighting")
		p.clk.Add(30 * time.Second)
		require.Equal(t, http.StatusOK, br.get("/admin/").Code)
		assert.Equal(t, t0, seen(), "not written again within the minute")
		p.clk.Add(31 * time.Second)
		require.Equal(t, http.StatusOK, br.get("/admin/keys").Code)
		assert.Equal(t, t0.Add(61*time.Second), seen(), "written once the minute is over")
		p.clk.Add(5 * time.Minute)
		live, stop := openLive(t, tsA, br, "/admin/live/overview")
		assert.Contains(t, nextEvent(t, live), "Accounts available")
		stop()
		assert.Equal(t, t0.Add(61*time.Second), seen(), "a live view is not a sighting")

		for i := range 3 { // each visit, on either replica, restarts the idle time
			br.h = []*Server{p.a, p.b}[i%2]
			require.Equal(t, http.StatusOK, br.get("/admin/").Code, "visit %d", i+1)
			p.clk.Add(sessionIdle - time.Minute)
		}
		live, stop = openLive(t, tsB, br, "/admin/live/overview")
		defer stop()
		assert.Contains(t, nextEvent(t, live), "Accounts available")
		p.clk.Add(time.Minute)
		_, err := io.Copy(io.Discard, live)
		assert.NoError(t, err, "idle for %s: B's open live view ends", sessionIdle)
		br.h = p.b
		assert.Equal(t, http.StatusSeeOther, br.get("/admin/").Code, "idle for %s: signed out on B", sessionIdle)
		br.h = p.a
		assert.Equal(t, http.StatusSeeOther, br.get("/admin/").Code, "and on A")

		br = newBrowser(t, p.a)
		br.login()
		began := p.clk.Now()
		for p.clk.Now().Add(sessionIdle / 2).Before(began.Add(sessionTTL)) {
			p.clk.Add(sessionIdle / 2)
			require.Equal(t, http.StatusOK, br.get("/admin/").Code, "%s after signing in", p.clk.Now().Sub(began))
		}
		p.clk.Add(began.Add(sessionTTL).Sub(p.clk.Now()))
		br.h = p.b
		assert.Equal(t, http.StatusSeeOther, br.get("/admin/").Code, "%s after signing in: over", sessionTTL)
	})
}

// cookieSessionID is the session id the browser's session cookie carries.
func cookieSessionID(t *testing.T, br *browser) string {
	t.Helper()
	ck := br.cookies[sessionCookie]
	require.NotNil(t, ck)
	parts := strings.Split(ck.Value, ".")
	require.Len(t, parts, 4)
	return parts[1]
}

// A session stands while not signed out, before its end and within the idle
// limit of its last sighting.
func TestSessionStands(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fresh := store.ConsoleSession{ID: "s", Created: t0, Seen: t0, Expires: t0.Add(sessionTTL)}
	for name, tc := range map[string]struct {
		cs   store.ConsoleSession
		at   time.Time
		want bool
	}{
		"just signed in":            {fresh, t0, true},
		"idle just under the limit": {fresh, t0.Add(sessionIdle - time.Millisecond), true},
		"idle for the limit":        {fresh, t0.Add(sessionIdle), false},
		"seen lately, near its end": {store.ConsoleSession{Seen: t0.Add(sessionTTL - time.Minute), Expires: t0.Add(sessionTTL)}, t0.Add(sessionTTL - time.Millisecond), true},
		"at its end":                {store.ConsoleSession{Seen: t0.Add(sessionTTL - time.Minute), Expires: t0.Add(sessionTTL)}, t0.Add(sessionTTL), false},
		"signed out":                {store.ConsoleSession{Seen: t0, Expires: t0.Add(sessionTTL), Revoked: t0}, t0.Add(time.Second), false},
	} {
		assert.Equal(t, tc.want, stands(tc.cs, tc.at), name)
	}
}

// A well-signed cookie whose session has no row (issued before the rows
// existed, or swept) is refused, on pages and forms alike.
func TestSessionWithoutARowIsRefused(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	signer := newSessions([]byte("test session key"), HashAdminToken(testAdminToken), time.Now)
	token, sess := signer.issue(purposeSession, time.Hour)
	br := newBrowser(t, srv)
	br.cookies[sessionCookie] = &http.Cookie{Name: sessionCookie, Value: token}
	assert.Equal(t, http.StatusSeeOther, br.get("/admin/").Code)
	rec := br.post("/admin/keys", url.Values{"_csrf": {signer.csrf(purposeSession, sess)}, "name": {"k"}})
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	keys, err := s.ClientKeys(context.Background())
	require.NoError(t, err)
	assert.Empty(t, keys)
}

// A sign-in whose session row the database does not take says so (503),
// instead of setting a cookie no replica would take and looping back to
// the login page.
func TestSignInWithoutTheDatabaseSaysSo(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	srv, _ := consoleServer(t, s)
	br := newBrowser(t, srv)
	require.Equal(t, http.StatusOK, br.get("/admin/login").Code)
	require.NoError(t, s.Close())
	rec := br.post("/admin/login", url.Values{"token": {testAdminToken}, "next": {"/admin/"}})
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Contains(t, body(rec), "the database did not store the session")
	assert.NotContains(t, br.cookies, sessionCookie, "no cookie for a session that does not stand")
}

// The cost of reading a session's row on every console request: verify,
// signature and row, on each backend (the figure README gives).
func BenchmarkSessionVerify(b *testing.B) {
	for _, be := range storetest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			s := storetest.Open(b, be.URL(b), store.Options{})
			ss := newSessions([]byte("bench session key"), HashAdminToken(testAdminToken), time.Now).keptIn(s, nil)
			token, _ := ss.issue(purposeSession, time.Hour)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := ss.verify(context.Background(), purposeSession, token); !ok {
					b.Fatal("the session does not stand")
				}
			}
		})
	}
}
