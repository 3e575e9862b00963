package continuity

import (
	"bytes"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrUnknownResponse is returned by Resolve when the entry does not hold a
// replayable history for the response id: never seen on this key, evicted,
// expired, branched away from, or too large to retain. The relay then sends
// the request as the client gave it, or answers previous_response_not_found
// so that Codex resends the full request.
var ErrUnknownResponse = errors.New("continuity: unknown response id")

// Defaults for the zero Options.
const (
	DefaultMaxEntries   = 10000
	DefaultMaxBytes     = 256 << 20
	DefaultIdleTTL      = 2 * time.Hour
	DefaultMaxResponses = 64
)

// Key scopes an entry: the derived thread key (opaque, from the relay's
// identity derivation) and the client key scope (opaque). Entries of
// different keys never see each other: a sub-agent thread has its own key
// even though it shares the session (and the prompt_cache_key) with its root.
type Key struct {
	Thread string
	Scope  string
}

// Options bound a Cache. Zero values select the defaults.
type Options struct {
	// MaxEntries bounds the number of entries; beyond it the least recently
	// used entry goes. Default 10000.
	MaxEntries int
	// MaxBytes bounds the sum of the retained items' bytes; the least
	// recently used entries go until the sum is under it. An entry whose own
	// history is larger keeps its metadata but not its history. Default
	// 256 MiB.
	MaxBytes int64
	// IdleTTL drops an entry nobody committed to, resolved from or touched
	// for this long. Default 2h; negative disables expiry.
	IdleTTL time.Duration
	// MaxResponses bounds the response ids one entry remembers (for Resolve
	// from an older id and for OwnerOf); the oldest are forgotten first.
	// Codex chains from the last response of its connection, so a few
	// suffice. Default 64.
	MaxResponses int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Turn is one completed response on a thread, as the relay saw it.
type Turn struct {
	// ResponseID is the id from response.completed. A Turn without one is
	// ignored: nothing could refer to it.
	ResponseID string
	// PreviousResponseID, when set, says Input holds only the items sent
	// after the history as of that response: the request's
	// previous_response_id, as forwarded to the upstream that knew it. It
	// spares the caller resolving the whole history just to commit it. When
	// the entry does not hold that history, the new history is unknown: the
	// entry keeps its metadata but cannot replay until a full Commit.
	PreviousResponseID string
	// Input is the full input the upstream saw for this response (history
	// followed by the new items), unless PreviousResponseID is set.
	Input []json.RawMessage
	// Output holds the output items from response.output_item.done events,
	// in order.
	Output []json.RawMessage
	// AccountID is the account that produced the response.
	AccountID string
	// Organization is that account's organisation, the issuer of any
	// ciphertext in Output; it also accepted (so can read) any ciphertext in
	// Input this entry did not already attribute.
	Organization string
	// TurnState is the x-codex-turn-state for this thread, if any. An empty
	// value keeps the previous turn state while the account stays the same
	// and clears it when the account changes: turn state is issued by, and
	// only meaningful to, one account.
	TurnState string
	// Compaction marks the response to a compaction request (an input ending
	// in compaction_trigger, or the legacy compact route, whose answer is
	// Output). When Output holds a compaction item, the history becomes the
	// compacted one (see CompactedHistory) instead of the input followed by
	// the output: the response id resolves to it, a rebuild from it sends the
	// compaction item and not the history it stands for, and the ids of the
	// old history stop resolving past what the two share.
	Compaction bool
}

// Snapshot is a copy of an entry's state; the relay reads it to choose and
// explain an account. Changing it changes nothing in the Cache.
type Snapshot struct {
	// LastResponseID is the last committed response id.
	LastResponseID string
	// AccountID and Organization are those of the last committed turn.
	AccountID    string
	Organization string
	// TurnState is the thread's x-codex-turn-state (see Turn.TurnState).
	TurnState string
	// Replayable reports whether Resolve can rebuild from LastResponseID.
	Replayable bool
	// HistoryItems and HistoryBytes measure the retained history (that of
	// LastResponseID); both are zero when it is not retained.
	HistoryItems int
	HistoryBytes int64
	// Responses counts the response ids the entry remembers.
	Responses int
	// UnresolvedCalls lists, in order, the call_ids of tool calls
	// (function_call, custom_tool_call, local_shell_call, computer_call) in
	// the history that no *_call_output answers yet.
	UnresolvedCalls []string
	// Ciphertext reports that the history holds ciphertext (encrypted_content
	// on an item or a content part).
	Ciphertext bool
	// CiphertextOrgs lists, sorted, the organisations whose ciphertext is in
	// the history: when the thread must move, accounts of these read it.
	// Ciphertext committed with an empty Organization is not listed.
	CiphertextOrgs []string
	// LastUsed is when the entry was last committed, resolved or touched.
	LastUsed time.Time
}

// Cache is the thread-scoped replay and tool-continuity cache: per Key, the
// replayable history of the thread's last responses, their owners, the
// unresolved tool calls and the organisations whose ciphertext the history
// holds. It lives in memory and is bounded by entry count, by bytes and by
// idle time.
//
// A Cache is safe for concurrent use. It starts no goroutines: the owner
// calls Sweep from its own ticker (expired entries are also ignored and
// dropped when met). Everything it stores or hands out is a copy, so callers
// may reuse their buffers.
type Cache struct {
	opts Options // static after construction, defaults filled in

	mu      sync.Mutex
	entries map[Key]*entry // guarded by mu
	lru     list.List      // guarded by mu; of *entry, most recently used first
	bytes   int64          // guarded by mu; sum of entries' histBytes
}

// entry is one Key's state. All fields are guarded by Cache.mu.
type entry struct {
	key  Key
	elem *list.Element // in Cache.lru

	// replayable: history is the full history of last (else history is nil).
	replayable bool
	history    []item
	histBytes  int64

	points []point // response ids remembered, oldest first; at most MaxResponses
	last   string  // last committed response id

	account, org, turnState string

	unresolved []string // call ids, in order
	cipher     bool
	cipherOrgs []string // sorted
	lastUsed   time.Time
}

// item is one stored history item.
type item struct {
	raw    json.RawMessage // a private copy; never written after it is stored
	typ    string
	callID string
	cipher bool
	issuer string // organisation credited with the item's ciphertext; "" if none or unknown
}

// point is a response id the entry remembers.
type point struct {
	id      string
	account string
	n       int // history length as of the response; -1 when it cannot be replayed
}

// New returns an empty Cache bounded by o.
func New(o Options) *Cache {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.IdleTTL == 0 {
		o.IdleTTL = DefaultIdleTTL
	}
	if o.MaxResponses <= 0 {
		o.MaxResponses = DefaultMaxResponses
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Cache{opts: o, entries: make(map[Key]*entry)}
}

// Commit records a completed response on k: the history becomes the turn's
// full input followed by its output, t.ResponseID resolves to that history,
// and the account, organisation and turn state are recorded. Items the
// history already holds (the common case: the input starts with the previous
// history) are kept, not copied again; an input that departs from the stored
// history (a branch from an older response, a compaction, stripped
// ciphertext) replaces it from the point where they differ, and response ids
// past that point stop resolving. A compaction (Turn.Compaction) commits the
// compacted history the same way. A history larger than MaxBytes is not
// retained. Commit keeps the entry alive and may evict others.
func (c *Cache) Commit(k Key, t Turn) {
	if t.ResponseID == "" {
		return
	}
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()

	e := c.get(k, now)
	if e == nil {
		e = &entry{key: k, replayable: true}
		e.elem = c.lru.PushFront(e)
		c.entries[k] = e
	}
	if t.Compaction {
		t = e.compacted(t)
	}

	// base: the stored items the full input starts with; rest: the input
	// items after them.
	var base []item
	rest := t.Input
	known := true
	if t.PreviousResponseID != "" {
		n, ok := e.replayLen(t.PreviousResponseID)
		if ok {
			base = e.history[:n]
		} else {
			known = false
		}
	} else if e.replayable {
		p := 0
		for p < len(e.history) && p < len(t.Input) && bytes.Equal(e.history[p].raw, t.Input[p]) {
			p++
		}
		base, rest = e.history[:p], t.Input[p:]
	}

	tail := make([]item, 0, len(rest)+len(t.Output))
	var size int64
	for _, it := range base {
		size += int64(len(it.raw))
	}
	for _, part := range [2][]json.RawMessage{rest, t.Output} {
		for _, data := range part {
			info := inspect(data)
			it := item{raw: data, typ: info.typ, callID: info.callID, cipher: info.cipher()}
			if it.cipher {
				it.issuer = t.Organization
			}
			tail = append(tail, it)
			size += int64(len(data))
		}
	}

	c.bytes -= e.histBytes
	switch {
	case known && size <= c.opts.MaxBytes:
		for i := range tail {
			tail[i].raw = bytes.Clone(tail[i].raw)
		}
		old := e.history
		e.history = append(e.history[:len(base)], tail...)
		if len(old) > len(e.history) {
			clear(old[len(e.history):]) // let the dropped items go
		}
		for i := range e.points {
			if e.points[i].n > len(base) {
				e.points[i].n = -1
			}
		}
		e.replayable = true
		e.histBytes = size
		e.unresolved, e.cipher, e.cipherOrgs = derive(nil, false, nil, e.history, nil)
	default:
		if known {
			e.unresolved, e.cipher, e.cipherOrgs = derive(nil, false, nil, base, tail)
		} else {
			// The history before Input is unknown: carry what the entry
			// knew forward, as the best estimate there is.
			e.unresolved, e.cipher, e.cipherOrgs = derive(e.unresolved, e.cipher, e.cipherOrgs, nil, tail)
		}
		clear(e.history)
		e.history = nil
		e.replayable = false
		e.histBytes = 0
		for i := range e.points {
			e.points[i].n = -1
		}
	}
	c.bytes += e.histBytes

	n := -1
	if e.replayable {
		n = len(e.history)
	}
	e.addPoint(point{id: t.ResponseID, account: t.AccountID, n: n}, c.opts.MaxResponses)
	e.last = t.ResponseID
	switch {
	case t.TurnState != "":
		e.turnState = t.TurnState
	case t.AccountID != e.account:
		e.turnState = ""
	}
	e.account = t.AccountID
	e.org = t.Organization
	c.touch(e, now)
	c.evict()
}

// derive computes an entry's unresolved calls, ciphertext flag and
// ciphertext organisations from earlier values and the items a then b.
func derive(unresolved []string, cipher bool, orgs []string, a, b []item) ([]string, bool, []string) {
	unresolved = slices.Clone(unresolved)
	orgs = slices.Clone(orgs)
	for _, part := range [2][]item{a, b} {
		for _, it := range part {
			if it.cipher {
				cipher = true
				if it.issuer != "" && !slices.Contains(orgs, it.issuer) {
					orgs = append(orgs, it.issuer)
				}
			}
			if it.callID == "" {
				continue
			}
			switch {
			case isToolCall(it.typ):
				unresolved = append(unresolved, it.callID)
			case isToolOutput(it.typ):
				if i := slices.Index(unresolved, it.callID); i >= 0 {
					unresolved = slices.Delete(unresolved, i, i+1)
				}
			}
		}
	}
	slices.Sort(orgs)
	if len(unresolved) == 0 {
		unresolved = nil
	}
	return unresolved, cipher, orgs
}

// Resolve returns the full input for a request that chains from
// previousResponseID on k: the history as of that response followed by
// newItems. Any response id the entry still remembers resolves, not only the
// last. It returns ErrUnknownResponse (wrapped) when the entry cannot replay
// that id; it never looks at another key's entry. The result is a fresh copy.
// Resolve keeps the entry alive.
func (c *Cache) Resolve(k Key, previousResponseID string, newItems []json.RawMessage) ([]json.RawMessage, error) {
	now := c.opts.Now()
	c.mu.Lock()
	e := c.get(k, now)
	if e == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("resolve %q: %w", previousResponseID, ErrUnknownResponse)
	}
	c.touch(e, now)
	n, ok := e.replayLen(previousResponseID)
	if !ok {
		c.mu.Unlock()
		return nil, fmt.Errorf("resolve %q: %w", previousResponseID, ErrUnknownResponse)
	}
	out := make([]json.RawMessage, n+len(newItems))
	size := 0
	for i, it := range e.history[:n] {
		out[i] = it.raw
		size += len(it.raw)
	}
	c.mu.Unlock()

	// Stored item bytes are never written, so they are copied outside the
	// lock; one buffer holds the whole result.
	copy(out[n:], newItems)
	for _, it := range newItems {
		size += len(it)
	}
	buf := make([]byte, 0, size)
	for i, it := range out {
		start := len(buf)
		buf = append(buf, it...)
		out[i] = buf[start:len(buf):len(buf)]
	}
	return out, nil
}

// Lookup returns a copy of k's entry, and false when there is none. It does
// not count as activity.
func (c *Cache) Lookup(k Key) (Snapshot, bool) {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.get(k, now)
	if e == nil {
		return Snapshot{}, false
	}
	return Snapshot{
		LastResponseID:  e.last,
		AccountID:       e.account,
		Organization:    e.org,
		TurnState:       e.turnState,
		Replayable:      e.replayable,
		HistoryItems:    len(e.history),
		HistoryBytes:    e.histBytes,
		Responses:       len(e.points),
		UnresolvedCalls: slices.Clone(e.unresolved),
		Ciphertext:      e.cipher,
		CiphertextOrgs:  slices.Clone(e.cipherOrgs),
		LastUsed:        e.lastUsed,
	}, true
}

// OwnerOf returns the account that produced responseID on k: hard evidence
// that only that account can continue from it. It answers for every id the
// entry remembers, replayable or not, and does not count as activity.
func (c *Cache) OwnerOf(k Key, responseID string) (accountID string, ok bool) {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.get(k, now)
	if e == nil {
		return "", false
	}
	if i := e.find(responseID); i >= 0 {
		return e.points[i].account, true
	}
	return "", false
}

// Touch records activity on k, so a long-lived thread that is active (an open
// socket, a turn under way) does not expire between commits. It does not
// create an entry.
func (c *Cache) Touch(k Key) {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.get(k, now); e != nil {
		c.touch(e, now)
	}
}

// Drop removes k's entry (an operator reset).
func (c *Cache) Drop(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[k]; e != nil {
		c.remove(e)
	}
}

// Len returns the number of entries and the sum of their retained item
// bytes, counting expired entries that no Sweep or access has dropped yet.
func (c *Cache) Len() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

// Sweep drops the entries idle for IdleTTL or longer. The owner calls it from
// its own ticker. It walks from the least recently used end and stops at the
// first live entry, so it costs what it drops (given a clock that does not
// run backwards; an entry it misses still expires when next met).
func (c *Cache) Sweep() {
	now := c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// The list is in last-use order, so the idle entries are at the back.
	for el := c.lru.Back(); el != nil; {
		e := el.Value.(*entry)
		if !c.expired(e, now) {
			return
		}
		el = el.Prev()
		c.remove(e)
	}
}

// get returns k's entry, dropping it when it has expired. c.mu must be held.
func (c *Cache) get(k Key, now time.Time) *entry {
	e := c.entries[k]
	if e != nil && c.expired(e, now) {
		c.remove(e)
		return nil
	}
	return e
}

func (c *Cache) expired(e *entry, now time.Time) bool {
	return c.opts.IdleTTL > 0 && now.Sub(e.lastUsed) >= c.opts.IdleTTL
}

// touch marks e used now. c.mu must be held.
func (c *Cache) touch(e *entry, now time.Time) {
	if now.After(e.lastUsed) {
		e.lastUsed = now
	}
	c.lru.MoveToFront(e.elem)
}

// remove forgets e. c.mu must be held.
func (c *Cache) remove(e *entry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	c.bytes -= e.histBytes
}

// evict drops least recently used entries until the bounds hold. The front
// entry (the one just committed) stays: its history alone fits MaxBytes.
// c.mu must be held.
func (c *Cache) evict() {
	for c.lru.Len() > 1 && (c.lru.Len() > c.opts.MaxEntries || c.bytes > c.opts.MaxBytes) {
		c.remove(c.lru.Back().Value.(*entry))
	}
}

// compacted returns t as the commit of the compacted history: its whole
// input (the entry's history behind its PreviousResponseID, then its items)
// compacted with its output, chained to nothing. t is returned unchanged
// when nothing was compacted, or when the history behind its chain is
// unknown (the commit then leaves the entry unable to replay, as for any
// turn whose history is unknown). c.mu must be held.
func (e *entry) compacted(t Turn) Turn {
	input := t.Input
	if t.PreviousResponseID != "" {
		n, ok := e.replayLen(t.PreviousResponseID)
		if !ok {
			return t
		}
		input = make([]json.RawMessage, 0, n+len(t.Input))
		for _, it := range e.history[:n] {
			input = append(input, it.raw)
		}
		input = append(input, t.Input...)
	}
	h, ok := CompactedHistory(input, t.Output)
	if !ok {
		return t
	}
	t.Input, t.Output, t.PreviousResponseID = h, nil, ""
	return t
}

// replayLen returns the history length as of response id, if the entry can
// replay it.
func (e *entry) replayLen(id string) (int, bool) {
	if !e.replayable || id == "" {
		return 0, false
	}
	if i := e.find(id); i >= 0 && e.points[i].n >= 0 {
		return e.points[i].n, true
	}
	return 0, false
}

// find returns the index of id in e.points, or -1. The newest is the likeliest
// to be asked for, so the search runs backwards.
func (e *entry) find(id string) int {
	for i := len(e.points) - 1; i >= 0; i-- {
		if e.points[i].id == id {
			return i
		}
	}
	return -1
}

// addPoint remembers p, forgetting an earlier record of the same id and the
// oldest ids beyond max.
func (e *entry) addPoint(p point, max int) {
	if i := e.find(p.id); i >= 0 {
		e.points = slices.Delete(e.points, i, i+1)
	}
	if over := len(e.points) + 1 - max; over > 0 {
		e.points = slices.Delete(e.points, 0, over)
	}
	e.points = append(e.points, p)
}
