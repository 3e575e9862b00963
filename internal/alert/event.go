package alert

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The event types a webhook may ask for.
const (
	AccountNeedsLogin = "account.needs_login"
	AccountExhausted  = "account.exhausted"
	PoolExhausted     = "pool.exhausted"
	KeyLimitThreshold = "key.limit_threshold"
	UpstreamErrors    = "upstream.errors"
	ReplicaLost       = "replica.lost"
	// Test is the event of the "send a test event" button; no webhook
	// asks for it, it is sent to the one it was asked for.
	Test = "webhook.test"
)

// Types are the event types a webhook may ask for, in the order the
// console lists them.
var Types = []string{AccountNeedsLogin, AccountExhausted, PoolExhausted, KeyLimitThreshold, UpstreamErrors, ReplicaLost}

// KnownType reports whether a webhook may ask for typ.
func KnownType(typ string) bool { return slices.Contains(Types, typ) }

// The states an event reports, in its data's "state".
const (
	Fired   = "fired"
	Cleared = "cleared"
)

// Event is the generic JSON event, the body a json webhook receives:
// {"id","type","at","subject":{...},"data":{...}}. The id is the same on
// every retry. data.state says whether the condition fired or cleared, and
// data.message says it in words (the Slack format's text).
type Event struct {
	ID      string         `json:"id"`
	Type    string         `json:"type"`
	At      time.Time      `json:"at"`
	Subject map[string]any `json:"subject"`
	Data    map[string]any `json:"data"`
}

// Formats a webhook may take.
const (
	FormatJSON  = "json"
	FormatSlack = "slack"
)

// SignatureHeader carries the body's signature: "sha256=" and the hex
// HMAC-SHA256 of the raw body under the webhook's secret.
const SignatureHeader = "X-Codex-Relay-Signature"

// Sign is the value of SignatureHeader for body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether signature (SignatureHeader's value) is body's
// under secret, in constant time: what a receiver does.
func Verify(secret string, body []byte, signature string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(signature))
}

// Body is what a webhook of format receives for the stored generic event
// payload: the payload itself for json, {"text": ...} for slack.
func Body(format string, payload []byte) ([]byte, error) {
	if format != FormatSlack {
		return payload, nil
	}
	var ev Event
	if err := json.Unmarshal(payload, &ev); err != nil {
		return nil, fmt.Errorf("alert event: %w", err)
	}
	return json.Marshal(map[string]string{"text": SlackText(ev)})
}

// SlackText is an event in one line of Slack's markup: what happened, to
// what, and (for a condition that fired) what to do.
func SlackText(ev Event) string {
	mark := ":rotating_light:"
	if ev.Data["state"] == Cleared {
		mark = ":white_check_mark:"
	}
	msg, _ := ev.Data["message"].(string)
	if msg == "" {
		msg = ev.Type
	}
	keys := make([]string, 0, len(ev.Subject))
	for k := range ev.Subject {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var subject []string
	for _, k := range keys {
		subject = append(subject, fmt.Sprintf("%s=%v", k, ev.Subject[k]))
	}
	text := fmt.Sprintf("%s *%s* %v: %s", mark, ev.Type, ev.Data["state"], msg)
	if len(subject) > 0 {
		text += " (" + strings.Join(subject, ", ") + ")"
	}
	return text
}
