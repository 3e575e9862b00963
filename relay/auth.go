package relay

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/codexrelay/codex-relay/relay/store"
)

// client is an authenticated caller.
type client struct {
	key   store.ClientKey // zero for a keyless loopback client
	keyed bool
}

// scope is the client key scope bindings and continuity are kept under.
func (c client) scope() string { return c.key.ID }

func (c client) allowsModel(model string) bool {
	if len(c.key.Models) == 0 || model == "" {
		return true
	}
	for _, m := range c.key.Models {
		if m == model {
			return true
		}
	}
	return false
}

var errUnauthenticated = errors.New("unauthenticated")

// admit authenticates r and answers the client itself when that fails.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (client, bool) {
	cl, ans, err := s.authenticate(r.Context(), r, false)
	if err != nil {
		writeError(w, ans.Status, ans.Err)
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
	cl, ans, err := s.authenticate(r.Context(), r, false)
	if errors.Is(err, errUnauthenticated) && forwarded != nil && forwarded() {
		cl, ans, err = s.authenticate(r.Context(), r, true)
	}
	if err != nil {
		writeError(w, ans.Status, ans.Err)
		return client{}, Identity{}, false
	}
	ident, err := ParseIdentity(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "invalid_header", Message: err.Error()})
		return client{}, Identity{}, false
	}
	return cl, ident, true
}

// authenticate admits a request bearing a usable relay client key; with no
// key defined at all, it admits loopback clients without one (and requests
// another replica admitted so and forwarded). The key itself is never
// forwarded upstream.
func (s *Server) authenticate(ctx context.Context, r *http.Request, forwarded bool) (client, answer, error) {
	token := ""
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		token = strings.TrimSpace(h[7:])
	}
	if strings.HasPrefix(token, store.ClientKeyPrefix) {
		k, err := s.cfg.Store.AuthenticateClientKey(ctx, token)
		if err == nil {
			if err := s.cfg.Store.TouchClientKey(ctx, k.ID); err != nil {
				s.log.Warn("touch client key", "key", k.ID, "err", err)
			}
			return client{key: k, keyed: true}, answer{}, nil
		}
		if !errors.Is(err, store.ErrKeyRejected) {
			return client{}, answer{Status: http.StatusServiceUnavailable, Err: apiError{Type: "server_error", Message: "cannot check the client key now"}}, err
		}
		return client{}, unauthorized("this relay client key is unknown, revoked or expired"), errUnauthenticated
	}
	n, err := s.cfg.Store.CountClientKeys(ctx)
	if err != nil {
		return client{}, answer{Status: http.StatusServiceUnavailable, Err: apiError{Type: "server_error", Message: "cannot check client keys now"}}, err
	}
	if n == 0 && (isLoopback(r.RemoteAddr) || forwarded) {
		return client{}, answer{}, nil
	}
	if n == 0 {
		return client{}, unauthorized("no client keys are defined: this relay serves loopback clients only; create a key (codex-relay keys create) to serve others"), errUnauthenticated
	}
	return client{}, unauthorized("send a relay client key: Authorization: Bearer crk_..."), errUnauthenticated
}

func unauthorized(msg string) answer {
	return answer{Status: http.StatusUnauthorized, Err: apiError{Type: "invalid_request_error", Code: "invalid_api_key", Message: msg}}
}

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
