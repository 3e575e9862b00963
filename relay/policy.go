package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/codexrelay/codex-relay/continuity"
)

// Reasoning efforts, weakest first: a key's cap admits its own rank and
// below.
var effortRank = map[string]int{"none": 0, "minimal": 1, "low": 2, "medium": 3, "high": 4, "xhigh": 5}

// ValidEffort reports a reasoning effort a key's policy may cap at.
func ValidEffort(e string) bool { _, ok := effortRank[e]; return ok }

// policed is a request body as a key's model policy lets it go upstream.
type policed struct {
	body   []byte
	fields continuity.Fields // Model is the model the upstream gets
	asked  string            // the model the client asked for
	note   string            // what the policy changed, for the request log ("" nothing)
}

// police admits a request body under its key: the model must be one the
// key may use (an alias it defines, or one of its allow-list), and the
// key's policy rewrites what it governs: an alias becomes its model, a
// reasoning effort above the cap becomes the cap, and the priority service
// tier is refused or downgraded to the default. Every other byte of the
// body goes as it came.
func (c client) police(body []byte, fields continuity.Fields) (policed, error) {
	out := policed{body: body, fields: fields, asked: fields.Model}
	p := c.key.Policy
	target, aliased := p.ModelAliases[fields.Model]
	if !aliased {
		if err := c.checkModel(fields.Model); err != nil {
			return out, err
		}
	}
	if p.IsZero() {
		return out, nil
	}
	var notes []string
	if aliased {
		out.body = withMember(out.body, "model", target)
		out.fields.Model = target
		notes = append(notes, "model "+fields.Model+">"+target)
	}
	if cap := p.MaxReasoningEffort; cap != "" {
		if b, asked, ok := capEffort(out.body, cap); ok {
			out.body = b
			notes = append(notes, "effort "+asked+">"+cap)
		}
	}
	if p.PriorityTier == "refuse" || p.PriorityTier == "downgrade" {
		if s, e, ok := memberValue(out.body, "service_tier"); ok {
			var tier string
			if json.Unmarshal(out.body[s:e], &tier) == nil && strings.EqualFold(tier, "priority") {
				if p.PriorityTier == "refuse" {
					return out, refuse(http.StatusForbidden, "service_tier_not_allowed",
						"this client key may not use the priority service tier: send the request without service_tier \"priority\"")
				}
				out.body = withoutMember(out.body, "service_tier")
				notes = append(notes, "tier priority>default")
			}
		}
	}
	out.note = strings.Join(notes, "; ")
	return out, nil
}

// capEffort lowers reasoning.effort to limit when it asks for more (or for
// an effort this relay does not rank), and reports the effort asked.
func capEffort(body []byte, limit string) ([]byte, string, bool) {
	s, e, ok := memberValue(body, "reasoning")
	if !ok {
		return body, "", false
	}
	var r map[string]json.RawMessage
	if json.Unmarshal(body[s:e], &r) != nil || r == nil {
		return body, "", false
	}
	var asked string
	if json.Unmarshal(r["effort"], &asked) != nil || asked == "" {
		return body, "", false
	}
	if rank, known := effortRank[asked]; known && rank <= effortRank[limit] {
		return body, "", false
	}
	r["effort"] = mustJSON(limit)
	return splice(body, s, e, encodeKeepingBytes(r)), asked, true
}

// withMember sets a top-level member of a JSON object body to value:
// replaced where it is, or added first. Every other byte is kept.
func withMember(body []byte, name string, value any) []byte {
	v := encodeKeepingBytes(value)
	if s, e, ok := memberValue(body, name); ok {
		return splice(body, s, e, v)
	}
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		return body
	}
	k := mustJSON(name)
	rest := body[i+1:]
	sep := []byte(",")
	if len(bytes.TrimSpace(rest)) > 0 && bytes.TrimSpace(rest)[0] == '}' {
		sep = nil
	}
	out := make([]byte, 0, len(body)+len(k)+len(v)+2)
	out = append(out, body[:i+1]...)
	out = append(out, k...)
	out = append(out, ':')
	out = append(out, v...)
	out = append(out, sep...)
	return append(out, rest...)
}

// splice replaces body[s:e] with v.
func splice(body []byte, s, e int, v []byte) []byte {
	out := make([]byte, 0, len(body)-(e-s)+len(v))
	out = append(out, body[:s]...)
	out = append(out, v...)
	return append(out, body[e:]...)
}

// encodeKeepingBytes encodes v without escaping HTML characters, so raw
// values inside it keep their bytes.
func encodeKeepingBytes(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(fmt.Sprintf("relay: encode %T: %v", v, err)) // only plain values and raw JSON are encoded here
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}
