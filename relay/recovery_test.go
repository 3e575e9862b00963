package relay

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecideCiphertext(t *testing.T) {
	t.Parallel()
	base := ciphertextCase{RecoveryOn: true, Status: 400, Strippable: true, BudgetLeft: 3}
	with := func(f func(*ciphertextCase)) ciphertextCase { c := base; f(&c); return c }
	cases := []struct {
		name string
		c    ciphertextCase
		want ciphertextStep
	}{
		{"strippable: strip and retry the same account", base, cipherStripRetry},
		{"stripped retry rejected again: mismatch", with(func(c *ciphertextCase) { c.StrippedSent = true }), cipherNextAccount},
		{"nothing strippable (agent message body): mismatch at once", with(func(c *ciphertextCase) { c.Strippable = false }), cipherNextAccount},
		{"never: recovery switched off", with(func(c *ciphertextCase) { c.RecoveryOn = false }), cipherAnswer},
		{"never: output committed", with(func(c *ciphertextCase) { c.Committed = true }), cipherAnswer},
		{"never: cancelled", with(func(c *ciphertextCase) { c.Cancelled = true }), cipherAnswer},
		{"never: 401", with(func(c *ciphertextCase) { c.Status = 401 }), cipherAnswer},
		{"never: 402", with(func(c *ciphertextCase) { c.Status = 402 }), cipherAnswer},
		{"never: 403", with(func(c *ciphertextCase) { c.Status = 403 }), cipherAnswer},
		{"never: 407", with(func(c *ciphertextCase) { c.Status = 407 }), cipherAnswer},
		{"never: 429", with(func(c *ciphertextCase) { c.Status = 429 }), cipherAnswer},
		{"never: previous_response_id or conversation", with(func(c *ciphertextCase) { c.Chained = true }), cipherAnswer},
		{"cap: three mismatches made", with(func(c *ciphertextCase) { c.StrippedSent, c.Mismatches = true, 3 }), cipherAnswer},
		{"budget spent", with(func(c *ciphertextCase) { c.BudgetLeft = 0 }), cipherAnswer},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, decideCiphertext(tc.c)) })
	}
}

func TestStrippedBody(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"m","input":[{"type":"reasoning","id":"rs","summary":[],"encrypted_content":"CIPHER"},{"type":"message","id":"m","encrypted_content":"SEALED"}],"x":1}`)
	var f struct {
		Input []json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal(body, &f))
	b, items, ok := strippedBody(body, f.Input)
	require.True(t, ok)
	assert.NotContains(t, string(b), "CIPHER", "reasoning ciphertext removed")
	assert.Contains(t, string(b), "SEALED", "other ciphertext cannot be stripped and stays")
	assert.Contains(t, string(b), `"x":1`)
	assert.Len(t, items, 2)
	_, _, ok = strippedBody(b, items)
	assert.False(t, ok, "nothing left to strip")
}
