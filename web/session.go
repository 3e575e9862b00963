package web

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// A console session is a row in the store, shared by every replica
// (store.ConsoleSession), named by a signed cookie. The signature, keyed
// from the session key and the admin token's hash (so a new admin token
// ends every session), keeps forged and tampered cookies away from the
// database; the row decides whether the session stands. Every console
// request reads it, uncached: the console is low traffic, and a read costs
// about 45 µs on SQLite and 0.25 ms on PostgreSQL over loopback
// (BenchmarkSessionVerify). So signing out (the row revoked), an idle
// session and an expired one are refused on every replica at their next
// request, and open live views end within one live interval. Login-page
// visits and flash messages are signed tokens alone.

const (
	sessionCookie = "codex_relay_session" // a logged-in console session
	loginCookie   = "codex_relay_login"   // a visitor of the login page, for its CSRF token
	flashCookie   = "codex_relay_flash"   // a one-time message for the next page
	cookiePath    = "/admin"

	// sessionTTL is a session's absolute life, however busy it is.
	sessionTTL = 12 * time.Hour
	// sessionIdle ends a session no page or form of the operator's used
	// for this long; a live view's own updates do not count.
	sessionIdle = time.Hour
	// sessionSeenEvery is how often at most a session's last sighting is
	// written: not a write per request. The idle limit may so come up to
	// this much early.
	sessionSeenEvery = time.Minute
	// sessionStoreTimeout bounds reading or writing a session's row when
	// the caller has no request context to bound it.
	sessionStoreTimeout = 10 * time.Second

	loginTTL = time.Hour
	flashTTL = time.Minute
)

// Purposes keep tokens of one kind from being accepted as another.
const (
	purposeSession = "session"
	purposeLogin   = "login"
	purposeFlash   = "flash"
)

// session is a verified token: its random id and when it ends; for a
// console session, also when its row was last seen.
type session struct {
	ID      string
	Expires time.Time
	Seen    time.Time
	// UserID and TokenID name who signed in, and with which personal
	// token; both "" for the admin token.
	UserID, TokenID string
}

// sessions signs and verifies console tokens and keeps the console
// sessions' rows. Its fields are static after construction; the store
// guards the rows.
type sessions struct {
	key []byte
	now func() time.Time
	// store holds the sessions' rows. Nil: a signer alone, whose sessions
	// have no row and so never stand.
	store *store.Store
	log   *slog.Logger
}

func newSessions(sessionKey []byte, adminHash [32]byte, now func() time.Time) *sessions {
	m := hmac.New(sha256.New, sessionKey)
	m.Write([]byte("codex-relay console v1\x00"))
	m.Write(adminHash[:])
	return &sessions{key: m.Sum(nil), now: now, log: slog.New(slog.DiscardHandler)}
}

// keptIn returns ss keeping its console sessions in st, logging to log
// (nil: nowhere).
func (ss *sessions) keptIn(st *store.Store, log *slog.Logger) *sessions {
	ss.store = st
	if log != nil {
		ss.log = log
	}
	return ss
}

var b64 = base64.RawURLEncoding

func (ss *sessions) mac(parts ...string) string {
	m := hmac.New(sha256.New, ss.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return b64.EncodeToString(m.Sum(nil))
}

// issue returns a new token for purpose, valid for ttl, and its session;
// a console session's row is stored with it, signed in with the admin
// token. The token is "v1.<id>.<expiry unix>.<mac>".
func (ss *sessions) issue(purpose string, ttl time.Duration) (string, session) {
	return ss.issueFor(purpose, ttl, "", "")
}

// issueFor is issue for a console session of a user signed in with a
// personal token (both "": the admin token).
func (ss *sessions) issueFor(purpose string, ttl time.Duration, userID, tokenID string) (string, session) {
	var raw [18]byte
	if _, err := rand.Read(raw[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	now := ss.now()
	s := session{ID: b64.EncodeToString(raw[:]), Expires: now.Add(ttl).Truncate(time.Second), UserID: userID, TokenID: tokenID}
	exp := strconv.FormatInt(s.Expires.Unix(), 10)
	if purpose == purposeSession && ss.store != nil {
		s.Seen = now
		ctx, cancel := context.WithTimeout(context.Background(), sessionStoreTimeout)
		defer cancel()
		if err := ss.store.CreateConsoleSession(ctx, store.ConsoleSession{ID: s.ID, UserID: userID, TokenID: tokenID,
			Created: now, Seen: now, Expires: s.Expires}); err != nil {
			// Its cookie names no row, so the session does not stand:
			// the operator is sent back to the login page.
			ss.log.Error("console sign-in: the session could not be stored", "err", err)
		}
	}
	return "v1." + s.ID + "." + exp + "." + ss.mac(purpose, s.ID, exp), s
}

// verify checks a token of purpose: its signature, its expiry and, for a
// console session, that its row stands.
func (ss *sessions) verify(ctx context.Context, purpose, token string) (session, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 4 || parts[0] != "v1" {
		return session{}, false
	}
	id, exp, sig := parts[1], parts[2], parts[3]
	if !hmac.Equal([]byte(sig), []byte(ss.mac(purpose, id, exp))) {
		return session{}, false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return session{}, false
	}
	s := session{ID: id, Expires: time.Unix(unix, 0)}
	if !ss.now().Before(s.Expires) {
		return session{}, false
	}
	if purpose != purposeSession {
		return s, true
	}
	ctx, cancel := context.WithTimeout(ctx, sessionStoreTimeout)
	defer cancel()
	return ss.lookup(ctx, id)
}

// lookup reads a console session's row: the session, if it stands now.
// A row that cannot be read is a session that does not stand.
func (ss *sessions) lookup(ctx context.Context, id string) (session, bool) {
	if ss.store == nil {
		return session{}, false
	}
	cs, err := ss.store.ConsoleSession(ctx, id)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
			ss.log.Warn("console session: read its row", "err", err)
		}
		return session{}, false
	}
	if !stands(cs, ss.now()) {
		return session{}, false
	}
	return session{ID: cs.ID, Expires: cs.Expires, Seen: cs.Seen, UserID: cs.UserID, TokenID: cs.TokenID}, true
}

// stands reports whether a console session admits a request at now: not
// signed out, before its absolute end, and seen within the idle limit.
func stands(cs store.ConsoleSession, now time.Time) bool {
	return cs.Revoked.IsZero() && now.Before(cs.Expires) && now.Sub(cs.Seen) < sessionIdle
}

// stillStands reports whether a session verified earlier still stands:
// what a long request (a live view) asks as it goes.
func (ss *sessions) stillStands(ctx context.Context, s session) bool {
	_, ok := ss.lookup(ctx, s.ID)
	return ok
}

// seen records the operator's activity in a session, when its row was
// last seen sessionSeenEvery ago or more.
func (ss *sessions) seen(ctx context.Context, s session) {
	now := ss.now()
	if ss.store == nil || now.Sub(s.Seen) < sessionSeenEvery {
		return
	}
	if err := ss.store.SeeConsoleSession(ctx, s.ID, now); err != nil && ctx.Err() == nil {
		ss.log.Warn("console session: record its activity", "err", err)
	}
}

// revoke signs a session out on every replica: its row is revoked. An
// error is a row the store did not take: the session may still stand
// elsewhere until it ends.
func (ss *sessions) revoke(ctx context.Context, s session) error {
	if ss.store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, sessionStoreTimeout)
	defer cancel()
	if err := ss.store.RevokeConsoleSession(ctx, s.ID, ss.now()); err != nil {
		ss.log.Error("console sign-out: the session could not be revoked", "err", err)
		return err
	}
	return nil
}

// noteSeen counts a console request as its session's activity (see
// sessions.seen), the idle limit running from it. A live view's stream
// does not count: an open page updating itself is not an operator at
// work, so a tab left open still ends at the idle limit. It runs after
// requireSession.
func (s *Server) noteSeen(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if sess, ok := c.Get(sessionKey).(session); ok && !strings.HasPrefix(c.Path(), "/admin/live/") {
			s.sessions.seen(c.Request().Context(), sess)
		}
		return next(c)
	}
}

// csrf is the CSRF token of a session or login-page visit: bound to it, so a
// token taken from one session is worthless in another.
func (ss *sessions) csrf(purpose string, s session) string {
	return ss.mac("csrf", purpose, s.ID)
}

// sealFlash signs a one-time message: "<kind>.<text, base64>.<mac>".
func (ss *sessions) sealFlash(kind, text string) string {
	enc := b64.EncodeToString([]byte(text))
	return kind + "." + enc + "." + ss.mac(purposeFlash, kind, enc)
}

func (ss *sessions) openFlash(v string) (kind, text string, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 || !hmac.Equal([]byte(parts[2]), []byte(ss.mac(purposeFlash, parts[0], parts[1]))) {
		return "", "", false
	}
	raw, err := b64.DecodeString(parts[1])
	if err != nil {
		return "", "", false
	}
	return parts[0], string(raw), true
}
