package store

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"golang.org/x/sync/singleflight"
)

// maxCachedStmts bounds the statement cache. The queries that go through
// it are fixed texts or a few variants of one, far fewer than this; past
// it a query runs unprepared rather than growing the cache.
const maxCachedStmts = 128

// stmtCache holds a prepared statement per query text, so the hot queries
// of the request path (bindings, credentials, request log, usage) are
// parsed once instead of on every request: on SQLite, parsing was a third
// of the database time per turn. database/sql prepares a cached statement
// on each pooled connection as it is first used there.
//
// A lookup takes no lock: every query of every request looks here, and
// under a burst a mutex held for a map read became a convoy (on
// PostgreSQL, 200 new threads at once spent more time queued for it than
// for the database). One caller prepares a query; the others run it
// unprepared meanwhile instead of preparing it too or waiting.
type stmtCache struct {
	stmts sync.Map // query text as written (before rebinding) -> *stmtEntry
	n     atomic.Int32
	// mu orders close with the end of a prepare, so that no statement is
	// stored after close.
	mu     sync.Mutex
	closed atomic.Bool
}

// stmtEntry is one query's statement; nil while its first caller prepares it.
type stmtEntry struct{ st atomic.Pointer[sqlx.Stmt] }

// prepared returns the statement for query, preparing it on first use; nil
// when the cache is full or closed, or while another caller prepares it
// (the caller then runs the query as is).
func (s *Store) prepared(ctx context.Context, query string) (*sqlx.Stmt, error) {
	c := &s.stmts
	if st, known := c.lookup(query); known {
		return st, nil
	}
	if c.closed.Load() || c.n.Load() >= maxCachedStmts {
		return nil, nil
	}
	e := new(stmtEntry)
	if v, loaded := c.stmts.LoadOrStore(query, e); loaded {
		return v.(*stmtEntry).st.Load(), nil
	}
	if c.n.Add(1) > maxCachedStmts {
		// Lost the race for the last places.
		c.stmts.Delete(query)
		c.n.Add(-1)
		return nil, nil
	}
	st, err := s.db.PreparexContext(ctx, s.q(query))
	if err != nil {
		// The next caller tries again.
		c.stmts.Delete(query)
		c.n.Add(-1)
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		st.Close()
		return nil, nil
	}
	e.st.Store(st)
	return st, nil
}

// lookup returns the cached statement for query, and whether query has an
// entry (its statement is nil while it is being prepared).
func (c *stmtCache) lookup(query string) (st *sqlx.Stmt, known bool) {
	v, ok := c.stmts.Load(query)
	if !ok {
		return nil, false
	}
	return v.(*stmtEntry).st.Load(), true
}

// size is how many queries the cache holds (or is preparing).
func (c *stmtCache) size() int { return int(c.n.Load()) }

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed.Store(true)
	c.stmts.Range(func(k, v any) bool {
		if st := v.(*stmtEntry).st.Load(); st != nil {
			st.Close()
		}
		c.stmts.Delete(k)
		return true
	})
}

// sharedReadTimeout bounds a read shared by the callers that missed one
// cache entry at the same time (see shared).
const sharedReadTimeout = 10 * time.Second

// shared runs read once for all the callers asking for key at the same
// time: a burst of requests that miss one cache entry (a relay just
// started, a listing just dropped) reads it once instead of once each,
// queued for connections. The read runs without the first caller's
// cancellation (a client that hangs up fails no one else's request),
// under sharedReadTimeout; each caller waits for it as long as its own
// ctx lets it. Keys carry the cache's generation, so a caller that wrote
// never gets a read begun before its write.
func shared[T any](ctx context.Context, g *singleflight.Group, key string, read func(context.Context) (T, error)) (T, error) {
	ch := g.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedReadTimeout)
		defer cancel()
		return read(rctx)
	})
	var zero T
	select {
	case r := <-ch:
		if r.Err != nil {
			return zero, r.Err
		}
		return r.Val.(T), nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// flightKey is a shared read's key: what is read, under which generation.
func flightKey(what string, gen uint64, id string) string {
	return what + ":" + strconv.FormatUint(gen, 10) + ":" + id
}

// execFunc runs a statement written with ? placeholders: s.exec, or one
// of execIn's inside a transaction.
type execFunc func(ctx context.Context, query string, args ...any) (sql.Result, error)

// execIn is exec inside tx: the cached statement bound to the transaction,
// or the query run as is. It never prepares: that would take a second
// connection while tx holds one, and a full pool of transactions each
// waiting for another connection is a deadlock. Callers warm the cache
// before they begin (see warm).
func (s *Store) execIn(tx *sqlx.Tx) execFunc {
	return func(ctx context.Context, query string, args ...any) (sql.Result, error) {
		if st, _ := s.stmts.lookup(query); st != nil {
			return tx.StmtxContext(ctx, st).ExecContext(ctx, args...)
		}
		return tx.ExecContext(ctx, s.q(query), args...)
	}
}

// warm prepares queries into the cache, outside any transaction; a query
// that cannot be prepared now simply runs unprepared later.
func (s *Store) warm(ctx context.Context, queries ...string) {
	for _, q := range queries {
		_, _ = s.prepared(ctx, q)
	}
}

// exec runs a statement written with ? placeholders, prepared once: a
// write, which on SQLite waits its turn with the transactions (writeTx)
// rather than polling for the database's lock.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer s.writeTurn()()
	st, err := s.prepared(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return s.db.ExecContext(ctx, s.q(query), args...)
	}
	return st.ExecContext(ctx, args...)
}

// writeTurn waits for a write's turn on SQLite (see Store.writeTx) and
// returns its end; on PostgreSQL writes need no turn.
func (s *Store) writeTurn() (end func()) {
	if s.loc.Dialect != SQLite {
		return func() {}
	}
	s.writeTx.Lock()
	return s.writeTx.Unlock
}

// writeQuery runs a write that returns rows (RETURNING) into dest, a
// pointer to a slice, prepared once; on SQLite it waits its turn with the
// other writes, as exec's do.
func (s *Store) writeQuery(ctx context.Context, dest any, query string, args ...any) error {
	defer s.writeTurn()()
	return s.selectAll(ctx, dest, query, args...)
}

// execUnprepared runs a write whose text varies (an IN list, a changing
// SET), unprepared; on SQLite it waits its turn with the other writes, as
// exec's do.
func (s *Store) execUnprepared(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer s.writeTurn()()
	return s.db.ExecContext(ctx, s.q(query), args...)
}

// writeQueryUnprepared is writeQuery for a write whose text varies (a
// batch's VALUES), unprepared.
func (s *Store) writeQueryUnprepared(ctx context.Context, dest any, query string, args ...any) error {
	defer s.writeTurn()()
	return s.db.SelectContext(ctx, dest, s.q(query), args...)
}

// get reads one row into dest (sql.ErrNoRows when there is none).
func (s *Store) get(ctx context.Context, dest any, query string, args ...any) error {
	st, err := s.prepared(ctx, query)
	if err != nil {
		return err
	}
	if st == nil {
		return s.db.GetContext(ctx, dest, s.q(query), args...)
	}
	return st.GetContext(ctx, dest, args...)
}

// selectAll reads every row into dest, a pointer to a slice.
func (s *Store) selectAll(ctx context.Context, dest any, query string, args ...any) error {
	st, err := s.prepared(ctx, query)
	if err != nil {
		return err
	}
	if st == nil {
		return s.db.SelectContext(ctx, dest, s.q(query), args...)
	}
	return st.SelectContext(ctx, dest, args...)
}

// accountsTTL bounds how long a listing of the accounts is reused. Writes
// through this Store drop it at once; the TTL is how soon a change made by
// another process (a second replica, the CLI on the same file) is seen.
const accountsTTL = time.Second

// accountsCache keeps the last listing of the accounts: selection reads
// every account on every request, and they change seldom. It keeps the
// accounts' credentials read for requests too (see CurrentCredentials).
type accountsCache struct {
	mu      sync.Mutex
	gen     uint64 // bumped after every write to the accounts table
	list    []Account
	listGen uint64
	at      time.Time
	// credGen is bumped with gen, except by usage writes, which leave
	// credentials as they are.
	credGen uint64
	creds   map[string]cachedCred
}

// cachedCred is an account's credentials as read at at. Every entry is of
// the current credGen: changed empties the map as it bumps it.
type cachedCred struct {
	cred Credentials
	exp  time.Time
	at   time.Time
}

// changed drops the cached listing and credentials. Writers call it after
// their write is committed (deferred), so a read made before the commit is
// never kept.
func (c *accountsCache) changed() {
	c.mu.Lock()
	c.gen++
	c.list = nil
	c.credGen++
	c.creds = nil
	c.mu.Unlock()
}

// cachedCred returns account id's credentials if a current read is kept,
// and the generation a fresh read must be kept under.
func (c *accountsCache) cachedCred(id string, now time.Time) (Credentials, time.Time, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.creds[id]
	if age := now.Sub(e.at); ok && age >= 0 && age < accountsTTL {
		return e.cred, e.exp, c.credGen, true
	}
	return Credentials{}, time.Time{}, c.credGen, false
}

// keepCred keeps credentials read under generation gen, unless a write
// came after the read began.
func (c *accountsCache) keepCred(id string, cred Credentials, exp time.Time, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.credGen {
		return
	}
	if c.creds == nil {
		c.creds = map[string]cachedCred{}
	}
	c.creds[id] = cachedCred{cred: cred, exp: exp, at: at}
}

// cached returns the listing if it is current, and the generation a fresh
// read must be stored under.
func (c *accountsCache) cached(now time.Time) ([]Account, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current(now) {
		return slices.Clone(c.list), c.gen, true
	}
	return nil, c.gen, false
}

// current reports whether the cached listing may be used at now. The
// caller holds mu.
func (c *accountsCache) current(now time.Time) bool {
	age := now.Sub(c.at)
	return c.list != nil && c.listGen == c.gen && age >= 0 && age < accountsTTL
}

// keep stores a listing read under generation gen, unless a write came
// after the read began.
func (c *accountsCache) keep(list []Account, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen == c.gen {
		c.list, c.listGen, c.at = slices.Clone(list), gen, at
	}
}

// usageWritten follows a committed write of account id's usage windows
// (written at at): a current listing takes them in place instead of being
// dropped. Every response reports usage; dropping the listing each time
// made the next requests read every account again, and under a burst on
// PostgreSQL they queued for connections to do it. A listing being read
// while the write committed is not kept (the generation moves on), as for
// any write.
func (c *accountsCache) usageWritten(id string, primary, secondary Window, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	current := c.list != nil && c.listGen == c.gen
	c.gen++
	if !current {
		c.list = nil
		return
	}
	// As read back from the database: times in whole milliseconds.
	stored := func(w Window) Window {
		w.ResetAt = fromMillis(millis(w.ResetAt))
		return w
	}
	// cached hands out copies: the elements can change in place.
	for i := range c.list {
		if c.list[i].ID != id {
			continue
		}
		if primary.Known {
			c.list[i].Primary = stored(primary)
		}
		if secondary.Known {
			c.list[i].Secondary = stored(secondary)
		}
		c.list[i].UsageUpdatedAt = at
	}
	c.listGen = c.gen
}

// usageRewrite is how often an unchanged usage report is written anyway,
// so usage_updated_at still tells how fresh the windows are.
const usageRewrite = 30 * time.Second

// usageUnchanged reports whether the cached listing already holds these
// windows for account id (a reset time within a minute counts as the same:
// relative resets drift with the clock), written less than usageRewrite
// before now. Every response reports usage; most reports repeat the last.
func (c *accountsCache) usageUnchanged(id string, primary, secondary Window, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.current(now) {
		return false
	}
	for _, a := range c.list {
		if a.ID != id {
			continue
		}
		return now.Sub(a.UsageUpdatedAt) < usageRewrite && sameWindow(a.Primary, primary) && sameWindow(a.Secondary, secondary)
	}
	return false
}

// sameWindow compares a stored window with a report; an unreported window
// (Known false) leaves the stored one as it is, so it matches.
func sameWindow(stored, reported Window) bool {
	if !reported.Known {
		return true
	}
	d := stored.ResetAt.Sub(reported.ResetAt)
	return stored.Known && stored.UsedPercent == reported.UsedPercent && stored.WindowMinutes == reported.WindowMinutes &&
		stored.ResetAt.IsZero() == reported.ResetAt.IsZero() && d < time.Minute && d > -time.Minute
}

// accountsChanged follows every write to the accounts table: this store's
// listing is dropped, and the other replicas are told to drop theirs. An
// announcement that fails leaves them the listing's one-second TTL.
func (s *Store) accountsChanged(ctx context.Context) {
	s.accts.changed()
	if s.loc.Dialect != Postgres {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = s.Announce(ctx, Announcement{Kind: AnnounceAccounts})
}

// keysTTL bounds how long a key read by id is reused; writes through any
// replica drop the reads at once (keysChanged), so the TTL only covers an
// announcement that went missing.
const keysTTL = 10 * time.Second

// maxCachedKeys bounds the key cache; past it, it starts afresh.
const maxCachedKeys = 4096

// keysCache keeps client keys read by id (or found by their secret's
// hash: see byHash), and whether any key was ever created. Safe for
// concurrent use.
type keysCache struct {
	mu   sync.Mutex
	gen  uint64 // bumped after every write to a key
	byID map[string]cachedKey
	ever bool // a key exists (keys are never deleted): keyless mode is over
	// noneAt is when the table was last read empty (zero: not read, or a
	// key was written since).
	noneAt time.Time
}

type cachedKey struct {
	key ClientKey
	gen uint64
	at  time.Time
}

// changed drops the keys read, and what a read of an empty table said:
// a key may have been written since.
func (c *keysCache) changed() {
	c.mu.Lock()
	c.gen++
	c.byID = nil
	c.noneAt = time.Time{}
	c.mu.Unlock()
}

// cached returns the key read for id if it is current, and the generation
// a fresh read must be kept under.
func (c *keysCache) cached(id string, now time.Time) (ClientKey, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[id]
	if age := now.Sub(e.at); ok && e.gen == c.gen && age >= 0 && age < keysTTL {
		return e.key, c.gen, true
	}
	return ClientKey{}, c.gen, false
}

// keep stores a key read under generation gen, unless a write came after
// the read began.
func (c *keysCache) keep(id string, k ClientKey, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.byID == nil || len(c.byID) >= maxCachedKeys {
		c.byID = map[string]cachedKey{}
	}
	c.byID[id] = cachedKey{key: k, gen: gen, at: at}
}

// everCreated answers KeysEverCreated from memory when it can (known).
func (c *keysCache) everCreated(now time.Time) (ever, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ever {
		return true, true
	}
	age := now.Sub(c.noneAt)
	return false, !c.noneAt.IsZero() && age >= 0 && age < keysTTL
}

// sawKeys notes what a count of the keys found at now.
func (c *keysCache) sawKeys(any bool, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if any {
		c.ever = true
	} else if !c.ever {
		c.noneAt = now
	}
}

// setEverCreated notes a key written: keyless mode is over.
func (c *keysCache) setEverCreated() {
	c.mu.Lock()
	c.ever, c.noneAt = true, time.Time{}
	c.mu.Unlock()
}

// keysChanged follows every write to a client key: this store's reads are
// dropped, and the other replicas are told to drop theirs, so a revoked key
// stops working at once on every replica, open WebSockets included.
func (s *Store) keysChanged(ctx context.Context) {
	s.keys.changed()
	s.keys.setEverCreated()
	if s.loc.Dialect != Postgres {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = s.Announce(ctx, Announcement{Kind: AnnounceKeys})
}
