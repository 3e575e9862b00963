package continuity

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	rootKey  = Key{Thread: "v1:st:root", Scope: "key_a"}
	childKey = Key{Thread: "v1:st:child", Scope: "key_a"}
)

// threeTurns is a WebSocket-shaped thread: each turn's full input is the
// previous history plus the new items.
type threeTurns struct {
	dev, u1, r1, a1, u2, r2, fc, fco, a3 json.RawMessage
}

func newThreeTurns() threeTurns {
	return threeTurns{
		dev: msg("developer", "base instructions"),
		u1:  msg("user", "list the files"),
		r1:  reasoning("rs_1", "cipher-1"),
		a1:  msg("assistant", "which folder?"),
		u2:  msg("user", "the current one"),
		r2:  reasoning("rs_2", "cipher-2"),
		fc:  funcCall("call_1", `{"cmd":"ls"}`),
		fco: funcOutput("call_1", "a.go\nb.go"),
		a3:  msg("assistant", "a.go and b.go"),
	}
}

func (tt threeTurns) h1() []json.RawMessage { return items(tt.dev, tt.u1, tt.r1, tt.a1) }
func (tt threeTurns) h2() []json.RawMessage { return concat(tt.h1(), items(tt.u2, tt.r2, tt.fc)) }
func (tt threeTurns) h3() []json.RawMessage { return concat(tt.h2(), items(tt.fco, tt.a3)) }

// commit commits the three turns on k.
func (tt threeTurns) commit(c *Cache, k Key) {
	c.Commit(k, Turn{ResponseID: "resp_1", Input: items(tt.dev, tt.u1), Output: items(tt.r1, tt.a1), AccountID: "acc_1", Organization: "org_a"})
	c.Commit(k, Turn{ResponseID: "resp_2", Input: concat(tt.h1(), items(tt.u2)), Output: items(tt.r2, tt.fc), AccountID: "acc_1", Organization: "org_a"})
	c.Commit(k, Turn{ResponseID: "resp_3", Input: concat(tt.h2(), items(tt.fco)), Output: items(tt.a3), AccountID: "acc_1", Organization: "org_a"})
}

func TestResolve(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	u4 := msg("user", "now run the tests")
	cases := []struct {
		name     string
		key      Key
		previous string
		newItems []json.RawMessage
		want     []json.RawMessage
		unknown  bool
	}{
		{name: "from the last id", key: rootKey, previous: "resp_3", newItems: items(u4), want: concat(tt.h3(), items(u4))},
		{name: "from an older id", key: rootKey, previous: "resp_1", newItems: items(u4), want: concat(tt.h1(), items(u4))},
		{name: "from the middle id without new items", key: rootKey, previous: "resp_2", want: tt.h2()},
		{name: "tool follow-up", key: rootKey, previous: "resp_2", newItems: items(tt.fco), want: concat(tt.h2(), items(tt.fco))},
		{name: "unknown id", key: rootKey, previous: "resp_nope", unknown: true},
		{name: "empty id", key: rootKey, previous: "", unknown: true},
		{name: "sibling thread of the same session", key: childKey, previous: "resp_3", unknown: true},
		{name: "same thread under another client key scope", key: Key{Thread: rootKey.Thread, Scope: "key_b"}, previous: "resp_3", unknown: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(Options{})
			tt.commit(c, rootKey)
			got, err := c.Resolve(tc.key, tc.previous, tc.newItems)
			if tc.unknown {
				require.ErrorIs(t, err, ErrUnknownResponse)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, strs(tc.want), strs(got))
		})
	}
}

// A client may branch from an older response: the next commit truncates the
// history there, ids past the branch stop resolving, older ones still do,
// and the owners of all of them stay known.
func TestResolveAfterBranch(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	c := New(Options{})
	tt.commit(c, rootKey)

	alt := msg("user", "actually, do something else")
	full, err := c.Resolve(rootKey, "resp_1", items(alt))
	require.NoError(t, err)
	altOut := msg("assistant", "sure")
	c.Commit(rootKey, Turn{ResponseID: "resp_b", Input: full, Output: items(altOut), AccountID: "acc_2", Organization: "org_a"})

	got, err := c.Resolve(rootKey, "resp_b", nil)
	require.NoError(t, err)
	assert.Equal(t, strs(concat(tt.h1(), items(alt, altOut))), strs(got))
	got, err = c.Resolve(rootKey, "resp_1", nil)
	require.NoError(t, err)
	assert.Equal(t, strs(tt.h1()), strs(got))
	for _, id := range []string{"resp_2", "resp_3"} {
		_, err := c.Resolve(rootKey, id, nil)
		require.ErrorIs(t, err, ErrUnknownResponse, id)
		owner, ok := c.OwnerOf(rootKey, id)
		assert.True(t, ok, id)
		assert.Equal(t, "acc_1", owner)
	}
	owner, ok := c.OwnerOf(rootKey, "resp_b")
	require.True(t, ok)
	assert.Equal(t, "acc_2", owner)

	snap, ok := c.Lookup(rootKey)
	require.True(t, ok)
	assert.Equal(t, "resp_b", snap.LastResponseID)
	assert.Equal(t, 6, snap.HistoryItems)
	assert.Empty(t, snap.UnresolvedCalls, "the branch dropped the pending call")
	_, bytes := c.Len()
	assert.Equal(t, sumLen(concat(tt.h1(), items(alt, altOut))), bytes)
}

// A full request whose input departs from the stored history (a compaction)
// replaces it; ids of the old history stop resolving.
func TestCommitReplacesDepartedHistory(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	c := New(Options{})
	tt.commit(c, rootKey)
	compacted := items(raw(`{"type":"compaction","encrypted_content":"summary-cipher"}`), msg("user", "continue"))
	c.Commit(rootKey, Turn{ResponseID: "resp_c", Input: compacted, Output: items(tt.a3), AccountID: "acc_1", Organization: "org_a"})

	for _, id := range []string{"resp_1", "resp_2", "resp_3"} {
		_, err := c.Resolve(rootKey, id, nil)
		assert.ErrorIs(t, err, ErrUnknownResponse, id)
	}
	got, err := c.Resolve(rootKey, "resp_c", nil)
	require.NoError(t, err)
	assert.Equal(t, strs(concat(compacted, items(tt.a3))), strs(got))
	_, bytes := c.Len()
	assert.Equal(t, sumLen(got), bytes)
}

// Committing with PreviousResponseID and only the new items builds the same
// history as committing the full input.
func TestCommitIncremental(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	full := New(Options{})
	tt.commit(full, rootKey)

	inc := New(Options{})
	inc.Commit(rootKey, Turn{ResponseID: "resp_1", Input: items(tt.dev, tt.u1), Output: items(tt.r1, tt.a1), AccountID: "acc_1", Organization: "org_a"})
	inc.Commit(rootKey, Turn{ResponseID: "resp_2", PreviousResponseID: "resp_1", Input: items(tt.u2), Output: items(tt.r2, tt.fc), AccountID: "acc_1", Organization: "org_a"})
	inc.Commit(rootKey, Turn{ResponseID: "resp_3", PreviousResponseID: "resp_2", Input: items(tt.fco), Output: items(tt.a3), AccountID: "acc_1", Organization: "org_a"})

	for _, id := range []string{"resp_1", "resp_2", "resp_3"} {
		want, err := full.Resolve(rootKey, id, nil)
		require.NoError(t, err)
		got, err := inc.Resolve(rootKey, id, nil)
		require.NoError(t, err)
		assert.Equal(t, strs(want), strs(got), id)
	}
	ws, _ := full.Lookup(rootKey)
	gs, _ := inc.Lookup(rootKey)
	ws.LastUsed, gs.LastUsed = time.Time{}, time.Time{}
	assert.Equal(t, ws, gs)
}

// A commit chained to a response the entry cannot replay leaves the entry
// with its metadata but no history, until a full commit.
func TestCommitUnknownPrevious(t *testing.T) {
	t.Parallel()
	tt := newThreeTurns()
	c := New(Options{})
	tt.commit(c, rootKey)
	c.Commit(rootKey, Turn{ResponseID: "resp_4", PreviousResponseID: "resp_elsewhere", Input: items(msg("user", "hi")), Output: items(customCall("call_9")), AccountID: "acc_2", Organization: "org_b"})

	snap, ok := c.Lookup(rootKey)
	require.True(t, ok)
	assert.False(t, snap.Replayable)
	assert.Equal(t, "resp_4", snap.LastResponseID)
	assert.Equal(t, "acc_2", snap.AccountID)
	assert.Zero(t, snap.HistoryItems)
	assert.Equal(t, []string{"call_9"}, snap.UnresolvedCalls)
	assert.Equal(t, []string{"org_a"}, snap.CiphertextOrgs)
	for _, id := range []string{"resp_3", "resp_4"} {
		_, err := c.Resolve(rootKey, id, nil)
		assert.ErrorIs(t, err, ErrUnknownResponse, id)
	}
	owner, ok := c.OwnerOf(rootKey, "resp_4")
	require.True(t, ok)
	assert.Equal(t, "acc_2", owner)
	_, bytes := c.Len()
	assert.Zero(t, bytes)

	c.Commit(rootKey, Turn{ResponseID: "resp_5", Input: tt.h1(), Output: items(tt.a3), AccountID: "acc_2", Organization: "org_b"})
	got, err := c.Resolve(rootKey, "resp_5", nil)
	require.NoError(t, err)
	assert.Equal(t, strs(concat(tt.h1(), items(tt.a3))), strs(got))
}

// Root and child threads of one session (one Scope, one prompt_cache_key)
// and one thread under two client key scopes never share an entry.
func TestKeysAreIsolated(t *testing.T) {
	t.Parallel()
	c := New(Options{})
	keys := []Key{rootKey, childKey, {Thread: rootKey.Thread, Scope: "key_b"}}
	for i, k := range keys {
		c.Commit(k, Turn{ResponseID: "resp_shared", Input: items(msg("user", fmt.Sprintf("thread %d", i))), Output: items(msg("assistant", "ok")), AccountID: fmt.Sprintf("acc_%d", i)})
	}
	for i, k := range keys {
		got, err := c.Resolve(k, "resp_shared", nil)
		require.NoError(t, err)
		assert.Equal(t, strs(items(msg("user", fmt.Sprintf("thread %d", i)), msg("assistant", "ok"))), strs(got), "key %d", i)
		owner, ok := c.OwnerOf(k, "resp_shared")
		require.True(t, ok)
		assert.Equal(t, fmt.Sprintf("acc_%d", i), owner)
	}

	c.Commit(childKey, Turn{ResponseID: "resp_child", Input: items(msg("user", "child")), AccountID: "acc_1"})
	_, err := c.Resolve(rootKey, "resp_child", nil)
	assert.ErrorIs(t, err, ErrUnknownResponse, "the root never sees the child's response")
	_, ok := c.OwnerOf(rootKey, "resp_child")
	assert.False(t, ok)

	c.Drop(childKey)
	_, ok = c.Lookup(childKey)
	assert.False(t, ok)
	_, ok = c.Lookup(rootKey)
	assert.True(t, ok, "dropping the child leaves the root")
}

func sumLen(xs []json.RawMessage) int64 {
	var n int64
	for _, x := range xs {
		n += int64(len(x))
	}
	return n
}

// oneItemTurn returns a turn whose history is one item of exactly size bytes.
func oneItemTurn(id string, size int) Turn {
	pad := size - len(`{"type":"message","text":""}`)
	return Turn{ResponseID: id, Input: items(raw(`{"type":"message","text":"` + fmt.Sprintf("%0*d", pad, 0) + `"}`))}
}

func TestEviction(t *testing.T) {
	t.Parallel()
	key := func(s string) Key { return Key{Thread: s, Scope: "k"} }
	cases := []struct {
		name    string
		opts    Options
		use     func(c *Cache, k Key) // marks k used after a, b and c were committed
		present []string
		absent  []string
	}{
		{
			name:    "by count, oldest first",
			opts:    Options{MaxEntries: 3},
			use:     func(*Cache, Key) {},
			present: []string{"b", "c", "d"},
			absent:  []string{"a"},
		},
		{
			name:    "by count, a touched entry survives",
			opts:    Options{MaxEntries: 3},
			use:     func(c *Cache, k Key) { c.Touch(k) },
			present: []string{"a", "c", "d"},
			absent:  []string{"b"},
		},
		{
			name:    "by count, a resolved entry survives",
			opts:    Options{MaxEntries: 3},
			use:     func(c *Cache, k Key) { _, _ = c.Resolve(k, "resp_a", nil) },
			present: []string{"a", "c", "d"},
			absent:  []string{"b"},
		},
		{
			name:    "by bytes, oldest first",
			opts:    Options{MaxBytes: 350},
			use:     func(*Cache, Key) {},
			present: []string{"b", "c", "d"},
			absent:  []string{"a"},
		},
		{
			name:    "by bytes, a touched entry survives",
			opts:    Options{MaxBytes: 350},
			use:     func(c *Cache, k Key) { c.Touch(k) },
			present: []string{"a", "c", "d"},
			absent:  []string{"b"},
		},
		{
			name:    "a lookup is not use",
			opts:    Options{MaxBytes: 350},
			use:     func(c *Cache, k Key) { _, _ = c.Lookup(k) },
			present: []string{"b", "c", "d"},
			absent:  []string{"a"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(tc.opts)
			for _, s := range []string{"a", "b", "c"} {
				c.Commit(key(s), oneItemTurn("resp_"+s, 100))
			}
			tc.use(c, key("a"))
			c.Commit(key("d"), oneItemTurn("resp_d", 100))
			for _, s := range tc.present {
				_, err := c.Resolve(key(s), "resp_"+s, nil)
				assert.NoError(t, err, s)
			}
			for _, s := range tc.absent {
				_, ok := c.Lookup(key(s))
				assert.False(t, ok, s)
			}
			n, bytes := c.Len()
			assert.Equal(t, 3, n)
			assert.Equal(t, int64(300), bytes)
		})
	}
}

// An entry whose history alone exceeds MaxBytes keeps its metadata but not
// its history, and evicts nobody.
func TestOversizeEntryIsNotRetained(t *testing.T) {
	t.Parallel()
	c := New(Options{MaxBytes: 250})
	small := Key{Thread: "small"}
	big := Key{Thread: "big"}
	c.Commit(small, oneItemTurn("resp_s", 100))
	turn := oneItemTurn("resp_big", 300)
	turn.AccountID, turn.Organization, turn.TurnState = "acc_1", "org_a", "ts_1"
	c.Commit(big, turn)

	_, err := c.Resolve(big, "resp_big", nil)
	require.ErrorIs(t, err, ErrUnknownResponse)
	snap, ok := c.Lookup(big)
	require.True(t, ok)
	assert.False(t, snap.Replayable)
	assert.Zero(t, snap.HistoryBytes)
	assert.Equal(t, "ts_1", snap.TurnState)
	owner, ok := c.OwnerOf(big, "resp_big")
	require.True(t, ok)
	assert.Equal(t, "acc_1", owner)

	_, err = c.Resolve(small, "resp_s", nil)
	assert.NoError(t, err, "the small entry was not evicted for the big one")
	n, bytes := c.Len()
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(100), bytes)

	// It grows back into a replayable entry once a turn fits.
	c.Commit(big, oneItemTurn("resp_big2", 120))
	_, err = c.Resolve(big, "resp_big2", nil)
	assert.NoError(t, err)
}

func TestIdleTTL(t *testing.T) {
	t.Parallel()
	const ttl = time.Hour
	k := rootKey
	cases := []struct {
		name  string
		steps func(c *Cache, clk *fakeClock)
		alive bool
	}{
		{
			name:  "fresh entry lives",
			steps: func(c *Cache, clk *fakeClock) { clk.Advance(ttl - time.Second) },
			alive: true,
		},
		{
			name:  "idle entry expires",
			steps: func(c *Cache, clk *fakeClock) { clk.Advance(ttl) },
		},
		{
			name: "touch keeps an active thread alive past the TTL",
			steps: func(c *Cache, clk *fakeClock) {
				for range 5 { // five hours of activity without a commit
					clk.Advance(ttl - time.Minute)
					c.Touch(k)
				}
			},
			alive: true,
		},
		{
			name: "resolve keeps it alive",
			steps: func(c *Cache, clk *fakeClock) {
				for range 3 {
					clk.Advance(ttl - time.Minute)
					_, _ = c.Resolve(k, "resp_1", nil)
				}
			},
			alive: true,
		},
		{
			name: "lookup and owner queries are not activity",
			steps: func(c *Cache, clk *fakeClock) {
				for range 3 {
					clk.Advance(ttl / 2)
					_, _ = c.Lookup(k)
					_, _ = c.OwnerOf(k, "resp_1")
				}
			},
		},
		{
			name: "touch does not revive an expired entry",
			steps: func(c *Cache, clk *fakeClock) {
				clk.Advance(ttl)
				c.Touch(k)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			c := New(Options{IdleTTL: ttl, Now: clk.Now})
			c.Commit(k, Turn{ResponseID: "resp_1", Input: items(msg("user", "hi")), AccountID: "acc_1"})
			tc.steps(c, clk)
			_, err := c.Resolve(k, "resp_1", nil)
			_, owned := c.OwnerOf(k, "resp_1")
			if tc.alive {
				assert.NoError(t, err)
				assert.True(t, owned)
			} else {
				assert.ErrorIs(t, err, ErrUnknownResponse)
				assert.False(t, owned)
			}
		})
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	c := New(Options{IdleTTL: time.Hour, Now: clk.Now})
	for _, s := range []string{"a", "b", "c"} {
		c.Commit(Key{Thread: s}, oneItemTurn("resp_"+s, 100))
		clk.Advance(10 * time.Minute)
	}
	c.Touch(Key{Thread: "a"})
	clk.Advance(45 * time.Minute) // b is 65 min idle, c 55, a 45

	c.Sweep()
	n, bytes := c.Len()
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(200), bytes)
	_, ok := c.Lookup(Key{Thread: "b"})
	assert.False(t, ok)

	clk.Advance(time.Hour)
	c.Sweep()
	n, bytes = c.Len()
	assert.Zero(t, n)
	assert.Zero(t, bytes)

	// A commit after expiry starts afresh: nothing of the old entry remains.
	c.Commit(Key{Thread: "a"}, oneItemTurn("resp_a2", 100))
	_, err := c.Resolve(Key{Thread: "a"}, "resp_a", nil)
	assert.ErrorIs(t, err, ErrUnknownResponse)
}

func TestUnresolvedCalls(t *testing.T) {
	t.Parallel()
	u := msg("user", "go")
	shell := raw(`{"type":"local_shell_call","id":"lsc_1","call_id":"call_s","action":{"type":"exec","command":["ls"]},"status":"completed"}`)
	shellOut := raw(`{"type":"local_shell_call_output","call_id":"call_s","output":"a.go"}`)
	h1 := items(u, funcCall("call_f", "{}"), customCall("call_c"), shell)
	cases := []struct {
		name  string
		turns []Turn
		want  []string
	}{
		{
			name:  "calls in output are unresolved",
			turns: []Turn{{ResponseID: "r1", Input: items(u), Output: h1[1:]}},
			want:  []string{"call_f", "call_c", "call_s"},
		},
		{
			name: "outputs in the next input clear them",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), Output: h1[1:]},
				{ResponseID: "r2", Input: concat(h1, items(funcOutput("call_f", "ok"), shellOut)), Output: items(msg("assistant", "half done"))},
			},
			want: []string{"call_c"},
		},
		{
			name: "all answered",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), Output: h1[1:]},
				{ResponseID: "r2", PreviousResponseID: "r1", Input: items(funcOutput("call_f", "ok"), customOutput("call_c"), shellOut)},
			},
			want: nil,
		},
		{
			name: "an output without call_id answers nothing",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), Output: h1[1:2]},
				{ResponseID: "r2", PreviousResponseID: "r1", Input: items(goalObjective())},
			},
			want: []string{"call_f"},
		},
		{
			name:  "calls without call_id and other items are not tracked",
			turns: []Turn{{ResponseID: "r1", Input: items(u), Output: items(raw(`{"type":"web_search_call","id":"ws_1","status":"completed"}`), raw(`{"type":"function_call","name":"x"}`))}},
			want:  nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(Options{})
			for _, turn := range tc.turns {
				c.Commit(rootKey, turn)
			}
			snap, ok := c.Lookup(rootKey)
			require.True(t, ok)
			assert.Equal(t, tc.want, snap.UnresolvedCalls)
		})
	}
}

func TestCiphertextOrgs(t *testing.T) {
	t.Parallel()
	u1, u2 := msg("user", "one"), msg("user", "two")
	rA := reasoning("rs_a", "from-a")
	rB := reasoning("rs_b", "from-b")
	rAStripped := raw(`{"type":"reasoning","id":"rs_a","summary":[{"type":"summary_text","text":"thinking"}]}`)
	partCipher := raw(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"","encrypted_content":"body"}]}`)
	cases := []struct {
		name       string
		turns      []Turn
		want       []string
		ciphertext bool
	}{
		{
			name:  "no ciphertext",
			turns: []Turn{{ResponseID: "r1", Input: items(u1), Output: items(msg("assistant", "hi")), Organization: "org_a"}},
		},
		{
			name:       "reasoning from one organisation",
			turns:      []Turn{{ResponseID: "r1", Input: items(u1), Output: items(rA), Organization: "org_a"}},
			want:       []string{"org_a"},
			ciphertext: true,
		},
		{
			name: "kept history keeps its issuer after a move",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u1), Output: items(rA), Organization: "org_a"},
				{ResponseID: "r2", Input: items(u1, rA, u2), Output: items(rB), Organization: "org_b"},
			},
			want:       []string{"org_a", "org_b"},
			ciphertext: true,
		},
		{
			name: "stripped history credits only the new organisation",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u1), Output: items(rA), Organization: "org_a"},
				{ResponseID: "r2", Input: items(u1, rAStripped, u2), Output: items(rB), Organization: "org_b"},
			},
			want:       []string{"org_b"},
			ciphertext: true,
		},
		{
			name: "ciphertext new to the entry is credited to the organisation that accepted it",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u1, rA, u2), Output: items(msg("assistant", "ok")), Organization: "org_c"},
			},
			want:       []string{"org_c"},
			ciphertext: true,
		},
		{
			name:       "a content part's ciphertext counts",
			turns:      []Turn{{ResponseID: "r1", Input: items(u1), Output: items(partCipher), Organization: "org_a"}},
			want:       []string{"org_a"},
			ciphertext: true,
		},
		{
			name:       "unknown organisation",
			turns:      []Turn{{ResponseID: "r1", Input: items(u1), Output: items(rA)}},
			ciphertext: true,
		},
		{
			name: "dropped by a branch",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u1), Output: items(msg("assistant", "hi")), Organization: "org_a"},
				{ResponseID: "r2", PreviousResponseID: "r1", Input: items(u2), Output: items(rA), Organization: "org_a"},
				{ResponseID: "r3", Input: items(u1, msg("assistant", "hi"), msg("user", "other")), Organization: "org_b"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(Options{})
			for _, turn := range tc.turns {
				c.Commit(rootKey, turn)
			}
			snap, ok := c.Lookup(rootKey)
			require.True(t, ok)
			if tc.want == nil {
				assert.Empty(t, snap.CiphertextOrgs)
			} else {
				assert.Equal(t, tc.want, snap.CiphertextOrgs)
			}
			assert.Equal(t, tc.ciphertext, snap.Ciphertext)
		})
	}
}

func TestTurnStateAndOwner(t *testing.T) {
	t.Parallel()
	u := msg("user", "x")
	cases := []struct {
		name  string
		turns []Turn
		want  Snapshot
	}{
		{
			name:  "recorded",
			turns: []Turn{{ResponseID: "r1", Input: items(u), AccountID: "acc_1", Organization: "org_a", TurnState: "ts_1"}},
			want:  Snapshot{LastResponseID: "r1", AccountID: "acc_1", Organization: "org_a", TurnState: "ts_1"},
		},
		{
			name: "kept on the same account",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), AccountID: "acc_1", Organization: "org_a", TurnState: "ts_1"},
				{ResponseID: "r2", PreviousResponseID: "r1", AccountID: "acc_1", Organization: "org_a"},
			},
			want: Snapshot{LastResponseID: "r2", AccountID: "acc_1", Organization: "org_a", TurnState: "ts_1"},
		},
		{
			name: "replaced by a new value",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), AccountID: "acc_1", TurnState: "ts_1"},
				{ResponseID: "r2", PreviousResponseID: "r1", AccountID: "acc_1", TurnState: "ts_2"},
			},
			want: Snapshot{LastResponseID: "r2", AccountID: "acc_1", TurnState: "ts_2"},
		},
		{
			name: "cleared when the account changes",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), AccountID: "acc_1", Organization: "org_a", TurnState: "ts_1"},
				{ResponseID: "r2", Input: items(u), AccountID: "acc_2", Organization: "org_b"},
			},
			want: Snapshot{LastResponseID: "r2", AccountID: "acc_2", Organization: "org_b"},
		},
		{
			name: "a turn without a response id is ignored",
			turns: []Turn{
				{ResponseID: "r1", Input: items(u), AccountID: "acc_1", TurnState: "ts_1"},
				{Input: items(u, u), AccountID: "acc_2"},
			},
			want: Snapshot{LastResponseID: "r1", AccountID: "acc_1", TurnState: "ts_1"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := New(Options{})
			for _, turn := range tc.turns {
				c.Commit(rootKey, turn)
			}
			snap, ok := c.Lookup(rootKey)
			require.True(t, ok)
			assert.Equal(t, tc.want.LastResponseID, snap.LastResponseID)
			assert.Equal(t, tc.want.AccountID, snap.AccountID)
			assert.Equal(t, tc.want.Organization, snap.Organization)
			assert.Equal(t, tc.want.TurnState, snap.TurnState)
			assert.True(t, snap.Replayable)
		})
	}
}

// Responses beyond MaxResponses are forgotten, oldest first.
func TestMaxResponses(t *testing.T) {
	t.Parallel()
	c := New(Options{MaxResponses: 3})
	var hist []json.RawMessage
	for i := 1; i <= 5; i++ {
		in := concat(hist, items(msg("user", fmt.Sprint(i))))
		c.Commit(rootKey, Turn{ResponseID: fmt.Sprintf("r%d", i), Input: in, AccountID: fmt.Sprintf("acc_%d", i)})
		hist = in
	}
	for i := 1; i <= 5; i++ {
		id := fmt.Sprintf("r%d", i)
		got, err := c.Resolve(rootKey, id, nil)
		_, owned := c.OwnerOf(rootKey, id)
		if i <= 2 {
			assert.ErrorIs(t, err, ErrUnknownResponse, id)
			assert.False(t, owned, id)
			continue
		}
		require.NoError(t, err, id)
		assert.Len(t, got, i)
		assert.True(t, owned, id)
	}
	snap, _ := c.Lookup(rootKey)
	assert.Equal(t, 3, snap.Responses)
}

// Callers may reuse their buffers: what Commit stores and what Resolve and
// Lookup hand out are copies.
func TestCopies(t *testing.T) {
	t.Parallel()
	c := New(Options{})
	in := []byte(`{"type":"message","role":"user","content":"hello"}`)
	out := []byte(`{"type":"function_call","call_id":"call_1","name":"x","arguments":"{}"}`)
	inputs := []json.RawMessage{in}
	c.Commit(rootKey, Turn{ResponseID: "r1", Input: inputs, Output: []json.RawMessage{out}, Organization: "org_a"})
	want := []string{string(in), string(out)}

	copy(in, bytes32('X', len(in)))
	copy(out, bytes32('Y', len(out)))
	inputs[0] = raw(`{}`)
	got, err := c.Resolve(rootKey, "r1", nil)
	require.NoError(t, err)
	assert.Equal(t, want, strs(got))

	got[0][0] = '!'
	got[1] = got[1][:2]
	newItem := []byte(`{"type":"message"}`)
	got2, err := c.Resolve(rootKey, "r1", []json.RawMessage{newItem})
	require.NoError(t, err)
	assert.Equal(t, append(want, `{"type":"message"}`), strs(got2))
	newItem[0] = '!'
	assert.Equal(t, `{"type":"message"}`, string(got2[2]), "new items are copied too")
	got2[0] = append(got2[0], "tail"...)
	assert.Equal(t, want[1], string(got2[1]), "appending to one item does not clobber the next")

	snap, _ := c.Lookup(rootKey)
	snap.UnresolvedCalls[0] = "changed"
	snap.CiphertextOrgs = append(snap.CiphertextOrgs, "org_z")
	again, _ := c.Lookup(rootKey)
	assert.Equal(t, []string{"call_1"}, again.UnresolvedCalls)
	assert.Empty(t, again.CiphertextOrgs)
}

func bytes32(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	c := New(Options{})
	assert.Equal(t, DefaultMaxEntries, c.opts.MaxEntries)
	assert.Equal(t, int64(DefaultMaxBytes), c.opts.MaxBytes)
	assert.Equal(t, DefaultIdleTTL, c.opts.IdleTTL)
	assert.Equal(t, DefaultMaxResponses, c.opts.MaxResponses)
	assert.NotNil(t, c.opts.Now)

	clk := newFakeClock()
	never := New(Options{IdleTTL: -1, Now: clk.Now})
	never.Commit(rootKey, oneItemTurn("r1", 50))
	clk.Advance(1000 * time.Hour)
	never.Sweep()
	_, err := never.Resolve(rootKey, "r1", nil)
	assert.NoError(t, err, "a negative IdleTTL disables expiry")
}
