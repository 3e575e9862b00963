package relay

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay/chat"
)

// OpenAI clients other than Codex (the SDKs, tools that speak Chat
// Completions) read one JSON document where Codex reads a stream. The
// relay always streams from the upstream (ChatGPT accounts only stream) and
// assembles the document itself: documentClient is the clientStream that
// does it, for the Responses route and for Chat Completions alike.

// responseCollector assembles a response object from its events: the
// terminal event's response, with the output items of the stream when the
// upstream's terminal event lists none (the ChatGPT backend's does not).
type responseCollector struct {
	items    []json.RawMessage // output_item.done items, in order
	final    json.RawMessage   // the terminal event's response object
	terminal string            // the terminal event's type ("" none yet)
}

// observe takes one event; only output items and terminal events count.
func (c *responseCollector) observe(typ string, data []byte) {
	switch typ {
	case wire.EventOutputItemDone:
		var env struct {
			Item json.RawMessage `json:"item"`
		}
		if json.Unmarshal(data, &env) == nil && len(env.Item) > 0 {
			c.items = append(c.items, bytes.Clone(env.Item))
		}
	case wire.EventResponseCompleted, wire.EventResponseIncomplete, wire.EventResponseFailed:
		var env struct {
			Response json.RawMessage `json:"response"`
		}
		if json.Unmarshal(data, &env) == nil {
			c.final = bytes.Clone(env.Response)
		}
		c.terminal = typ
	case wire.EventError:
		c.terminal = typ
	}
}

// response is the assembled response object.
func (c *responseCollector) response() []byte {
	var obj map[string]json.RawMessage
	if json.Unmarshal(c.final, &obj) != nil || obj == nil {
		obj = map[string]json.RawMessage{"object": json.RawMessage(`"response"`)}
	}
	var out []json.RawMessage
	if json.Unmarshal(obj["output"], &out) != nil || len(out) == 0 {
		items := c.items
		if items == nil {
			items = []json.RawMessage{}
		}
		obj["output"] = encodeKeepingBytes(items)
	}
	return encodeKeepingBytes(obj)
}

// documentClient answers an HTTP request that asked for no stream: it
// collects the upstream's events and writes one JSON document when the
// response ends (the response object, or what render makes of it), or an
// OpenAI error. It writes nothing before then, so keep-alives are not
// sent: a client that asked for a document waits for it.
type documentClient struct {
	sse *sseClient // the connection: its lane choice and write deadline
	// render turns the response object into the document; nil: the object
	// itself.
	render  func(resp []byte) ([]byte, error)
	col     responseCollector
	started bool
}

func (c *documentClient) lane(r *request) (bridge.Key, bool) { return c.sse.lane(r) }

func (c *documentClient) send(h *head, typ string, data []byte) error {
	if !c.started {
		c.started = true
		h.decideTurnState(c.sse.r, c)
	}
	if c.sse.committed {
		return nil
	}
	c.col.observe(typ, data)
	switch c.col.terminal {
	case "":
		return nil
	case wire.EventResponseCompleted, wire.EventResponseIncomplete:
		doc := c.col.response()
		if c.render != nil {
			var err error
			if doc, err = c.render(doc); err != nil {
				c.sse.s.log.Warn("render the answer", "request", c.sse.r.id, "err", err)
				return c.fail(h, relayFailure(http.StatusBadGateway, wire.TypeServerError, "upstream_unexpected_answer",
					"the upstream's answer could not be read"))
			}
		}
		return c.write(h, http.StatusOK, nil, doc)
	}
	e, status := chat.FailureOf(typ, data), 0
	if ev, ok := wire.ParseErrorEvent(data); ok {
		status = ev.Status
	}
	return c.write(h, statusForError(e, status), nil, openAIErrorJSON(e))
}

func (c *documentClient) fail(h *head, f *failure) error {
	if c.sse.committed {
		return nil
	}
	status, e := openAIFailure(f)
	return c.write(h, status, f.header, openAIErrorJSON(e))
}

// write answers with one JSON document, once.
func (c *documentClient) write(h *head, status int, extra http.Header, doc []byte) error {
	hdr := c.sse.w.Header()
	h.setHeaders(hdr)
	for k, vs := range extra {
		if k != "Content-Type" && k != "Content-Length" {
			hdr[k] = vs
		}
	}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(doc)))
	c.sse.committed = true
	c.sse.armDeadline()
	c.sse.w.WriteHeader(status)
	_, err := c.sse.w.Write(doc)
	return err
}

// reply answers with the upstream's own document (an upstream that
// answered the stream it was asked for with the response object).
func (c *documentClient) reply(h *head, status int, body []byte) error {
	if c.render != nil {
		var err error
		if body, err = c.render(body); err != nil {
			return c.fail(h, relayFailure(http.StatusBadGateway, wire.TypeServerError, "upstream_unexpected_answer",
				"the upstream's answer could not be read"))
		}
	}
	return c.write(h, status, nil, body)
}

// documentEvents are the events a response object stands for: each output
// item done, then the response completed.
func documentEvents(doc []byte) [][]byte {
	var r struct {
		Output []json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(doc, &r)
	out := make([][]byte, 0, len(r.Output)+1)
	for i, it := range r.Output {
		out = append(out, mustJSON(map[string]any{"type": wire.EventOutputItemDone, "output_index": i, "item": it}))
	}
	return append(out, mustJSON(map[string]any{"type": wire.EventResponseCompleted, "response": json.RawMessage(doc)}))
}

func (c *documentClient) waiting(*head) {}

func (c *documentClient) issueTurnState() string { return newTurnState() }

// openAIFailure is a failure as an OpenAI client reads it: its status and
// an error object with a plain message. An upstream's error body that is
// not in the OpenAI shape gives its "detail", or a sentence of the relay's.
func openAIFailure(f *failure) (int, wire.Error) {
	e := f.err
	if f.body != nil {
		if parsed, ok := wire.ParseErrorBody(f.body); ok {
			e = parsed
		} else {
			var d struct {
				Detail string `json:"detail"`
			}
			if json.Unmarshal(f.body, &d) == nil && d.Detail != "" {
				e.Message = d.Detail
			} else {
				e.Message = "the upstream answered " + strconv.Itoa(f.status) + " " + http.StatusText(f.status)
			}
		}
	}
	if e.Message == "" {
		e.Message = "the upstream failed the request"
	}
	if e.Type == "" {
		e.Type = wire.TypeServerError
		if f.status >= 400 && f.status < 500 {
			e.Type = wire.TypeInvalidRequest
		}
	}
	return statusForError(e, f.status), e
}

// statusForError is the HTTP status of an error a stream reported (an
// upstream's response.failed carries none): given when known, else by its
// code.
func statusForError(e wire.Error, given int) int {
	if given != 0 {
		return given
	}
	switch cmp.Or(e.Code, e.Type) {
	case wire.CodeRateLimitExceeded, wire.CodeInsufficientQuota, wire.TypeUsageLimitReached, wire.TypeUsageNotIncluded:
		return http.StatusTooManyRequests
	case wire.CodeContextLengthExceeded, wire.CodeInvalidEncryptedContent, wire.CodePreviousResponseNotFound, wire.TypeInvalidRequest:
		return http.StatusBadRequest
	case wire.CodeServerIsOverloaded:
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// openAIError is an HTTP error body in the OpenAI shape: message, type,
// code and param always present (null when empty), and the usage-limit
// fields Codex-aware clients read when they apply.
type openAIError struct {
	*chat.ErrorObject
	PlanType        string `json:"plan_type,omitempty"`
	ResetsAt        int64  `json:"resets_at,omitempty"`
	ResetsInSeconds int64  `json:"resets_in_seconds,omitempty"`
}

func openAIErrorJSON(e wire.Error) []byte {
	return mustJSON(map[string]openAIError{"error": {ErrorObject: chat.NewErrorObject(e),
		PlanType: e.PlanType, ResetsAt: e.ResetsAt, ResetsInSeconds: e.ResetsInSeconds}})
}
