package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// responseRequest is the part of a Responses request body the sim reads. The
// rest (reasoning, text, include, ...) is accepted and ignored, as unknown
// fields must be.
type responseRequest struct {
	Type               string                     `json:"type"` // "response.create" over WebSocket
	Model              string                     `json:"model"`
	Input              inputList                  `json:"input"`
	Tools              []toolSpec                 `json:"tools"`
	PreviousResponseID string                     `json:"previous_response_id"`
	PromptCacheKey     string                     `json:"prompt_cache_key"`
	Generate           *bool                      `json:"generate"`
	ClientMetadata     map[string]json.RawMessage `json:"client_metadata"`
	Instructions       string                     `json:"instructions"`
	ServiceTier        string                     `json:"service_tier"`
	Stream             bool                       `json:"stream"`
	// StreamSet is true when the body named stream at all: an explicit
	// "stream": false is answered with JSON, a body without stream with
	// SSE (the sim's leniency; Codex always sends stream:true).
	StreamSet  bool  `json:"-"`
	Store      *bool `json:"store"`
	Background bool  `json:"background"`
	Reasoning  *struct {
		Effort string `json:"effort"`
	} `json:"reasoning"`

	inputBytes int // size of the raw input array, for token estimates
	// rawInput is the input as items in their JSON form (a string input
	// as one user message), which a stored response keeps.
	rawInput []json.RawMessage
	// fileIDs are the file ids the input's content parts refer to.
	fileIDs []string
}

// stores reports whether the response is to be kept: store:true, or
// background:true without store:false. A body without store is not stored
// (OpenAI's default is true, but Codex always sends store, and the sim's
// default keeps previous_response_id unknown over HTTP, as it was).
func (r *responseRequest) stores() bool {
	if r.Store != nil {
		return *r.Store
	}
	return r.Background
}

// inputItem is one item of a request's input, with the fields any item type
// the sim looks at may carry.
type inputItem struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Arguments        string          `json:"arguments"`
	Input            string          `json:"input"`
	Output           json.RawMessage `json:"output"`
	EncryptedContent *string         `json:"encrypted_content"`
}

// inputList is a request's input: an array of items, or a string, which
// the Responses API takes as one user message with that text. A message
// may come without its type, and with a string content.
type inputList []inputItem

func (l *inputList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var text string
		if err := json.Unmarshal(b, &text); err != nil {
			return err
		}
		content, _ := json.Marshal(text) // a string content, as the API accepts it
		*l = inputList{{Type: "message", Role: "user", Content: content}}
		return nil
	}
	if len(b) > 0 && b[0] != '[' && string(b) != "null" {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[inputList]()}
	}
	var items []inputItem
	if err := json.Unmarshal(b, &items); err != nil {
		return err
	}
	for i := range items {
		if items[i].Type == "" && items[i].Role != "" {
			items[i].Type = "message" // {"role","content"}: the API's short message form
		}
	}
	*l = items
	return nil
}

// jsonKind names the JSON type of the value b starts with.
func jsonKind(b []byte) string {
	switch b[0] {
	case '{':
		return "object"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	case '"':
		return "string"
	}
	return "number"
}

// toolSpec is one entry of a request's tools: its type ("function",
// "custom", "web_search", "namespace", ...) and name, and for a namespace
// the tools in it (Codex's image_gen namespace holds function imagegen).
type toolSpec struct {
	Type  string     `json:"type"`
	Name  string     `json:"name"`
	Tools []toolSpec `json:"tools,omitempty"`
}

// generates reports whether the request asks for output: generate:false is a
// WebSocket prewarm.
func (r *responseRequest) generates() bool { return r.Generate == nil || *r.Generate }

// clientTurnState returns client_metadata["x-codex-turn-state"], which Codex
// sends over WebSocket on every request of a turn after the first.
func (r *responseRequest) clientTurnState() string {
	return metadataString(r.ClientMetadata, "x-codex-turn-state")
}

// metadataString returns the string value of key in client metadata, or "".
func metadataString(md map[string]json.RawMessage, key string) string {
	var s string
	if v, ok := md[key]; ok && json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

// requestKind returns request_kind of an x-codex-turn-metadata JSON value,
// or "" when there is none.
func requestKind(turnMetadata string) string {
	if turnMetadata == "" {
		return ""
	}
	var md struct {
		RequestKind string `json:"request_kind"`
	}
	_ = json.Unmarshal([]byte(turnMetadata), &md)
	return md.RequestKind
}

// parseResponseRequest decodes a request body. Its errors are plain
// sentences, as the API's are: they name the field, never a Go type.
func parseResponseRequest(body []byte) (*responseRequest, error) {
	var req responseRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, plainDecodeError(err)
	}
	var raw struct {
		Input  json.RawMessage `json:"input"`
		Stream json.RawMessage `json:"stream"`
	}
	_ = json.Unmarshal(body, &raw)
	req.inputBytes = len(raw.Input)
	req.StreamSet = raw.Stream != nil && string(raw.Stream) != "null"
	req.rawInput, req.fileIDs = rawItems(raw.Input)
	return &req, nil
}

// rawItems returns the items of a request's input in their JSON form (a
// string input as one user message), and the file ids their content parts
// (input_file, input_image) name.
func rawItems(input json.RawMessage) ([]json.RawMessage, []string) {
	input = bytes.TrimSpace(input)
	if len(input) > 0 && input[0] == '"' {
		var text string
		_ = json.Unmarshal(input, &text)
		m, _ := json.Marshal(object{"type": "message", "role": "user",
			"content": []any{object{"type": "input_text", "text": text}}})
		return []json.RawMessage{m}, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(input, &items) != nil {
		return nil, nil
	}
	var ids []string
	for _, it := range items {
		var item struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(it, &item) != nil {
			continue
		}
		var parts []struct {
			Type   string `json:"type"`
			FileID string `json:"file_id"`
		}
		if json.Unmarshal(item.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if (p.Type == "input_file" || p.Type == "input_image") && p.FileID != "" {
				ids = append(ids, p.FileID)
			}
		}
	}
	return items, ids
}

// plainDecodeError turns a JSON decoding error into the sentence a client
// reads: a field of the wrong type is named with the JSON type it should
// have, anything else is invalid JSON.
func plainDecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := wire.JSONTypeName(te.Type)
		if te.Type == reflect.TypeFor[inputList]() {
			want = "a string or an array of items"
		}
		field := te.Field
		if field == "" {
			return fmt.Errorf("the request body must be a JSON object, not %s", te.Value)
		}
		return fmt.Errorf("invalid type for '%s': expected %s, got %s", field, want, te.Value)
	}
	return errors.New("the request body is not valid JSON")
}

// text returns the concatenated text parts of a message item's content,
// which is either a string or a list of parts with "text" fields.
func (it *inputItem) text() string {
	return contentText(it.Content)
}

// outputText returns a tool output's text: a string, or a list of content
// parts with "text" fields, where each input_image part (the picture Codex's
// image tool hands back) shows as "[input_image]", so a test sees that the
// image reached the model.
func (it *inputItem) outputText() string {
	text := contentText(it.Output)
	var parts []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(it.Output, &parts) == nil {
		for _, p := range parts {
			if p.Type == "input_image" {
				text += "\n[input_image]"
			}
		}
	}
	return text
}

func contentText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 && p.Text != "" && b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(p.Text)
	}
	return b.String()
}

// errBodyTooLarge reports a body past Config.MaxBodyBytes.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads a request body up to max bytes after decoding its
// Content-Encoding (identity or zstd).
func readBody(r *http.Request, max int64) ([]byte, error) {
	var src io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "zstd":
		dec, err := zstd.NewReader(r.Body, zstd.WithDecoderMaxMemory(uint64(max)), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		defer dec.Close()
		src = dec
	default:
		return nil, fmt.Errorf("unsupported Content-Encoding %q", enc)
	}
	b, err := io.ReadAll(io.LimitReader(src, max+1))
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
		return nil, errBodyTooLarge
	}
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(b)) > max {
		return nil, errBodyTooLarge
	}
	return b, nil
}
