package continuity

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func compactionItem(cipher string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"compaction","id":"cmp_1","encrypted_content":%s}`, jstr(cipher)))
}

func compactionTrigger() json.RawMessage { return raw(`{"type":"compaction_trigger"}`) }

func TestEndsWithCompactionTrigger(t *testing.T) {
	t.Parallel()
	assert.True(t, EndsWithCompactionTrigger(items(msg("user", "hi"), compactionTrigger())))
	assert.True(t, EndsWithCompactionTrigger(items(raw(`{ "type" : "compaction_trigger", "metadata": null }`))))
	assert.False(t, EndsWithCompactionTrigger(items(compactionTrigger(), msg("user", "hi"))), "only as the last item")
	assert.False(t, EndsWithCompactionTrigger(items(compactionItem("c"))))
	assert.False(t, EndsWithCompactionTrigger(nil))
}

func TestCompactedHistory(t *testing.T) {
	t.Parallel()
	dev, sys := msg("developer", "base instructions"), msg("system", "system text")
	u1, u2 := msg("user", "list the files"), msg("user", "now the tests")
	a1 := msg("assistant", "a.go and b.go")
	old, cmp := compactionItem("old-cipher"), compactionItem("new-cipher")
	cases := []struct {
		name          string
		input, output []json.RawMessage
		want          []json.RawMessage
		notCompacted  bool
	}{
		{
			name:   "compaction_trigger: the kept messages then the item",
			input:  items(dev, u1, reasoning("rs_1", "c1"), a1, funcCall("call_1", "{}"), funcOutput("call_1", "ok"), old, u2, sys, compactionTrigger()),
			output: items(cmp),
			want:   items(dev, u1, u2, sys, cmp),
		},
		{
			name:   "compaction_trigger: other output items are not kept",
			input:  items(dev, u1, a1, compactionTrigger()),
			output: items(reasoning("rs_2", "c2"), msg("assistant", "ignored"), cmp),
			want:   items(dev, u1, cmp),
		},
		{
			name:   "legacy route: the instructions then the transcript",
			input:  items(dev, u1, reasoning("rs_1", "c1"), a1, u2),
			output: items(msg("user", "list the files (kept)"), cmp),
			want:   items(dev, msg("user", "list the files (kept)"), cmp),
		},
		{
			name:         "a summary the client made: nothing compacted",
			input:        items(dev, u1, a1, msg("user", "summarise the conversation")),
			output:       items(msg("assistant", "a summary")),
			notCompacted: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := CompactedHistory(tc.input, tc.output)
			if tc.notCompacted {
				assert.False(t, ok)
				assert.Nil(t, got)
				return
			}
			require.True(t, ok)
			assert.Equal(t, strs(tc.want), strs(got))
		})
	}
}

// After a compaction the thread's history is the compacted one: its id
// resolves to the kept messages and the compaction item, a rebuild chained
// on it (or on the turn after it) sends no item of the old history, and the
// old ids stop resolving past what the two histories share.
func TestCommitCompaction(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	cmp := compactionItem("cipher-cmp")
	u4, r4, a4, u5 := msg("user", "what next?"), reasoning("rs_4", "cipher-4"), msg("assistant", "the tests"), msg("user", "run them")
	compacted := items(tt.dev, tt.u1, tt.u2, cmp)
	cases := []struct {
		name       string
		compaction Turn
	}{
		{"full request", Turn{Input: concat(tt.h3(), items(compactionTrigger()))}},
		{"chained on the last response", Turn{PreviousResponseID: "resp_3", Input: items(compactionTrigger())}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(Options{})
			tt.commit(c, rootKey)
			turn := tc.compaction
			turn.ResponseID, turn.Output, turn.AccountID, turn.Organization, turn.Compaction = "resp_c", items(cmp), "acc_2", "org_b", true
			c.Commit(rootKey, turn)

			got, err := c.Resolve(rootKey, "resp_c", items(u4))
			require.NoError(t, err)
			assert.Equal(t, strs(concat(compacted, items(u4))), strs(got), "a rebuild from the compaction sends the item, not the history")
			for _, old := range []string{"resp_2", "resp_3"} {
				_, err := c.Resolve(rootKey, old, nil)
				assert.ErrorIs(t, err, ErrUnknownResponse, "%s lay in the compacted history", old)
			}
			snap, ok := c.Lookup(rootKey)
			require.True(t, ok)
			assert.Equal(t, "resp_c", snap.LastResponseID)
			assert.Equal(t, 4, snap.HistoryItems)
			assert.Empty(t, snap.UnresolvedCalls)
			assert.Equal(t, []string{"org_b"}, snap.CiphertextOrgs, "only the compaction item's ciphertext is left")

			// The client's next turn chains on the compaction, the one after
			// it on that turn: both rebuild from the compacted history.
			c.Commit(rootKey, Turn{ResponseID: "resp_4", PreviousResponseID: "resp_c", Input: items(u4), Output: items(r4, a4), AccountID: "acc_2", Organization: "org_b"})
			got, err = c.Resolve(rootKey, "resp_4", items(u5))
			require.NoError(t, err)
			assert.Equal(t, strs(concat(compacted, items(u4, r4, a4, u5))), strs(got))
		})
	}
}

// A compaction whose history the entry does not hold leaves the entry
// unable to replay, like any turn chained on an unknown response; one whose
// answer holds no compaction item commits as an ordinary turn.
func TestCommitCompactionEdges(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()

	c := New(Options{})
	tt.commit(c, rootKey)
	c.Commit(rootKey, Turn{ResponseID: "resp_c", PreviousResponseID: "resp_nope", Input: items(compactionTrigger()),
		Output: items(compactionItem("x")), AccountID: "acc_1", Organization: "org_a", Compaction: true})
	_, err := c.Resolve(rootKey, "resp_c", nil)
	assert.ErrorIs(t, err, ErrUnknownResponse)

	c = New(Options{})
	tt.commit(c, rootKey)
	prompt, summary := msg("user", "summarise the conversation"), msg("assistant", "a summary")
	c.Commit(rootKey, Turn{ResponseID: "resp_s", Input: concat(tt.h3(), items(prompt)), Output: items(summary),
		AccountID: "acc_1", Organization: "org_a", Compaction: true})
	got, err := c.Resolve(rootKey, "resp_s", nil)
	require.NoError(t, err)
	assert.Equal(t, strs(concat(tt.h3(), items(prompt, summary))), strs(got))
}
