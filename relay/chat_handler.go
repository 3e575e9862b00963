package relay

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay/chat"
)

// serveChatCompletions serves POST /v1/chat/completions: the chat request
// is translated to a Responses request (package chat) and admitted like one
// (the key, its model policy and budgets), and its answer, streamed from
// the upstream through the one attempt loop, is translated back: one chat
// completion, or chunks when the client asked for a stream.
//
// A chat client sends no thread id: its identity headers place it when it
// sends them, else its prompt_cache_key, else its user (HintIdentity);
// with none of them each request stands alone (no binding, no lane).
func (s *Server) serveChatCompletions(w http.ResponseWriter, r *http.Request) {
	cl, ident, body, hopFrom, ok := s.admitBody(w, r)
	if !ok {
		return
	}
	translated, creq, err := chat.Translate(body)
	if err != nil {
		var ce *chat.Error
		e := wire.Error{Type: wire.TypeInvalidRequest, Code: "invalid_request", Message: err.Error()}
		if errors.As(err, &ce) {
			e.Param = ce.Param
		}
		writeError(w, http.StatusBadRequest, e)
		return
	}
	ident = chatIdentity(ident, creq)
	fields, err := continuity.RequestFields(translated)
	if err != nil {
		s.writeFailure(w, refuse(http.StatusBadRequest, "invalid_request", "the request could not be translated: "+err.Error()))
		return
	}
	pol, err := cl.police(translated, fields)
	if err != nil {
		s.writeFailure(w, err)
		return
	}
	header := r.Header.Clone()
	header.Del(HeaderHop)
	header.Set("Accept", "text/event-stream") // the upstream is asked for a stream whatever the client reads
	s.serveAdmitted(w, r, "", cl, ident, header, body, pol, hopFrom, func(sc *sseClient, req *request) clientStream {
		meta := chat.Meta{ID: "chatcmpl-" + strings.TrimPrefix(req.id, "req_"), Created: req.start.Unix(), Model: creq.Model}
		if creq.Stream {
			return &chatStreamClient{sse: sc, st: chat.NewStream(meta, creq.IncludeUsage)}
		}
		return &documentClient{sse: sc, render: func(resp []byte) ([]byte, error) { return chat.Completion(meta, resp) }}
	})
}

// chatIdentity places a chat request: by its identity headers when they
// gave a key, else by its prompt_cache_key, else by its user; with none,
// the request stands alone.
func chatIdentity(id Identity, c chat.Request) Identity {
	switch {
	case id.Key != "":
		return id
	case c.PromptCacheKey != "":
		return HintIdentity("prompt_cache_key", c.PromptCacheKey)
	case c.User != "":
		return HintIdentity("user", c.User)
	}
	return id
}

// chatStreamClient answers a chat request that asked for a stream: chat
// completion chunks as SSE data lines, ended by data: [DONE]. A failure
// before any chunk is an HTTP error in the OpenAI shape; after, a chunk
// carrying the error, then [DONE].
type chatStreamClient struct {
	sse *sseClient // the connection: status, headers, deadlines, flushing
	st  *chat.Stream
}

func (c *chatStreamClient) lane(r *request) (bridge.Key, bool) { return c.sse.lane(r) }

func (c *chatStreamClient) send(h *head, typ string, data []byte) error {
	if c.st.Done() {
		return nil
	}
	if !c.sse.committed {
		h.decideTurnState(c.sse.r, c)
		c.sse.commit(h)
	}
	for _, chunk := range c.st.Event(typ, data) {
		if err := c.sse.event("", chunk); err != nil {
			return err
		}
	}
	if c.st.Done() {
		return c.sse.event("", []byte(chat.DoneMarker))
	}
	return nil
}

func (c *chatStreamClient) fail(h *head, f *failure) error {
	status, e := openAIFailure(f)
	if !c.sse.committed {
		c.sse.committed = true
		hdr := c.sse.w.Header()
		h.setHeaders(hdr)
		for k, vs := range f.header {
			if k != "Content-Type" && k != "Content-Length" {
				hdr[k] = vs
			}
		}
		writeError(c.sse.w, status, e)
		return nil
	}
	if c.st.Done() {
		return nil
	}
	// Keep-alives committed the stream: its last chunk says it.
	if err := c.sse.event("", c.st.ErrorChunk(e)); err != nil {
		return err
	}
	return c.sse.event("", []byte(chat.DoneMarker))
}

// reply streams the upstream's own document (an upstream that answered the
// stream it was asked for with the response object) as chunks.
func (c *chatStreamClient) reply(h *head, _ int, body []byte) error {
	if !json.Valid(body) {
		return c.fail(h, relayFailure(http.StatusBadGateway, wire.TypeServerError, "upstream_unexpected_answer",
			"the upstream's answer could not be read"))
	}
	for _, ev := range documentEvents(body) {
		typ, _ := wire.EventType(ev)
		if err := c.send(h, typ, ev); err != nil {
			return err
		}
	}
	return nil
}

// waiting sends an SSE comment, which the OpenAI SDKs skip, so the
// connection stays up while the relay waits for lane capacity.
func (c *chatStreamClient) waiting(h *head) { c.sse.waiting(h) }

func (c *chatStreamClient) issueTurnState() string { return newTurnState() }
