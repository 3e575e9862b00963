package relay

import (
	"encoding/json"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// FallbackTag marks accounts of the fallback group: kept out of ordinary
// selection, used once by a request that found the pool exhausted.
const FallbackTag = "fallback"

// FallbackHeader names the fallback that served a request (header, and a
// response.metadata entry in the stream).
const FallbackHeader = "X-Codex-Relay-Fallback"

func isFallback(a store.Account) bool {
	for _, t := range a.Tags {
		if t == FallbackTag {
			return true
		}
	}
	return false
}

// inGroup reports whether a belongs to the group this plan selects from:
// the fallback group once it fell back, the pool otherwise.
func (p plan) inGroup(a store.Account) bool { return isFallback(a) == p.fallback }

// fellBack is p in the fallback group, after selection found the pool
// exhausted (see tries.noAccount): its recovery says so, and with a
// fallback model it asks for that model.
func (p plan) fellBack(model string) plan {
	p.fallback, p.recovery = true, RecoveryFallback
	if model != "" {
		if b, ok := setModel(p.body, model); ok {
			p.body, p.model = b, model
		}
	}
	return p
}

// setModel replaces the body's model.
func setModel(body []byte, model string) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil, false
	}
	v, _ := json.Marshal(model)
	m["model"] = v
	out, err := json.Marshal(m)
	return out, err == nil
}

// fallbackNotice is what the client is told when the fallback served: the
// account's label and the model; "" when it did not.
func (p plan) fallbackNotice(t target) string {
	if !p.fallback {
		return ""
	}
	return t.Account.Label + " (" + p.model + ")"
}

// noticeEvent is the response.metadata event that tells a streaming client
// the fallback served.
func noticeEvent(notice string) []byte {
	return mustJSON(map[string]any{"type": wire.EventResponseMetadata, "headers": map[string]string{"x-codex-relay-fallback": notice}})
}
