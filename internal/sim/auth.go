package sim

import (
	"net/http"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// authFailure is why a request was not authenticated.
type authFailure struct {
	status int
	err    wire.Error
}

// authenticate finds the account of r's bearer token for a route of the
// given flavour. ChatGPT routes also demand ChatGPT-Account-Id matching the
// token's account when requireAccountID is set, and a matching one whenever
// it is sent. The account is noted on ref as soon as the token is known,
// even when the request is then refused.
func (s *Server) authenticate(r *http.Request, kind Kind, requireAccountID bool, ref recordRef) (Account, *authFailure) {
	token := bearerToken(r)
	if token == "" {
		return Account{}, &authFailure{http.StatusUnauthorized, wire.Error{Type: wire.TypeInvalidRequest,
			Code: wire.CodeInvalidAPIKey, Message: "Missing bearer authentication in header."}}
	}
	s.mu.Lock()
	st, status := s.lookupTokenLocked(token)
	var acct Account
	if st != nil {
		acct = st.acct
	}
	s.mu.Unlock()
	if st != nil {
		ref.update(func(rec *Record) { rec.Account = acct.ID })
	}
	switch status {
	case tokenUnknown:
		return Account{}, &authFailure{http.StatusUnauthorized, wire.Error{Type: wire.TypeInvalidRequest,
			Code: wire.CodeInvalidAPIKey, Message: "Incorrect API key provided."}}
	case tokenExpired:
		return Account{}, &authFailure{http.StatusUnauthorized, wire.Error{Type: wire.TypeInvalidRequest,
			Code: wire.CodeTokenExpired, Message: "Provided authentication token is expired. Please try signing in again."}}
	}
	if acct.Kind != kind {
		return Account{}, &authFailure{http.StatusUnauthorized, wire.Error{Type: wire.TypeInvalidRequest,
			Code: wire.CodeInvalidAPIKey, Message: "This token is not valid for the " + string(kind) + " API."}}
	}
	if kind == KindChatGPT {
		got := r.Header.Get(wire.HeaderChatGPTAccountID)
		if got != acct.ChatGPTAccountID && (got != "" || requireAccountID) {
			return Account{}, &authFailure{http.StatusForbidden, wire.Error{Type: wire.TypeInvalidRequest,
				Code: "account_mismatch", Message: "ChatGPT-Account-Id does not match the token's account."}}
		}
	}
	return acct, nil
}
