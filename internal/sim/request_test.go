package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shorthand inputs the Responses API accepts work on both flavours: a
// string input is one user message, and a message may come without its
// type and with a string content.
func TestShorthandInputs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body, answer string
	}{
		{"string input", `{"model":"m","input":"Say hello."}`, "Simulated reply to: Say hello."},
		{"string content", `{"model":"m","input":[{"type":"message","role":"user","content":"in a string"}]}`, "Simulated reply to: in a string"},
		{"message without type", `{"model":"m","input":[{"role":"system","content":"be brief"},{"role":"user","content":"short form"}]}`, "Simulated reply to: short form"},
	}
	for _, account := range []string{"a1", "k1"} {
		for _, tc := range cases {
			t.Run(account+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				upstream := newSim(t, Config{})
				c := clientFor(t, upstream, account)
				_, evs, err := c.turn([]byte(tc.body))
				require.NoError(t, err)
				assert.Equal(t, tc.answer, answerText(evs))
				recs := upstream.Requests(RecordFilter{})
				require.Len(t, recs, 1)
				assert.Contains(t, recs[0].InputTypes, "message")
			})
		}
	}
}

// A body of the wrong shape is refused with a sentence naming the field and
// the JSON type it must have, never a Go type.
func TestMalformedBodiesGetPlainErrors(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "k1")
	cases := []struct {
		name, body, message string
	}{
		{"input of the wrong type", `{"model":"m","input":5}`, "invalid type for 'input': expected a string or an array of items, got number"},
		{"item field of the wrong type", `{"model":"m","input":[{"type":"message","role":5}]}`, "invalid type for 'input.role': expected a string, got number"},
		{"model of the wrong type", `{"model":3,"input":[]}`, "invalid type for 'model': expected a string, got number"},
		{"not an object", `[1,2]`, "the request body must be a JSON object, not array"},
		{"broken JSON", `{"model":`, "the request body is not valid JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := c.turn([]byte(tc.body))
			status, e := errorOf(t, err)
			assert.Equal(t, 400, status)
			assert.Equal(t, tc.message, e.Message)
			assert.NotContains(t, e.Message, "Go struct")
			assert.NotContains(t, e.Message, "unmarshal")
		})
	}
}

// The stream flag of a request is recorded, so a test can see what a relay
// asked of the upstream.
func TestStreamFlagIsRecorded(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "k1")
	_, _, err := c.turn([]byte(`{"model":"m","stream":true,"input":"one"}`))
	require.NoError(t, err)
	_, _, err = c.turn([]byte(`{"model":"m","input":"two"}`))
	require.NoError(t, err)
	recs := upstream.Requests(RecordFilter{})
	require.Len(t, recs, 2)
	assert.True(t, recs[0].Stream)
	assert.False(t, recs[1].Stream)
}
