package relay

import (
	"errors"
	"net/http"
	"strings"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// admitBody admits an HTTP client request and reads its body, answering
// the client itself when either fails. A refused request that says another
// replica forwarded it is read (the hop's signature covers the body) and
// admitted if the hop verifies; hopFrom names that replica.
func (s *Server) admitBody(w http.ResponseWriter, r *http.Request) (cl client, ident Identity, body []byte, hopFrom string, ok bool) {
	vouch := func() bool {
		if r.Header.Get(HeaderHop) == "" || len(s.cfg.Replica.HopKey) == 0 {
			return false
		}
		b, err := s.readRequestBody(w, r, s.cfg.MaxBodyBytes)
		if err != nil {
			return false
		}
		body, hopFrom = b, s.hopSender(r, b)
		return hopFrom != ""
	}
	if cl, ident, ok = s.admitIdentifiedOr(w, r, vouch); !ok {
		return cl, ident, nil, "", false
	}
	if body == nil {
		var err error
		if body, err = s.readRequestBody(w, r, s.cfg.MaxBodyBytes); err != nil {
			s.writeFailure(w, err)
			return cl, ident, nil, "", false
		}
		hopFrom = s.hopSender(r, body)
	}
	return cl, ident, body, hopFrom, true
}

// serveAdmitted serves an admitted and policed HTTP request: the replica
// holding its thread's lane serves it when that is another one, and
// otherwise the one attempt loop here, answering through the client stream
// answer makes of the response writer. received is the body as the client
// sent it (what a forward carries).
func (s *Server) serveAdmitted(w http.ResponseWriter, r *http.Request, sub string, cl client, ident Identity, header http.Header,
	received []byte, pol policed, hopFrom string, answer func(*sseClient, *request) clientStream) {
	req := s.newRequest("http", r.URL.Path, sub, cl, ident, header, received, pol, strings.TrimSpace(r.Header.Get(wire.HeaderTurnState)))
	req.hopFrom = hopFrom
	if s.forward(w, r, req) {
		return // served by the replica holding the thread's lane, and counted there
	}
	sc := s.newSSEClient(w)
	sc.r = req
	defer sc.done()
	s.attempts(r.Context(), req, answer(sc, req))
}

// serveResponses serves POST .../responses (and /compact) over HTTP/SSE:
// it admits the request, hands it to the replica holding its thread's lane
// when that is another one, and otherwise runs its attempts here.
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request, sub string) {
	cl, ident, body, hopFrom, ok := s.admitBody(w, r)
	if !ok {
		return
	}
	fields, err := continuity.RequestFields(body)
	if err != nil {
		s.writeFailure(w, bodyRefusal("the request body is not a valid Responses request: ", err))
		return
	}
	pol, err := cl.police(body, fields)
	if err != nil {
		s.writeFailure(w, err)
		return
	}
	if sub == "" && !fields.Stream && fields.Background {
		s.serveBackground(w, r, cl, ident, pol)
		return
	}
	header := r.Header.Clone()
	header.Del(HeaderHop)
	// A request that asks for no stream gets the JSON response object, which
	// the relay assembles from a stream: ChatGPT accounts only stream.
	document := sub == "" && !fields.Stream
	if document {
		pol.body, pol.fields.Stream = withMember(pol.body, "stream", true), true
		header.Set("Accept", "text/event-stream")
	}
	s.serveAdmitted(w, r, sub, cl, ident, header, body, pol, hopFrom, func(sc *sseClient, _ *request) clientStream {
		if document {
			return &documentClient{sse: sc}
		}
		return sc
	})
}

// bodyRefusal is the 400 for a request body continuity.RequestFields
// refused, its message after what: a member the relay decides on that is
// repeated or written as a variant of its name is ambiguous_member, the
// member in param; anything else is invalid_json.
func bodyRefusal(what string, err error) *requestError {
	msg := what + strings.TrimPrefix(err.Error(), "request body: ")
	var me *continuity.MemberError
	if errors.As(err, &me) {
		e := refuse(http.StatusBadRequest, "ambiguous_member", msg)
		e.err.Param = me.Member()
		return e
	}
	return refuse(http.StatusBadRequest, "invalid_json", msg)
}
