package continuity

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Item types this package looks at. Every other type passes through as
// opaque bytes.
const (
	typeMessage        = "message"
	typeReasoning      = "reasoning"
	typeFunctionCall   = "function_call"
	typeCustomToolCall = "custom_tool_call"
	typeLocalShellCall = "local_shell_call"
	typeComputerCall   = "computer_call"
	typeInputFile      = "input_file"
	typeInputImage     = "input_image"
)

// itemInfo is what the package needs to know about one item.
type itemInfo struct {
	typ    string
	callID string
	// itemCipher: the item itself has a non-empty encrypted_content.
	itemCipher bool
	// partCipher: one of its content parts has one.
	partCipher bool
}

func (i itemInfo) cipher() bool { return i.itemCipher || i.partCipher }

// inspect reads an item's type, call_id and where it carries ciphertext.
// Values it does not need are skipped, not decoded. A malformed item yields
// what could be read before the fault; a repeated key counts by its last
// occurrence, as JSON decoders do.
func inspect(raw []byte) itemInfo {
	var info itemInfo
	var content []byte
	scanObject(raw, func(tok []byte, escaped bool, m member) {
		v := raw[m.valStart:m.end]
		switch string(keyName(tok, escaped)) {
		case "type":
			info.typ = internType(v)
		case "call_id":
			info.callID, _ = stringValue(v)
		case "encrypted_content":
			info.itemCipher = hasValue(v)
		case "content":
			content = v
		}
	})
	// Only a key spelled literally or through \u escapes can name
	// encrypted_content, so most items skip the part scan.
	if len(content) > 0 && content[0] == '[' && mayHold(content, "encrypted_content") {
		scanArray(content, func(part []byte) {
			if hasValue(partField(part, "encrypted_content")) {
				info.partCipher = true
			}
		})
	}
	return info
}

// mayHold reports whether raw may contain a key named key: it does when the
// name appears literally or when raw uses \u escapes (the only JSON escape
// that can spell a letter or an underscore).
func mayHold(raw []byte, key string) bool {
	return bytes.Contains(raw, []byte(key)) || bytes.Contains(raw, []byte(`\u`))
}

// partField returns the raw value of the last top-level member named key of
// the object obj, or nil.
func partField(obj []byte, key string) []byte {
	var v []byte
	scanObject(obj, func(tok []byte, escaped bool, m member) {
		if string(keyName(tok, escaped)) == key {
			v = obj[m.valStart:m.end]
		}
	})
	return v
}

// internType returns the string a type token holds, without allocating for
// the types Codex sends most.
func internType(v []byte) string {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 {
		switch string(v[1 : len(v)-1]) {
		case typeMessage:
			return typeMessage
		case typeReasoning:
			return typeReasoning
		case typeFunctionCall:
			return typeFunctionCall
		case "function_call_output":
			return "function_call_output"
		case typeCustomToolCall:
			return typeCustomToolCall
		case "custom_tool_call_output":
			return "custom_tool_call_output"
		case typeLocalShellCall:
			return typeLocalShellCall
		case "local_shell_call_output":
			return "local_shell_call_output"
		case "web_search_call":
			return "web_search_call"
		case "compaction":
			return "compaction"
		}
	}
	s, _ := stringValue(v)
	return s
}

// isToolCall reports whether an item of type typ is a tool call the client
// must answer with a matching *_call_output item.
func isToolCall(typ string) bool {
	switch typ {
	case typeFunctionCall, typeCustomToolCall, typeLocalShellCall, typeComputerCall:
		return true
	}
	return false
}

// isToolOutput reports whether an item of type typ answers a tool call
// (function_call_output, custom_tool_call_output, local_shell_call_output,
// and any future *_call_output).
func isToolOutput(typ string) bool { return strings.HasSuffix(typ, "_call_output") }

// StripReasoningCiphertext returns items with the encrypted_content member
// removed from every reasoning item that carries ciphertext (a non-empty
// value); the rest of such an item, its summary included, is kept byte for
// byte. stripped reports whether any item changed.
//
// It is the relay's reasoning recovery: an upstream that cannot decrypt
// another organisation's reasoning accepts the same request without it, at
// the cost of the model re-deriving that reasoning. Ciphertext elsewhere
// (compaction items, encrypted message bodies or tool arguments, content
// parts) is left alone: dropping it would lose the conversation itself; see
// HasUnstrippableCiphertext.
//
// out is a new slice; items that did not change are the same byte slices as
// in items, changed ones are fresh. items is not modified.
func StripReasoningCiphertext(items []json.RawMessage) (out []json.RawMessage, stripped bool) {
	out = make([]json.RawMessage, len(items))
	for i, it := range items {
		out[i] = it
		if s, ok := stripReasoning(it); ok {
			out[i] = s
			stripped = true
		}
	}
	return out, stripped
}

// stripReasoning returns raw without its encrypted_content members when raw
// is a reasoning item carrying ciphertext.
func stripReasoning(raw []byte) (json.RawMessage, bool) {
	if !mayHold(raw, "encrypted_content") {
		return nil, false
	}
	var ms []member
	var cipher []bool
	typ := ""
	found := false
	closing, ok := scanObject(raw, func(tok []byte, escaped bool, m member) {
		isCipher := false
		switch string(keyName(tok, escaped)) {
		case "type":
			typ = internType(raw[m.valStart:m.end])
		case "encrypted_content":
			isCipher = true
			found = found || hasValue(raw[m.valStart:m.end])
		}
		ms = append(ms, m)
		cipher = append(cipher, isCipher)
	})
	if !ok || typ != typeReasoning || !found {
		return nil, false
	}
	return rewriteObject(raw, ms, closing, cipher, -1, "", nil, 0), true
}

// HasUnstrippableCiphertext reports whether items hold ciphertext that
// StripReasoningCiphertext would keep: a non-empty encrypted_content on any
// item other than reasoning (compaction, agent message bodies, encrypted tool
// arguments) or on a content part of any item. Only the issuing
// organisation can read such a request; no rewrite makes it portable.
func HasUnstrippableCiphertext(items []json.RawMessage) bool {
	for _, it := range items {
		info := inspect(it)
		if info.partCipher || (info.itemCipher && info.typ != typeReasoning) {
			return true
		}
	}
	return false
}

// HasCiphertext reports whether any of items carries a non-empty
// encrypted_content, on the item or on a content part.
func HasCiphertext(items []json.RawMessage) bool {
	for _, it := range items {
		if inspect(it).cipher() {
			return true
		}
	}
	return false
}
