package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Console sessions are signed tokens, not server-side rows: any replica
// holding the same session key accepts them. The signing key is derived from
// the session key and the admin token's hash, so a new admin token ends every
// session. Logging out revokes the session on this replica.

const (
	sessionCookie = "codex_relay_session" // a logged-in console session
	loginCookie   = "codex_relay_login"   // a visitor of the login page, for its CSRF token
	flashCookie   = "codex_relay_flash"   // a one-time message for the next page
	cookiePath    = "/admin"

	sessionTTL = 12 * time.Hour
	loginTTL   = time.Hour
	flashTTL   = time.Minute
)

// Purposes keep tokens of one kind from being accepted as another.
const (
	purposeSession = "session"
	purposeLogin   = "login"
	purposeFlash   = "flash"
)

// session is a verified token: its random id and when it ends.
type session struct {
	ID      string
	Expires time.Time
}

// sessions signs and verifies console tokens. key and now are static; mu
// guards revoked.
type sessions struct {
	key []byte
	now func() time.Time

	mu      sync.Mutex
	revoked map[string]time.Time // session id -> its expiry, after which the entry is useless
}

func newSessions(sessionKey []byte, adminHash [32]byte, now func() time.Time) *sessions {
	m := hmac.New(sha256.New, sessionKey)
	m.Write([]byte("codex-relay console v1\x00"))
	m.Write(adminHash[:])
	return &sessions{key: m.Sum(nil), now: now, revoked: map[string]time.Time{}}
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

// issue returns a new token for purpose, valid for ttl, and its session.
// The token is "v1.<id>.<expiry unix>.<mac>".
func (ss *sessions) issue(purpose string, ttl time.Duration) (string, session) {
	var raw [18]byte
	if _, err := rand.Read(raw[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	s := session{ID: b64.EncodeToString(raw[:]), Expires: ss.now().Add(ttl).Truncate(time.Second)}
	exp := strconv.FormatInt(s.Expires.Unix(), 10)
	return "v1." + s.ID + "." + exp + "." + ss.mac(purpose, s.ID, exp), s
}

// verify checks a token of purpose: its signature, its expiry and, for
// sessions, that it was not revoked.
func (ss *sessions) verify(purpose, token string) (session, bool) {
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
	ss.mu.Lock()
	_, gone := ss.revoked[id]
	ss.mu.Unlock()
	if gone {
		return session{}, false
	}
	return s, true
}

// revoke refuses a session from now on (on this replica), and forgets
// revocations whose sessions have expired anyway.
func (ss *sessions) revoke(s session) {
	now := ss.now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, exp := range ss.revoked {
		if !now.Before(exp) {
			delete(ss.revoked, id)
		}
	}
	ss.revoked[s.ID] = s.Expires
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
