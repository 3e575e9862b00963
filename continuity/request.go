package continuity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Fields are the parts of a Responses request body that continuity and
// routing decide on. RequestFields reads them; the body itself stays the
// thing that is forwarded.
type Fields struct {
	// Model is the requested model; "" when absent.
	Model string
	// PreviousResponseID chains the request to an earlier response; "" when
	// absent or null.
	PreviousResponseID string
	// Conversation reports a non-null "conversation": the upstream holds the
	// history, so the request cannot move to an account that lacks it.
	Conversation bool
	// Generate is nil when absent or null; false marks a WebSocket prewarm.
	Generate *bool
	// Stream is the "stream" flag; false when absent or null.
	Stream bool
	// Input holds the input items. A string input is given as the one user
	// message item it stands for (see InputString); a missing or null input
	// is nil. The items are copies: they do not alias the body.
	Input []json.RawMessage
	// InputString reports that "input" was a JSON string, turned into
	// {"type":"message","role":"user","content":[{"type":"input_text","text":...}]}.
	InputString bool
	// PromptCacheKey is the client's prompt_cache_key, a cache hint
	// forwarded unchanged; "" when absent.
	PromptCacheKey string
	// Store and Background are "store": true and "background": true: the
	// upstream keeps the response, to be read later (background implies
	// it), and a background one runs apart from its request.
	Store, Background bool
}

// Stored reports a request whose response the upstream keeps.
func (f Fields) Stored() bool { return f.Store || f.Background }

// RequestFields reads the fields of a Responses request body (a JSON object).
// Keys match exactly, as the upstream matches them; a member the relay
// decides on that repeats, or comes as a variant of its name, is refused
// (CanonicalMembers), so the relay and the upstream cannot read the body
// differently. It fails on malformed JSON, on a body that is not an
// object, and on a known field of the wrong type (the upstream would refuse
// the request too). Unknown fields are ignored.
func RequestFields(body []byte) (Fields, error) {
	var f Fields
	if !json.Valid(body) {
		return f, errors.New("request body: invalid JSON")
	}
	var input []byte
	var err error
	setErr := func(e error) {
		if err == nil {
			err = e
		}
	}
	canon := canonical{names: decidedMembers}
	_, ok := scanObject(body, func(tok []byte, escaped bool, m member) {
		v := body[m.valStart:m.end]
		canon.see(tok, escaped)
		canon.nested(tok, escaped, v)
		switch string(keyName(tok, escaped)) {
		case "model":
			f.Model, err = optString(f.Model, "model", v, err)
		case "previous_response_id":
			f.PreviousResponseID, err = optString(f.PreviousResponseID, "previous_response_id", v, err)
		case "prompt_cache_key":
			f.PromptCacheKey, err = optString(f.PromptCacheKey, "prompt_cache_key", v, err)
		case "conversation":
			f.Conversation = !isNull(v)
		case "generate":
			switch string(v) {
			case "true", "false":
				g := string(v) == "true"
				f.Generate = &g
			case "null":
				f.Generate = nil
			default:
				setErr(errors.New("request body: generate is not a boolean"))
			}
		case "stream":
			switch string(v) {
			case "true", "false", "null":
				f.Stream = string(v) == "true"
			default:
				setErr(errors.New("request body: stream is not a boolean"))
			}
		case "store":
			f.Store = string(v) == "true"
		case "background":
			f.Background = string(v) == "true"
		case "input":
			input = v
		}
	})
	if !ok {
		return Fields{}, errors.New("request body: not a JSON object")
	}
	if canon.err != nil {
		return Fields{}, fmt.Errorf("request body: %w", canon.err)
	}
	if err != nil {
		return Fields{}, err
	}
	switch {
	case len(input) == 0 || isNull(input):
	case input[0] == '"':
		f.Input = []json.RawMessage{userMessage(input)}
		f.InputString = true
	case input[0] == '[':
		// One copy of the whole array, cut into items: two allocations
		// however many items there are.
		own := bytes.Clone(input)
		items := make([]json.RawMessage, 0, 16)
		scanArray(own, func(elem []byte) {
			items = append(items, elem[:len(elem):len(elem)])
		})
		f.Input = items
	default:
		return Fields{}, errors.New("request body: input is neither a string nor an array")
	}
	return f, nil
}

// optString decodes v, a JSON string or null, for the field name; a previous
// error wins.
func optString(cur, name string, v []byte, err error) (string, error) {
	if err != nil {
		return cur, err
	}
	if isNull(v) {
		return "", nil
	}
	s, ok := stringValue(v)
	if !ok {
		return cur, fmt.Errorf("request body: %s is not a string", name)
	}
	return s, nil
}

// userMessage returns the item a string input stands for; text is the JSON
// string token, kept byte for byte.
func userMessage(text []byte) json.RawMessage {
	const head = `{"type":"message","role":"user","content":[{"type":"input_text","text":`
	const tail = `}]}`
	out := make([]byte, 0, len(head)+len(text)+len(tail))
	out = append(out, head...)
	out = append(out, text...)
	return append(out, tail...)
}

// WithFullInput returns body with "input" set to the array of input and
// "previous_response_id" removed: the full request an upstream that never
// saw the earlier response can serve. Every other byte is kept, including
// unknown fields, key order and whitespace; a repeated "input" keeps its
// first position and loses the others; a missing one is appended. It fails
// when body is not a JSON object or an item is not valid JSON. body and input
// are not modified.
func WithFullInput(body []byte, input []json.RawMessage) ([]byte, error) {
	if !json.Valid(body) {
		return nil, errors.New("rewrite request body: invalid JSON")
	}
	size := 2
	for i, it := range input {
		if !json.Valid(it) {
			return nil, fmt.Errorf("rewrite request body: input item %d is not valid JSON", i)
		}
		size += len(it) + 1
	}
	var ms []member
	var drop []bool
	replace := -1
	closing, ok := scanObject(body, func(tok []byte, escaped bool, m member) {
		d := false
		switch string(keyName(tok, escaped)) {
		case "previous_response_id":
			d = true
		case "input":
			if replace >= 0 {
				d = true
			} else {
				replace = len(ms)
			}
		}
		ms = append(ms, m)
		drop = append(drop, d)
	})
	if !ok {
		return nil, errors.New("rewrite request body: not a JSON object")
	}
	addKey := ""
	if replace < 0 {
		addKey = "input"
	}
	writeInput := func(out []byte) []byte {
		out = append(out, '[')
		for i, it := range input {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, it...)
		}
		return append(out, ']')
	}
	return rewriteObject(body, ms, closing, drop, replace, addKey, writeInput, size+len(`,"input":`)), nil
}

// SelfContained reports whether a request stands on its own, so any account
// of any organisation could serve it from its body alone (ciphertext aside,
// which the relay weighs separately): it has no previous_response_id, no
// conversation, no tool output whose call is missing, and no file
// references.
//
// A tool output (any *_call_output item) is missing its call when no earlier
// item of the same input carries its call_id; an output with no call_id at
// all, such as Codex's goal_objective context item, answers no call and does
// not count. A file reference is an input_file or input_image item, or such
// a content part of an item's content or output, carrying a file_id: files
// live on the account that stored them.
func SelfContained(f Fields) bool {
	if f.PreviousResponseID != "" || f.Conversation {
		return false
	}
	var calls map[string]struct{}
	for _, it := range f.Input {
		var typ string
		var callID, fileID, content, output []byte
		scanObject(it, func(tok []byte, escaped bool, m member) {
			v := it[m.valStart:m.end]
			switch string(keyName(tok, escaped)) {
			case "type":
				typ = internType(v)
			case "call_id":
				callID = stringBytes(v)
			case "file_id":
				fileID = v
			case "content":
				content = v
			case "output":
				output = v
			}
		})
		if isFileType(typ) && hasValue(fileID) {
			return false
		}
		if partsReferenceFile(content) || partsReferenceFile(output) {
			return false
		}
		if len(callID) == 0 {
			continue
		}
		if isToolOutput(typ) {
			if _, ok := calls[string(callID)]; !ok {
				return false
			}
			continue
		}
		if calls == nil {
			calls = make(map[string]struct{})
		}
		calls[string(callID)] = struct{}{}
	}
	return true
}

func isFileType(typ string) bool { return typ == typeInputFile || typ == typeInputImage }

// partsReferenceFile reports whether v, a list of content parts, holds an
// input_file or input_image part with a file_id.
func partsReferenceFile(v []byte) bool {
	if len(v) == 0 || v[0] != '[' || !mayHold(v, "file_id") {
		return false
	}
	found := false
	scanArray(v, func(part []byte) {
		if found {
			return
		}
		var typ string
		var fileID []byte
		scanObject(part, func(tok []byte, escaped bool, m member) {
			switch string(keyName(tok, escaped)) {
			case "type":
				typ = internType(part[m.valStart:m.end])
			case "file_id":
				fileID = part[m.valStart:m.end]
			}
		})
		found = isFileType(typ) && hasValue(fileID)
	})
	return found
}
