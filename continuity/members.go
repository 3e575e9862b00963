package continuity

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The members of a Responses request the relay decides on: the top-level
// ones (routing, continuity, policy, budgets), and inside "reasoning" and
// "client_metadata" the ones it reads or rewrites there. The relay reads
// each exactly once, and forwards the body byte for byte; an upstream may
// read a repeated member differently (the last, or the first) or match a
// variant of its name (encoding/json takes "Model" for "model", Unicode's
// "ſ" for "s"). So each must appear once, spelled exactly and without
// escapes in its name, or the request is refused (CanonicalMembers).
var (
	decidedMembers = []string{"model", "previous_response_id", "prompt_cache_key", "conversation", "generate",
		"stream", "input", "service_tier", "reasoning", "client_metadata", "store", "background"}
	decidedReasoning = []string{"effort"}
	decidedMetadata  = []string{"x-codex-turn-state", "x-codex-turn-metadata", "traceparent", "tracestate"}
)

// MemberError is a decided member that is not canonical: repeated, or
// written as a variant of its name.
type MemberError struct {
	// Path is where the member is: "" at the top level, else the object
	// holding it ("reasoning").
	Path string
	// Name is the decided member's name; Key the key as sent, when it is a
	// variant ("" for a repeat).
	Name, Key string
}

// Member is the decided member's place: "model", "reasoning.effort".
func (e *MemberError) Member() string {
	if e.Path != "" {
		return e.Path + "." + e.Name
	}
	return e.Name
}

func (e *MemberError) Error() string {
	name := e.Member()
	if e.Key != "" {
		return fmt.Sprintf("member %q stands for %q, which the relay reads only spelled exactly so: send %q once, as written", e.Key, name, e.Name)
	}
	return fmt.Sprintf("member %q appears more than once: send it once", name)
}

// CanonicalMembers checks that in the JSON object obj each member of names
// appears at most once, spelled exactly, without escapes in its key, and
// that no other key stands for it (equal without regard to case, Unicode
// simple folding included, or spelled with escapes). path names obj in
// errors. A body that is not an object passes: reading it fails elsewhere.
func CanonicalMembers(obj []byte, path string, names []string) error {
	c := canonical{path: path, names: names}
	scanObject(obj, func(tok []byte, escaped bool, _ member) { c.see(tok, escaped) })
	return c.err
}

// canonical checks the keys of one object as a scan meets them: the first
// fault is kept in err.
type canonical struct {
	path  string
	names []string // fewer than 64
	seen  uint64
	err   error
}

func (c *canonical) see(tok []byte, escaped bool) {
	if c.err != nil || len(tok) < 2 {
		return
	}
	key := keyName(tok, escaped)
	if key == nil { // an escape that does not decode: compare what is there
		key = tok[1 : len(tok)-1]
	}
	for i, n := range c.names {
		switch {
		case !escaped && string(key) == n:
			if c.seen&(1<<i) != 0 {
				c.err = &MemberError{Path: c.path, Name: n}
				return
			}
			c.seen |= 1 << i
			return
		case len(key) <= 4*len(n) && utf8.Valid(key) && strings.EqualFold(string(key), n):
			c.err = &MemberError{Path: c.path, Name: n, Key: string(tok[1 : len(tok)-1])}
			return
		}
	}
}

// nested checks the objects inside a request the relay reads members of:
// the value v of the top-level member tok.
func (c *canonical) nested(tok []byte, escaped bool, v []byte) {
	if c.err != nil || escaped || len(v) == 0 || v[0] != '{' {
		return
	}
	switch string(tok) {
	case `"reasoning"`:
		c.err = CanonicalMembers(v, "reasoning", decidedReasoning)
	case `"client_metadata"`:
		c.err = CanonicalMembers(v, "client_metadata", decidedMetadata)
	}
}
