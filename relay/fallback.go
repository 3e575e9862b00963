package relay

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
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

// inGroup reports whether a belongs to the group this request selects from:
// the fallback group once it fell back, the pool otherwise.
func (c *call) inGroup(a store.Account) bool { return isFallback(a) == c.fallback }

// fallBack switches the request to the fallback group after selection found
// the pool exhausted (err is a NoAccountError). It happens once per request,
// and only when the fallback group has an account in the key's scope. With a
// fallback model configured, the request asks for it.
func (s *Server) fallBack(c *call, err error) bool {
	var none *NoAccountError
	if c.fallback || !errors.As(err, &none) || !c.fallbackInScope {
		return false
	}
	c.fallback, c.recovery = true, RecoveryFallback
	if m := s.cfg.FallbackModel; m != "" {
		if b, ok := setModel(c.body, m); ok {
			c.body, c.fields.Model = b, m
		}
	}
	return true
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

// fallbackNotice is what the client is told when the fallback served.
func (c *call) fallbackNotice(t Target) string {
	if !c.fallback {
		return ""
	}
	return t.Account.Label + " (" + c.fields.Model + ")"
}

// noticeHeaders sets the fallback header on an answer.
func (c *call) noticeHeaders(h http.Header, t Target) {
	if n := c.fallbackNotice(t); n != "" {
		h.Set(FallbackHeader, n)
	}
}

// noticeEvent is the response.metadata event that tells a streaming client
// the fallback served; nil when it did not.
func (c *call) noticeEvent(t Target) []byte {
	n := c.fallbackNotice(t)
	if n == "" {
		return nil
	}
	return mustJSON(map[string]any{"type": wire.EventResponseMetadata, "headers": map[string]string{"x-codex-relay-fallback": n}})
}
