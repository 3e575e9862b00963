package web

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's "Sign in with ChatGPT": the device-code login `accounts
// login` runs (oauth.DeviceLogin). The request that starts it asks the auth
// server for a user code and shows it; a goroutine owned by the server
// polls until the login is approved, denied or expired, or until the code's
// life (Config.SignInTimeout) is over or the server closes, and then adds
// the account (or gives a workspace already in the pool its new tokens),
// as an auth.json import does. The sign-in's page follows it live.
//
// A sign-in lives in the memory of the replica that started it: its page
// is found there only, and a restart ends it.

const (
	// defaultSignInTimeout is the life of a user code at auth.openai.com.
	defaultSignInTimeout = 15 * time.Minute
	// maxPendingSignIns bounds the sign-ins waiting for approval at once.
	maxPendingSignIns = 8
	// signInKept is how long an ended sign-in's outcome stays on its page.
	signInKept = time.Hour
	// signInStartTimeout bounds asking the auth server for a code.
	signInStartTimeout = 30 * time.Second
	// signInCancelled is the outcome of a sign-in an operator gave up.
	signInCancelled = "cancelled by an operator"
)

// signInState is where a sign-in is.
type signInState string

const (
	signInPending   signInState = "waiting for approval"
	signInAdded     signInState = "added"
	signInRefreshed signInState = "tokens replaced"
	signInFailed    signInState = "failed"
)

// signIns are the console's sign-ins on this replica.
type signIns struct {
	ctx  context.Context // static: the owner of every sign-in's goroutine, ended by close
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	byID   map[string]*signIn // guarded by mu
	closed bool               // guarded by mu
}

func newSignIns() *signIns {
	ctx, stop := context.WithCancel(context.Background())
	return &signIns{ctx: ctx, stop: stop, byID: map[string]*signIn{}}
}

// signIn is one device-code login started from the console.
type signIn struct {
	// Static after start.
	id       string
	code     oauth.DeviceCode
	started  time.Time
	deadline time.Time
	cancel   context.CancelFunc // ends the wait: the operator gave up
	done     chan struct{}      // closed when the goroutine has recorded the outcome

	// Guarded by signIns.mu.
	state   signInState
	message string // why it failed, or what it did
	account store.Account
	ended   time.Time
}

// close ends every sign-in under way and waits for their goroutines, which
// record that the relay stopped.
func (ss *signIns) close() {
	ss.mu.Lock()
	ss.closed = true
	ss.mu.Unlock()
	ss.stop()
	ss.wg.Wait()
}

// add registers a new sign-in, refusing when too many are pending or the
// server is closing; ended sign-ins older than signInKept are forgotten.
func (ss *signIns) add(si *signIn, now time.Time) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return &HTTPError{Status: http.StatusServiceUnavailable, Code: "stopping", Msg: "the relay is stopping: start the sign-in again once it is back"}
	}
	pending := 0
	for id, o := range ss.byID {
		switch {
		case o.state == signInPending:
			pending++
		case now.Sub(o.ended) > signInKept:
			delete(ss.byID, id)
		}
	}
	if pending >= maxPendingSignIns {
		return &HTTPError{Status: http.StatusTooManyRequests, Code: "too_many_signins",
			Msg: fmt.Sprintf("%d sign-ins are already waiting for approval: finish or cancel one first", pending)}
	}
	ss.byID[si.id] = si
	return nil
}

func (ss *signIns) get(id string) (*signIn, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	si, ok := ss.byID[id]
	return si, ok
}

// end records a sign-in's outcome.
func (ss *signIns) end(si *signIn, state signInState, message string, a store.Account, now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	si.state, si.message, si.account, si.ended = state, message, a, now
}

// list returns the sign-ins under way and those that ended less than
// signInKept before now, newest first.
func (ss *signIns) list(now time.Time) []*signIn {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*signIn, 0, len(ss.byID))
	for _, si := range ss.byID {
		if si.state == signInPending || now.Sub(si.ended) <= signInKept {
			out = append(out, si)
		}
	}
	slices.SortFunc(out, func(a, b *signIn) int { return b.started.Compare(a.started) })
	return out
}

// Close ends the console's sign-ins under way and waits until their
// goroutines have returned, and writes the failed admin-token attempts not
// yet audited. Call it once the HTTP server has stopped serving, before the
// store is closed; the server must not be used afterwards.
func (s *Server) Close() {
	s.signIns.close()
	s.authFailures.close()
}

// signInForm is the sign-in form: where the account goes, as `accounts
// login`'s flags say it (tags, organisation, priority, base URL, proxy), or
// Account, the account to sign in again (its proxy carries the sign-in).
type signInForm struct {
	Account, Tags, Organization, BaseURL, Priority, ProxyURL string
}

func parseSignInForm(c echo.Context) signInForm {
	v := func(n string) string { return strings.TrimSpace(c.FormValue(n)) }
	return signInForm{Account: v("account"), Tags: v("tags"), Organization: v("organization"), BaseURL: v("base_url"),
		Priority: v("priority"), ProxyURL: v("proxy_url")}
}

// placement is the form as an account form, checked as the API checks
// one: what the added account gets besides the login's own fields.
func (f signInForm) placement() (AccountForm, error) {
	p := AccountForm{Organization: optional(f.Organization), BaseURL: optional(f.BaseURL), ProxyURL: optional(f.ProxyURL)}
	if tags := splitComma(f.Tags); len(tags) > 0 {
		p.Tags = &tags
	}
	if f.Priority != "" {
		n, err := strconv.Atoi(f.Priority)
		if err != nil {
			return p, badField("priority", "must be a whole number between -1000 and 1000")
		}
		p.Priority = &n
	}
	if err := p.validateCommon(); err != nil {
		return p, err
	}
	return p, nil
}

// signInURL is a sign-in's page.
func signInURL(id string) string { return "/admin/accounts/signin/" + url.PathEscape(id) }

// signInClient returns the client a sign-in goes out through, the way the
// account's traffic will (its proxy, else the relay's default egress), and
// what to call when the sign-in is over.
func (s *Server) signInClient(p store.Proxy) (*http.Client, func(), error) {
	if s.cfg.SignInClient != nil {
		hc, err := s.cfg.SignInClient(p)
		return hc, func() {}, err
	}
	hc, err := relay.NewUpstream().Via(p)
	if err != nil {
		return nil, nil, err
	}
	return hc, hc.CloseIdleConnections, nil
}

// consoleStartSignIn asks the auth server for a user code and shows the
// sign-in's page; the rest happens in the background (runSignIn).
func (s *Server) consoleStartSignIn(c echo.Context) error {
	f := parseSignInForm(c)
	ret := "/admin/accounts"
	place, err := f.placement()
	if err != nil {
		return s.back(c, ret, err, "")
	}
	ctx := c.Request().Context()
	proxy, _ := place.proxy() // checked by placement
	if f.Account != "" {
		a, err := s.cfg.Store.Account(ctx, f.Account)
		if err != nil {
			return s.back(c, ret, err, "")
		}
		// Signing an account in again: its own proxy, none of the form's
		// placement (a workspace already in the pool keeps its settings).
		ret, proxy, place = accountURL(a.ID), a.Proxy, AccountForm{}
	}
	hc, release, err := s.signInClient(proxy)
	if err != nil {
		return s.back(c, ret, badField("proxy_url", "%s", proxy.Redact(err).Error()), "")
	}
	login := oauth.DeviceLogin{HTTPClient: hc, Issuer: s.cfg.AuthURL, MaxWait: s.cfg.SignInTimeout}
	sctx, cancelStart := context.WithTimeout(ctx, signInStartTimeout)
	dc, err := login.Start(sctx)
	cancelStart()
	if err != nil {
		release()
		s.log.Warn("console sign-in: no code", "err", proxy.Redact(err))
		s.flash(c, "error", "Could not start the sign-in: "+signInError(proxy.Redact(err)))
		return c.Redirect(http.StatusSeeOther, ret)
	}
	now := s.cfg.Now()
	wctx, cancel := context.WithTimeout(s.signIns.ctx, s.cfg.SignInTimeout)
	si := &signIn{id: "signin_" + randomID(), code: dc, started: now, deadline: now.Add(s.cfg.SignInTimeout),
		cancel: cancel, done: make(chan struct{}), state: signInPending}
	if err := s.signIns.add(si, now); err != nil {
		cancel()
		release()
		return s.back(c, ret, err, "")
	}
	w := actorOf(c)
	s.audit(c, "account.signin", "signin:"+si.id, "started: waiting up to "+span(s.cfg.SignInTimeout)+" for the approval")
	s.signIns.wg.Add(1)
	go func() {
		defer s.signIns.wg.Done()
		defer release()
		defer cancel()
		s.runSignIn(wctx, si, login, place, proxy, w)
	}()
	return c.Redirect(http.StatusSeeOther, signInURL(si.id))
}

// runSignIn waits for a sign-in's approval and adds its account. It ends
// by the code's deadline (ctx), the operator's cancel, or the server's
// Close, and always records an outcome.
func (s *Server) runSignIn(ctx context.Context, si *signIn, login oauth.DeviceLogin, place AccountForm, proxy store.Proxy, w who) {
	defer close(si.done)
	fail := func(msg string) {
		s.signIns.end(si, signInFailed, msg, store.Account{}, s.cfg.Now())
		s.auditAs(ctx, w, "account.signin", "signin:"+si.id, "failed: "+msg)
	}
	im, err := login.Wait(ctx, si.code)
	if err != nil {
		switch {
		case s.signIns.ctx.Err() != nil:
			fail("the relay stopped before the sign-in was approved; start again")
		case errors.Is(err, context.Canceled):
			// consoleCancelSignIn audits the cancel as its operator.
			s.signIns.end(si, signInFailed, signInCancelled, store.Account{}, s.cfg.Now())
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, oauth.ErrDeviceLoginTimeout):
			fail("not approved within " + span(s.cfg.SignInTimeout) + "; start again")
		default:
			fail(signInError(proxy.Redact(err)))
		}
		return
	}
	if im.Kind != store.KindChatGPT {
		fail("the auth server answered a login that is not a ChatGPT account")
		return
	}
	// The login is done: adding it must not be cut by the server closing
	// under it, only bounded.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	done, err := s.importAccounts(actx, w, []oauth.ImportedAccount{im}, place, "account.signin")
	if err != nil || len(done) != 1 {
		msg, fixable := fixable(err)
		if !fixable {
			s.log.Error("console sign-in: add the account", "err", err)
			msg = "signed in as " + im.Label() + ", but the account could not be stored; start again"
		}
		fail(msg)
		return
	}
	r := done[0]
	if r.Refreshed {
		s.signIns.end(si, signInRefreshed, "Signed in as "+im.Label()+": the account already in the pool has the new tokens.", r.Account, s.cfg.Now())
		return
	}
	s.signIns.end(si, signInAdded, "Signed in as "+im.Label()+": account added.", r.Account, s.cfg.Now())
}

// signInError says why a sign-in failed, in words for the page.
func signInError(err error) string {
	switch {
	case errors.Is(err, oauth.ErrDeviceCodeExpired):
		return "the code expired before it was approved; start again"
	case errors.Is(err, oauth.ErrDeviceLoginDenied):
		return "the sign-in was denied"
	case errors.Is(err, oauth.ErrDeviceLoginOff):
		return "this auth server does not offer device-code sign-in (404): check CODEX_RELAY_AUTH_URL"
	}
	return strings.TrimPrefix(err.Error(), "device login: ")
}

func randomID() string {
	var raw [12]byte
	if _, err := rand.Read(raw[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return b64.EncodeToString(raw[:])
}

// signInView shows a sign-in as its page and the accounts list do.
func (s *Server) signInView(si *signIn, now time.Time) ui.SignIn {
	s.signIns.mu.Lock()
	state, message, a := si.state, si.message, si.account
	s.signIns.mu.Unlock()
	v := ui.SignIn{ID: si.id, URL: signInURL(si.id), UserCode: si.code.UserCode, VerificationURL: si.code.VerificationURL,
		State: string(state), Message: message, Started: stamp(si.started)}
	switch state {
	case signInPending:
		v.Pending, v.Tone = true, "info"
		v.Expires = "until " + stamp(si.deadline) + " (" + until(now, si.deadline) + ")"
	case signInAdded, signInRefreshed:
		v.Tone, v.AccountLabel, v.AccountURL = "ok", a.Label, accountURL(a.ID)
	default:
		v.Tone = "bad"
	}
	return v
}

func (s *Server) signInPage(c echo.Context) error {
	si, ok := s.signIns.get(c.Param("id"))
	if !ok {
		return &HTTPError{Status: http.StatusNotFound, Code: "not_found",
			Msg: "No such sign-in on this replica: a sign-in is kept by the replica that started it, for an hour after it ends."}
	}
	v := s.signInView(si, s.cfg.Now())
	v.LiveURL = "/admin/live/signin?" + url.Values{"id": {si.id}}.Encode()
	return s.render(c, http.StatusOK, ui.SignInPage(s.subframe(c, "accounts", "Sign in with ChatGPT"), v))
}

// consoleCancelSignIn gives up a sign-in waiting for approval.
func (s *Server) consoleCancelSignIn(c echo.Context) error {
	si, ok := s.signIns.get(c.Param("id"))
	if !ok {
		return &HTTPError{Status: http.StatusNotFound, Code: "not_found", Msg: "no such sign-in on this replica"}
	}
	s.signIns.mu.Lock()
	pending := si.state == signInPending
	s.signIns.mu.Unlock()
	if !pending {
		return s.back(c, signInURL(si.id), nil, "This sign-in had already ended.")
	}
	si.cancel()
	<-si.done // the goroutine has recorded the outcome
	s.signIns.mu.Lock()
	cancelled := si.state == signInFailed && si.message == signInCancelled
	s.signIns.mu.Unlock()
	if !cancelled { // it ended otherwise just before
		return s.back(c, signInURL(si.id), nil, "This sign-in had already ended.")
	}
	s.audit(c, "account.signin", "signin:"+si.id, "cancelled")
	return s.back(c, signInURL(si.id), nil, "Cancelled the sign-in.")
}
