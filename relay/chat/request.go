// Package chat translates the Chat Completions API to the Responses API and
// back, so clients that speak Chat Completions are served by the same
// request path as Codex: Translate turns a chat request into a Responses
// request, Completion turns a finished response into a chat completion,
// and Stream turns a response's events into chat completion chunks.
//
// The package is pure: bytes in, bytes out, no I/O. What it cannot express
// in the Responses API (several choices, audio) it refuses with an *Error.
package chat

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// Request is what the relay reads of a chat request besides its
// translation.
type Request struct {
	// Model is the model asked for.
	Model string
	// Stream: the client asked for chunks (stream: true), not one JSON
	// completion.
	Stream bool
	// IncludeUsage: stream_options.include_usage asks for a usage chunk
	// before [DONE].
	IncludeUsage bool
	// PromptCacheKey and User are the client's cache hint and end-user id;
	// the relay places a chat client that sends no identity headers by them.
	PromptCacheKey string
	User           string
}

// Error is a chat request the translation refuses, with a plain message
// and the parameter at fault.
type Error struct {
	Param   string
	Message string
}

func (e *Error) Error() string { return e.Message }

func refuse(param, format string, args ...any) *Error {
	return &Error{Param: param, Message: fmt.Sprintf(format, args...)}
}

// chatMembers are the members of chatRequest, as its JSON names them.
var chatMembers = []string{"model", "messages", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
	"reasoning_effort", "max_completion_tokens", "max_tokens", "temperature", "top_p", "n", "user", "prompt_cache_key",
	"safety_identifier", "metadata", "service_tier", "response_format", "verbosity"}

// chatRequest is the part of a chat request the translation reads. Fields
// the Responses API has no counterpart for (stop, seed, logprobs,
// penalties, logit_bias) are not read: the upstream never sees them.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []message       `json:"messages"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Tools               []tool          `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	ReasoningEffort     string          `json:"reasoning_effort"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	MaxTokens           *int64          `json:"max_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	N                   *int            `json:"n"`
	User                string          `json:"user"`
	PromptCacheKey      string          `json:"prompt_cache_key"`
	SafetyIdentifier    string          `json:"safety_identifier"`
	Metadata            json.RawMessage `json:"metadata"`
	ServiceTier         string          `json:"service_tier"`
	ResponseFormat      *responseFormat `json:"response_format"`
	Verbosity           string          `json:"verbosity"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Refusal    *string         `json:"refusal"`
	ToolCalls  []toolCall      `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type tool struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	} `json:"function"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Schema      json.RawMessage `json:"schema,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	} `json:"json_schema"`
}

// part is one content part of a chat message.
type part struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL *struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"image_url"`
	File *struct {
		FileID   string `json:"file_id"`
		FileData string `json:"file_data"`
		Filename string `json:"filename"`
	} `json:"file"`
}

// responsesRequest is the Responses request a chat request becomes. It is
// always a streaming request that stores nothing: the relay assembles a
// JSON answer from the stream itself, and ChatGPT accounts only stream.
type responsesRequest struct {
	Model             string          `json:"model"`
	Instructions      string          `json:"instructions,omitempty"`
	Input             []any           `json:"input"`
	Tools             []any           `json:"tools,omitempty"`
	ToolChoice        any             `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
	Reasoning         *reasoning      `json:"reasoning,omitempty"`
	MaxOutputTokens   *int64          `json:"max_output_tokens,omitempty"`
	Temperature       *float64        `json:"temperature,omitempty"`
	TopP              *float64        `json:"top_p,omitempty"`
	Text              *textOptions    `json:"text,omitempty"`
	PromptCacheKey    string          `json:"prompt_cache_key,omitempty"`
	SafetyIdentifier  string          `json:"safety_identifier,omitempty"`
	Metadata          json.RawMessage `json:"metadata,omitempty"`
	ServiceTier       string          `json:"service_tier,omitempty"`
	Store             bool            `json:"store"`
	Stream            bool            `json:"stream"`
}

type reasoning struct {
	Effort string `json:"effort"`
}

type textOptions struct {
	Format    map[string]any `json:"format,omitempty"`
	Verbosity string         `json:"verbosity,omitempty"`
}

// Item shapes of the Responses input, in the field order the API documents.
type (
	messageItem struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []any  `json:"content"`
	}
	textPart struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	refusalPart struct {
		Type    string `json:"type"`
		Refusal string `json:"refusal"`
	}
	imagePart struct {
		Type     string `json:"type"`
		ImageURL string `json:"image_url"`
		Detail   string `json:"detail"`
	}
	filePart struct {
		Type     string `json:"type"`
		FileID   string `json:"file_id,omitempty"`
		FileData string `json:"file_data,omitempty"`
		Filename string `json:"filename,omitempty"`
	}
	functionCallItem struct {
		Type      string `json:"type"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	functionOutputItem struct {
		Type   string `json:"type"`
		CallID string `json:"call_id"`
		Output string `json:"output"`
	}
	functionTool struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	}
)

// Translate reads a Chat Completions request body and returns the
// Responses request it stands for, and what the relay needs to answer it.
// Leading system and developer messages become the instructions (later
// ones stay in place as developer messages); user, assistant and tool
// messages become input items, an assistant's tool calls function_call
// items and tool messages function_call_output items; image parts become
// input images. A request the Responses API cannot express fails with an
// *Error.
func Translate(body []byte) ([]byte, Request, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return nil, Request{}, plainDecodeError(err)
	}
	// encoding/json takes the last of a repeated member and matches a name
	// without regard to case ("Model" for model); the upstream, sent what
	// the relay read, cannot disagree, but the client may have meant the
	// other one: such a body is refused, its member named.
	if err := continuity.CanonicalMembers(body, "", chatMembers); err != nil {
		var me *continuity.MemberError
		errors.As(err, &me)
		return nil, Request{}, refuse(me.Member(), "%s", err.Error())
	}
	req := Request{Model: cr.Model, Stream: cr.Stream != nil && *cr.Stream, PromptCacheKey: cr.PromptCacheKey, User: cr.User}
	if cr.StreamOptions != nil {
		req.IncludeUsage = cr.StreamOptions.IncludeUsage
	}
	if cr.Model == "" {
		return nil, req, refuse("model", "you must provide a model parameter")
	}
	if len(cr.Messages) == 0 {
		return nil, req, refuse("messages", "messages must hold at least one message")
	}
	if cr.N != nil && *cr.N != 1 {
		return nil, req, refuse("n", "only one choice can be generated per request (n must be 1)")
	}
	out := responsesRequest{Model: cr.Model, Input: []any{}, ParallelToolCalls: cr.ParallelToolCalls,
		Temperature: cr.Temperature, TopP: cr.TopP, PromptCacheKey: cr.PromptCacheKey,
		SafetyIdentifier: cr.SafetyIdentifier, ServiceTier: cr.ServiceTier, Stream: true}
	if len(cr.Metadata) > 0 && !bytes.Equal(cr.Metadata, []byte("null")) {
		out.Metadata = cr.Metadata
	}
	if cr.ReasoningEffort != "" {
		out.Reasoning = &reasoning{Effort: cr.ReasoningEffort}
	}
	switch {
	case cr.MaxCompletionTokens != nil:
		out.MaxOutputTokens = cr.MaxCompletionTokens
	case cr.MaxTokens != nil:
		out.MaxOutputTokens = cr.MaxTokens
	}
	var instructions []string
	leading := true
	for i, m := range cr.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "developer":
			text, err := plainText(m.Content, param+".content")
			if err != nil {
				return nil, req, err
			}
			if leading {
				instructions = append(instructions, text)
				continue
			}
			out.Input = append(out.Input, messageItem{Type: "message", Role: "developer", Content: []any{textPart{"input_text", text}}})
		case "user":
			leading = false
			content, err := userContent(m.Content, param+".content")
			if err != nil {
				return nil, req, err
			}
			out.Input = append(out.Input, messageItem{Type: "message", Role: "user", Content: content})
		case "assistant":
			leading = false
			content, err := assistantContent(m, param)
			if err != nil {
				return nil, req, err
			}
			if len(content) > 0 {
				out.Input = append(out.Input, messageItem{Type: "message", Role: "assistant", Content: content})
			}
			for j, tc := range m.ToolCalls {
				if tc.ID == "" || tc.Function.Name == "" {
					return nil, req, refuse(fmt.Sprintf("%s.tool_calls[%d]", param, j), "a tool call needs an id and a function name")
				}
				out.Input = append(out.Input, functionCallItem{Type: "function_call", CallID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
			}
		case "tool":
			leading = false
			if m.ToolCallID == "" {
				return nil, req, refuse(param+".tool_call_id", "a tool message needs the tool_call_id of the call it answers")
			}
			text, err := plainText(m.Content, param+".content")
			if err != nil {
				return nil, req, err
			}
			out.Input = append(out.Input, functionOutputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: text})
		case "function":
			return nil, req, refuse(param+".role", "the function role is not supported: send tool messages with a tool_call_id")
		case "":
			return nil, req, refuse(param+".role", "each message needs a role")
		default:
			return nil, req, refuse(param+".role", "unknown message role %q: use system, developer, user, assistant or tool", m.Role)
		}
	}
	out.Instructions = strings.Join(instructions, "\n\n")
	for i, t := range cr.Tools {
		if t.Type != "function" || t.Function == nil || t.Function.Name == "" {
			return nil, req, refuse(fmt.Sprintf("tools[%d]", i), "only function tools with a name are supported")
		}
		f := t.Function
		out.Tools = append(out.Tools, functionTool{Type: "function", Name: f.Name, Description: f.Description, Parameters: f.Parameters, Strict: f.Strict})
	}
	choice, err := toolChoice(cr.ToolChoice)
	if err != nil {
		return nil, req, err
	}
	out.ToolChoice = choice
	text, err := textFormat(cr.ResponseFormat, cr.Verbosity)
	if err != nil {
		return nil, req, err
	}
	out.Text = text
	b, err := marshal(out)
	if err != nil {
		return nil, req, err
	}
	return b, req, nil
}

// marshal encodes v without escaping HTML characters: prompts keep their
// bytes.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// contentParts reads a message's content: a string (one text part), an
// array of parts, or null (no parts).
func contentParts(raw json.RawMessage, param string) ([]part, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, refuse(param, "%s is not a valid string", param)
		}
		return []part{{Type: "text", Text: s}}, nil
	case raw[0] == '[':
		var parts []part
		if err := json.Unmarshal(raw, &parts); err != nil {
			return nil, refuse(param, "%s must be a string or an array of content parts", param)
		}
		return parts, nil
	}
	return nil, refuse(param, "%s must be a string or an array of content parts", param)
}

// plainText is a message's content as one text (system, developer and
// tool messages take text parts only).
func plainText(raw json.RawMessage, param string) (string, error) {
	parts, err := contentParts(raw, param)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" {
			return "", refuse(fmt.Sprintf("%s[%d]", param, i), "this message takes text parts only, not %q", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func userContent(raw json.RawMessage, param string) ([]any, error) {
	parts, err := contentParts(raw, param)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(parts))
	for i, p := range parts {
		at := fmt.Sprintf("%s[%d]", param, i)
		switch p.Type {
		case "text":
			out = append(out, textPart{"input_text", p.Text})
		case "image_url":
			if p.ImageURL == nil || p.ImageURL.URL == "" {
				return nil, refuse(at+".image_url", "an image_url part needs a url")
			}
			out = append(out, imagePart{Type: "input_image", ImageURL: p.ImageURL.URL, Detail: cmp.Or(p.ImageURL.Detail, "auto")})
		case "file":
			if p.File == nil || (p.File.FileID == "" && p.File.FileData == "") {
				return nil, refuse(at+".file", "a file part needs a file_id or file_data")
			}
			out = append(out, filePart{Type: "input_file", FileID: p.File.FileID, FileData: p.File.FileData, Filename: p.File.Filename})
		case "input_audio":
			return nil, refuse(at, "audio input is not supported")
		default:
			return nil, refuse(at+".type", "unknown content part type %q", p.Type)
		}
	}
	return out, nil
}

func assistantContent(m message, param string) ([]any, error) {
	parts, err := contentParts(m.Content, param+".content")
	if err != nil {
		return nil, err
	}
	var out []any
	for i, p := range parts {
		switch p.Type {
		case "text":
			if p.Text != "" {
				out = append(out, textPart{"output_text", p.Text})
			}
		case "refusal":
			out = append(out, refusalPart{"refusal", p.Refusal})
		default:
			return nil, refuse(fmt.Sprintf("%s.content[%d].type", param, i), "an assistant message takes text and refusal parts only, not %q", p.Type)
		}
	}
	if m.Refusal != nil && *m.Refusal != "" {
		out = append(out, refusalPart{"refusal", *m.Refusal})
	}
	return out, nil
}

// toolChoice maps tool_choice: "auto", "none" and "required" as they are,
// a named function to the Responses form {"type":"function","name":...}.
func toolChoice(raw json.RawMessage) (any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto", "none", "required":
			return mode, nil
		}
		return nil, refuse("tool_choice", "tool_choice must be auto, none, required or a named function")
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) != nil || named.Type != "function" || named.Function.Name == "" {
		return nil, refuse("tool_choice", "tool_choice must be auto, none, required or a named function")
	}
	return map[string]string{"type": "function", "name": named.Function.Name}, nil
}

// textFormat maps response_format and verbosity to the Responses text
// options.
func textFormat(rf *responseFormat, verbosity string) (*textOptions, error) {
	t := &textOptions{Verbosity: verbosity}
	if rf != nil {
		switch rf.Type {
		case "text", "json_object":
			t.Format = map[string]any{"type": rf.Type}
		case "json_schema":
			s := rf.JSONSchema
			if s == nil || s.Name == "" {
				return nil, refuse("response_format.json_schema", "a json_schema response format needs a json_schema with a name")
			}
			f := map[string]any{"type": "json_schema", "name": s.Name}
			if s.Description != "" {
				f["description"] = s.Description
			}
			if len(s.Schema) > 0 {
				f["schema"] = s.Schema
			}
			if s.Strict != nil {
				f["strict"] = *s.Strict
			}
			t.Format = f
		default:
			return nil, refuse("response_format.type", "unknown response format %q", rf.Type)
		}
	}
	if t.Format == nil && t.Verbosity == "" {
		return nil, nil
	}
	return t, nil
}

// plainDecodeError turns a JSON decoding error into a sentence a client
// reads: the field and the JSON type it must have, never a Go type.
func plainDecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return refuse("", "the request body is not valid JSON")
	}
	if te.Field == "" {
		return refuse("", "the request body must be a JSON object, not %s", te.Value)
	}
	want := wire.JSONTypeName(te.Type)
	return refuse(te.Field, "invalid type for '%s': expected %s, got %s", te.Field, want, te.Value)
}
