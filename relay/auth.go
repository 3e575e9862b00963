package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/ratelimit"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// client is an authenticated caller.
type client struct {
	key   store.ClientKey // zero for a keyless loopback client
	keyed bool
}

// scope is the client key scope bindings and continuity are kept under.
func (c client) scope() string { return c.key.ID }

// checkModel refuses a model outside the key's allow-list; a key with an
// allow-list must name its model (the upstream's default is no model the
// operator allowed).
func (c client) checkModel(model string) error {
	if len(c.key.Models) == 0 || slices.Contains(c.key.Models, model) {
		return nil
	}
	if model == "" {
		return refuse(http.StatusForbidden, "model_not_allowed", "this client key may only use the models it lists: name one in \"model\"")
	}
	return refuse(http.StatusForbidden, "model_not_allowed", fmt.Sprintf("this client key may not use model %q", model))
}

// restrictsModels reports whether the key limits the models it may use, by
// a list or by aliases.
func (c client) restrictsModels() bool {
	return len(c.key.Models) > 0 || len(c.key.Policy.ModelAliases) > 0
}

// checkUploadModel is checkModel for the model field of a streamed upload,
// which the relay does not rewrite: an alias there is refused, naming
// what to send instead.
func (c client) checkUploadModel(model string) error {
	if target, ok := c.key.Policy.ModelAliases[model]; ok {
		return refuse(http.StatusBadRequest, "model_alias_in_upload",
			fmt.Sprintf("model aliases are not applied to uploads: name the model itself (%q for %q)", target, model))
	}
	return c.checkModel(model)
}

// errUnauthenticated marks a request refused for want of a usable key.
var errUnauthenticated = errors.New("unauthenticated")

// errKeyRejected marks a request refused because the client key it bears is
// unknown, revoked or expired (it wraps errUnauthenticated too): a failed
// attempt, counted by limitKeyFailures.
var errKeyRejected = errors.New("client key rejected")

// Wrong client keys per client address: a burst of keyFailureBurst, then
// one more every keyFailureRefill (the console login's figures).
const (
	keyFailureBurst  = ratelimit.DefaultBurst
	keyFailureRefill = ratelimit.DefaultRefill
)

// admit authenticates r and answers the client itself when that fails.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (client, bool) {
	cl, err := s.authenticate(r.Context(), r, false)
	if err != nil {
		s.writeFailure(w, s.limitKeyFailures(r, err))
		return client{}, false
	}
	return cl, true
}

// admitIdentified is admit followed by parsing the request's identity
// headers; it answers the client itself when either fails.
func (s *Server) admitIdentified(w http.ResponseWriter, r *http.Request) (client, Identity, bool) {
	return s.admitIdentifiedOr(w, r, nil)
}

// admitIdentifiedOr is admitIdentified where, when r is refused, forwarded
// may vouch for it: another replica admitted it and forwarded it here (its
// hop verified). A keyless request admitted there came from its loopback,
// so it counts as local here.
func (s *Server) admitIdentifiedOr(w http.ResponseWriter, r *http.Request, forwarded func() bool) (client, Identity, bool) {
	cl, err := s.authenticate(r.Context(), r, false)
	vouched := false
	if errors.Is(err, errUnauthenticated) && forwarded != nil && forwarded() {
		vouched = true
		cl, err = s.authenticate(r.Context(), r, true)
	}
	if err != nil {
		if !vouched {
			// A forwarded request's address is the replica's, which
			// admitted the key itself: not a guess to count.
			err = s.limitKeyFailures(r, err)
		}
		s.writeFailure(w, err)
		return client{}, Identity{}, false
	}
	ident, err := ParseIdentity(r.Header)
	if err != nil {
		s.writeFailure(w, refuse(http.StatusBadRequest, "invalid_header", err.Error()))
		return client{}, Identity{}, false
	}
	return cl, ident, true
}

// authenticate admits a request bearing a usable relay client key. While no
// key was ever created (keyless mode, a choice made once), it admits
// loopback clients without one, and requests another replica admitted so
// and forwarded, but never a request a web page made: a browser on the
// operator's machine must not spend the pool or read answers, by a form,
// a fetch, or DNS rebinding. The key itself is never forwarded upstream.
func (s *Server) authenticate(ctx context.Context, r *http.Request, forwarded bool) (client, error) {
	token := ""
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		token = strings.TrimSpace(h[7:])
	}
	if strings.HasPrefix(token, store.ClientKeyPrefix) {
		k, err := s.cfg.Store.AuthenticateClientKey(ctx, token)
		if errors.Is(err, store.ErrKeyRejected) {
			return client{}, fmt.Errorf("%w: %w", errKeyRejected, unauthorized(msgKeyRejected))
		}
		if err != nil {
			return client{}, storeUnavailable("check the client key", err)
		}
		return client{key: k, keyed: true}, nil
	}
	ever, err := s.cfg.Store.KeysEverCreated(ctx)
	if err != nil {
		return client{}, storeUnavailable("check client keys", err)
	}
	switch {
	case ever:
		return client{}, unauthorized("send a relay client key: Authorization: Bearer crk_...")
	case forwarded:
		return client{}, nil
	case !isLoopback(r.RemoteAddr):
		return client{}, unauthorized("no client keys are defined: this relay serves loopback clients only; create a key (codex-relay keys create) to serve others")
	}
	if why := browserMade(r); why != "" {
		return client{}, refuse(http.StatusForbidden, "browser_request_refused",
			"this relay serves keyless loopback clients, not web pages ("+why+"); create a client key to serve browsers")
	}
	return client{}, nil
}

const msgKeyRejected = "this relay client key is unknown, revoked or expired"

// limitKeyFailures counts a refusal of a wrong client key (errKeyRejected)
// against the client's address, the connection's peer as for every limit.
// Once the address has no attempt left, a wrong key is answered 429 with
// Retry-After instead of 401: a client stuck on one is told to back off.
// A valid key is never counted nor refused here (so every key is still
// looked up): client keys are 32 random base62 characters (190 bits), which
// no rate of guessing finds, and a limit that refused them would let anyone
// lock out every client behind a shared address (a NAT, the reverse proxy
// of deploy/) with a wrong key every 30 s. Requests without a key are not
// attempts either. Other errors pass unchanged.
func (s *Server) limitKeyFailures(r *http.Request, err error) error {
	if !errors.Is(err, errKeyRejected) {
		return err
	}
	if ok, wait := s.keyFailures.Check(r.RemoteAddr); !ok {
		s.metrics.keyRejected.WithLabelValues("limited").Inc()
		return &keyFailuresError{wait: wait}
	}
	s.keyFailures.Take(r.RemoteAddr)
	s.metrics.keyRejected.WithLabelValues("unauthorized").Inc()
	return err
}

// keyFailuresError is a wrong client key from an address that has sent too
// many: 429 with Retry-After.
type keyFailuresError struct {
	wait time.Duration // until the address's next attempt, in whole seconds
}

func (e *keyFailuresError) Error() string { return "too many wrong client keys from this address" }

// unauthorized is a refusal for want of a usable key.
func unauthorized(msg string) error {
	return fmt.Errorf("%w: %w", errUnauthenticated, &requestError{status: http.StatusUnauthorized,
		err: apiError{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidAPIKey, Message: msg}})
}

// browserMade says why a request looks made by a web page ("" when it does
// not): an Origin other than a loopback one, a cross-site fetch, or a Host
// that is no loopback name (DNS rebinding: a page's own host name resolving
// to this machine).
func browserMade(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !loopbackHost(u.Host) {
			return "Origin " + o
		}
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "none", "same-origin":
	default:
		return "Sec-Fetch-Site " + site
	}
	if !loopbackHost(r.Host) {
		return "Host " + r.Host
	}
	return ""
}

// loopbackHost reports whether host (with or without a port) names this
// machine's loopback interface: localhost, or a loopback address.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
