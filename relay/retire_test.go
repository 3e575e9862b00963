package relay

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/store"
)

func TestMayRetire(t *testing.T) {
	t.Parallel()
	ok := retireCase{Source: hardSessionPin, OwnerStatus: store.StatusRateLimited, OwnerInScope: true, GoalMarker: true, SelfContained: true, AccountNeutral: true}
	with := func(f func(*retireCase)) retireCase { c := ok; f(&c); return c }
	cases := []struct {
		name string
		c    retireCase
		want bool
	}{
		{"marked, self-contained restart of a rate-limited pin", ok, true},
		{"paused owner", with(func(c *retireCase) { c.OwnerStatus = store.StatusPaused }), true},
		{"quota-exceeded owner", with(func(c *retireCase) { c.OwnerStatus = store.StatusQuotaExceeded }), true},
		{"no marker: fail closed", with(func(c *retireCase) { c.GoalMarker = false }), false},
		{"not self-contained", with(func(c *retireCase) { c.SelfContained = false }), false},
		{"carries a turn state", with(func(c *retireCase) { c.AccountNeutral = false }), false},
		{"owner outside the key's scope", with(func(c *retireCase) { c.OwnerInScope = false }), false},
		{"re-auth required is not durable unavailability", with(func(c *retireCase) { c.OwnerStatus = store.StatusReauthRequired }), false},
		{"disabled", with(func(c *retireCase) { c.OwnerStatus = store.StatusDisabled }), false},
		{"turn-state owners are never retired", with(func(c *retireCase) { c.Source = hardTurnState }), false},
		{"previous-response owners are never retired", with(func(c *retireCase) { c.Source = hardPreviousResponse }), false},
		{"thread pins are not process-session rows", with(func(c *retireCase) { c.Source = hardThreadPin }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, mayRetire(tc.c)) })
	}
}

func TestHasGoalMarker(t *testing.T) {
	t.Parallel()
	item := func(s string) json.RawMessage { return json.RawMessage(s) }
	cases := []struct {
		name  string
		input []json.RawMessage
		want  bool
	}{
		{"marker in text part", []json.RawMessage{item(`{"type":"message","role":"user","content":[{"type":"input_text","text":"<codex_internal_context source=\"goal\">\nkeep going"}]}`)}, true},
		{"marker as string content", []json.RawMessage{item(`{"type":"message","role":"user","content":"<codex_internal_context source=\"goal\">"}`)}, true},
		{"marker after the goal objective output", []json.RawMessage{item(`{"type":"function_call_output","output":"goal"}`), item(`{"type":"message","role":"user","content":[{"type":"input_text","text":"<codex_internal_context source=\"goal\">"}]}`)}, true},
		{"marker from the assistant does not count", []json.RawMessage{item(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"<codex_internal_context source=\"goal\">"}]}`)}, false},
		{"marker later in the text does not count", []json.RawMessage{item(`{"type":"message","role":"user","content":"please <codex_internal_context source=\"goal\">"}`)}, false},
		{"another source", []json.RawMessage{item(`{"type":"message","role":"user","content":"<codex_internal_context source=\"review\">"}`)}, false},
		{"plain", []json.RawMessage{item(`{"type":"message","role":"user","content":"hi"}`)}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, hasGoalMarker(tc.input)) })
	}
}
