package relay

import (
	"encoding/json"
	"errors"

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

// fallBack returns the plan in the fallback group after selection found the
// pool exhausted (err is a noAccountError). It happens once per request,
// and only when the fallback group has an account in the key's scope. With
// a fallback model configured, the request asks for it.
func (s *Server) fallBack(p plan, ch choice, err error) (plan, bool) {
	var none *noAccountError
	if p.fallback || !errors.As(err, &none) || !ch.fallbackInScope {
		return p, false
	}
	p.fallback, p.recovery = true, RecoveryFallback
	if m := s.cfg.FallbackModel; m != "" {
		if b, ok := setModel(p.body, m); ok {
			p.body, p.model = b, m
		}
	}
	return p, true
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
