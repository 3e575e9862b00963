package bridge

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"sort"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// State is what a lane's upstream connection holds after a response: the
// response's id, the fingerprints of the whole history behind it (every
// input item it was sent, then every output item it produced), and the
// shape of the request that produced it.
type State struct {
	ResponseID string
	History    []string
	Shape      [32]byte
	// NoChain marks a lane whose upstream refused a chain the relay made:
	// every request on it goes in full.
	NoChain bool
}

// Plan decides how to send a full request (input holds the whole history,
// as HTTP clients send it) on a lane in state st. It returns delta true and
// the index of the first new item when the lane's history is a prefix of the
// input and the request's shape is unchanged: then only input[from:] goes
// upstream, chained with previous_response_id. Otherwise the full request.
func Plan(st State, shape [32]byte, input []json.RawMessage) (delta bool, from int) {
	if st.NoChain || st.ResponseID == "" || shape != st.Shape || len(input) <= len(st.History) {
		return false, 0
	}
	for i, fp := range st.History {
		if Fingerprint(input[i]) != fp {
			return false, 0
		}
	}
	return true, len(st.History)
}

// Fingerprint identifies an item across re-serialisation: clients resend
// output items in their own encoding, so bytes may differ while the item is
// the same. Items with an id are known by type and id; tool outputs by type
// and call id; anything else by a hash of its canonical JSON.
func Fingerprint(item json.RawMessage) string {
	if ms, ok := objectMembers(item); ok {
		typ, id, callID := stringMember(ms, "type"), stringMember(ms, "id"), stringMember(ms, "call_id")
		switch {
		case id != "":
			return typ + "#" + id
		case callID != "" && (typ == "function_call_output" || typ == "custom_tool_call_output"):
			return typ + "@" + callID
		}
	}
	h := sha256.New()
	if canonical(h, item) != nil {
		sum := sha256.Sum256(item)
		return "raw:" + string(sum[:16])
	}
	return "json:" + string(h.Sum(nil)[:16])
}

// shapeIgnored are the fields that do not shape what the upstream holds:
// the input itself, the chaining, and per-request transport details.
var shapeIgnored = map[string]bool{
	"input": true, "previous_response_id": true, "stream": true, "client_metadata": true,
	"generate": true, "type": true,
}

// Shape hashes the request fields that shape the conversation (model,
// instructions, tools, reasoning, text, ...): when they change, the lane's
// chain no longer fits and the full request is sent.
func Shape(body []byte) [32]byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return sha256.Sum256(body)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if !shapeIgnored[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	h := sha256.New()
	var n [4]byte
	for _, k := range keys {
		for _, part := range [][]byte{[]byte(k), m[k]} {
			binary.BigEndian.PutUint32(n[:], uint32(len(part)))
			h.Write(n[:])
			h.Write(part)
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Fingerprints fingerprints items in order.
func Fingerprints(items []json.RawMessage) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = Fingerprint(it)
	}
	return out
}

// Chain turns a request body into the WebSocket message for the lane: a
// response.create with the given input and, when prev is set, chained to it.
// Every other field is kept as the client sent it.
func Chain(body []byte, input []json.RawMessage, prev string) ([]byte, error) {
	out, err := continuity.WithFullInput(body, input)
	if err != nil {
		return nil, err
	}
	return message(out, prev)
}

// Message turns a request body into the WebSocket message for the lane as it
// is: a response.create with every field, its input and any
// previous_response_id included, as the client sent it.
func Message(body []byte) ([]byte, error) {
	return message(body, "")
}

// message prefixes body's members with the message type and, when prev is
// set, the chain (body must hold no previous_response_id then).
func message(body []byte, prev string) ([]byte, error) {
	i := wire.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, errNotObject
	}
	prefix := `"type":"` + wire.MessageResponseCreate + `",`
	if prev != "" {
		p, _ := json.Marshal(prev)
		prefix += `"previous_response_id":` + string(p) + `,`
	}
	rest := body[i+1:]
	if j := wire.SkipSpace(rest, 0); j < len(rest) && rest[j] == '}' {
		prefix = prefix[:len(prefix)-1] // an empty object: no trailing comma
	}
	msg := make([]byte, 0, len(body)+len(prefix)+1)
	msg = append(msg, '{')
	msg = append(msg, prefix...)
	msg = append(msg, rest...)
	return msg, nil
}
