package chat

import (
	"cmp"
	"encoding/json"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// DoneMarker is the payload of the SSE event that ends a chat stream.
const DoneMarker = "[DONE]"

// Stream turns one response's Responses events into chat completion
// chunks: a first chunk with the assistant role, one chunk per text delta,
// tool call chunks (the call's index, id and name, then argument deltas), a
// last chunk with the finish reason, a usage chunk when the client asked
// for one, and then the stream is done. A failure ends it with a chunk
// carrying an error object. Not safe for concurrent use.
type Stream struct {
	meta         Meta
	includeUsage bool
	started      bool
	done         bool
	// calls are the function calls under way, by output index; text
	// holds the output indexes of messages whose text streamed as deltas.
	calls map[int]*callState
	text  map[int]bool
	next  int // the next tool call index
}

type callState struct {
	index    int
	streamed bool // argument deltas were sent
}

// NewStream starts the chunks of one answer.
func NewStream(m Meta, includeUsage bool) *Stream {
	return &Stream{meta: m, includeUsage: includeUsage, calls: map[int]*callState{}, text: map[int]bool{}}
}

// Done reports whether the stream has ended (a terminal event was read).
func (s *Stream) Done() bool { return s.done }

type chunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	Choices           []chunkChoice `json:"choices"`
	Usage             *Usage        `json:"usage,omitempty"`
	Error             *ErrorObject  `json:"error,omitempty"`
	SystemFingerprint any           `json:"system_fingerprint"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type delta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	Refusal   *string         `json:"refusal,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

type toolCallDelta struct {
	Index    int            `json:"index"`
	ID       string         `json:"id,omitempty"`
	Type     string         `json:"type,omitempty"`
	Function *functionDelta `json:"function,omitempty"`
}

type functionDelta struct {
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

// ErrorObject is an error in the OpenAI shape: every key present, code and
// param null when there are none.
type ErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// NewErrorObject builds the OpenAI error object for e.
func NewErrorObject(e wire.Error) *ErrorObject {
	o := &ErrorObject{Message: e.Message, Type: cmp.Or(e.Type, wire.TypeServerError)}
	if e.Param != "" {
		o.Param = &e.Param
	}
	if e.Code != "" {
		o.Code = &e.Code
	}
	return o
}

func (s *Stream) chunk(d delta, finish *string) chunk {
	return chunk{ID: s.meta.ID, Object: "chat.completion.chunk", Created: s.meta.Created, Model: s.meta.Model,
		Choices: []chunkChoice{{Delta: d, FinishReason: finish}}}
}

// Event translates one Responses event into the chunks it stands for
// (none, for events a chat client has no use for), each a JSON payload for
// one SSE data line. After a terminal event the stream is done and every
// further event is ignored.
func (s *Stream) Event(typ string, data []byte) [][]byte {
	if s.done {
		return nil
	}
	var out [][]byte
	emit := func(c chunk) { out = append(out, mustMarshal(c)) }
	switch typ {
	case wire.EventResponseCreated, wire.EventResponseInProgress:
		var env struct {
			Response struct {
				Model string `json:"model"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &env) == nil && env.Response.Model != "" && !s.started {
			s.meta.Model = env.Response.Model
		}
		return nil
	case wire.EventResponseMetadata, wire.EventRateLimits:
		return nil
	}
	if !s.started && !wire.IsTerminal(typ) {
		s.started = true
		empty := ""
		emit(s.chunk(delta{Role: "assistant", Content: &empty}, nil))
	}
	var ev struct {
		OutputIndex int             `json:"output_index"`
		Delta       string          `json:"delta"`
		Item        json.RawMessage `json:"item"`
		Response    json.RawMessage `json:"response"`
	}
	_ = json.Unmarshal(data, &ev)
	switch typ {
	case wire.EventOutputTextDelta:
		s.text[ev.OutputIndex] = true
		if ev.Delta != "" {
			d := ev.Delta
			emit(s.chunk(delta{Content: &d}, nil))
		}
	case "response.refusal.delta":
		s.text[ev.OutputIndex] = true
		d := ev.Delta
		emit(s.chunk(delta{Refusal: &d}, nil))
	case wire.EventOutputItemAdded, wire.EventOutputItemDone:
		var it outputItem
		if json.Unmarshal(ev.Item, &it) != nil {
			break
		}
		switch it.Type {
		case "function_call":
			c, known := s.calls[ev.OutputIndex]
			if !known {
				c = &callState{index: s.next}
				s.next++
				s.calls[ev.OutputIndex] = c
				emptyArgs := ""
				emit(s.chunk(delta{ToolCalls: []toolCallDelta{{Index: c.index, ID: it.CallID, Type: "function",
					Function: &functionDelta{Name: it.Name, Arguments: &emptyArgs}}}}, nil))
			}
			if typ == wire.EventOutputItemDone && !c.streamed && it.Arguments != "" {
				// The upstream sent the arguments whole, with the item.
				c.streamed = true
				args := it.Arguments
				emit(s.chunk(delta{ToolCalls: []toolCallDelta{{Index: c.index, Function: &functionDelta{Arguments: &args}}}}, nil))
			}
		case "message":
			if typ == wire.EventOutputItemDone && !s.text[ev.OutputIndex] {
				// The upstream sent the text whole, with the item.
				for _, c := range it.Content {
					switch {
					case c.Type == "output_text" && c.Text != "":
						t := c.Text
						emit(s.chunk(delta{Content: &t}, nil))
					case c.Type == "refusal" && c.Refusal != "":
						r := c.Refusal
						emit(s.chunk(delta{Refusal: &r}, nil))
					}
				}
			}
		}
	case wire.EventFunctionCallArgumentsDelta:
		if c, ok := s.calls[ev.OutputIndex]; ok && ev.Delta != "" {
			c.streamed = true
			d := ev.Delta
			emit(s.chunk(delta{ToolCalls: []toolCallDelta{{Index: c.index, Function: &functionDelta{Arguments: &d}}}}, nil))
		}
	case wire.EventResponseCompleted, wire.EventResponseIncomplete:
		s.done = true
		var r response
		_ = json.Unmarshal(ev.Response, &r)
		if typ == wire.EventResponseIncomplete && r.Status == "" {
			r.Status = "incomplete"
		}
		reason := finishReason(r, len(s.calls) > 0)
		if !s.started {
			s.started = true
			empty := ""
			emit(s.chunk(delta{Role: "assistant", Content: &empty}, nil))
		}
		emit(s.chunk(delta{}, &reason))
		if s.includeUsage {
			if u := chatUsage(r.Usage); u != nil {
				c := s.chunk(delta{}, nil)
				c.Choices, c.Usage = []chunkChoice{}, u
				emit(c)
			}
		}
	case wire.EventResponseFailed, wire.EventError:
		s.done = true
		out = append(out, s.ErrorChunk(FailureOf(typ, data)))
	}
	return out
}

// ErrorChunk is the chunk that ends a stream with an error: no choices, an
// error object as the OpenAI SDKs read it.
func (s *Stream) ErrorChunk(e wire.Error) []byte {
	s.done = true
	c := s.chunk(delta{}, nil)
	c.Choices, c.Error = []chunkChoice{}, NewErrorObject(e)
	return mustMarshal(c)
}

// FailureOf reads the error a response.failed or error event carries.
func FailureOf(typ string, data []byte) wire.Error {
	if typ == wire.EventError {
		if ev, ok := wire.ParseErrorEvent(data); ok {
			return ev.Error
		}
	} else {
		var env struct {
			Response struct {
				Error *wire.Error `json:"error"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &env) == nil && env.Response.Error != nil && env.Response.Error.Message != "" {
			return *env.Response.Error
		}
	}
	return wire.Error{Type: wire.TypeServerError, Code: "upstream_failed", Message: "the upstream failed the response"}
}

func mustMarshal(v any) []byte {
	b, err := marshal(v)
	if err != nil {
		panic("chat: " + err.Error()) // only fixed shapes are encoded
	}
	return b
}
