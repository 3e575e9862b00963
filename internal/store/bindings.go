package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// BindingKind says what a binding's key is.
type BindingKind string

const (
	// BindThread: key is a derived thread key; soft, bounded by an idle TTL.
	BindThread BindingKind = "thread"
	// BindSession: key is a derived process-session key: the preference new
	// threads of a tree start on; soft, bounded.
	BindSession BindingKind = "session"
	// BindRawSession: key is a raw session id pinned by an operator (or
	// imported); hard. Scope-independent.
	BindRawSession BindingKind = "raw_session"
	// BindRawThread: key is a raw thread id pinned by an operator; hard.
	BindRawThread BindingKind = "raw_thread"
)

// Valid reports whether k is a known kind.
func (k BindingKind) Valid() bool {
	return k == BindThread || k == BindSession || k == BindRawSession || k == BindRawThread
}

// Strength says whether a binding is evidence (hard) or a preference (soft).
type Strength string

const (
	Hard Strength = "hard"
	Soft Strength = "soft"
)

// Binding is a stored decision "this key is served by that account".
type Binding struct {
	ID          string
	Key         string
	Kind        BindingKind
	Strength    Strength
	AccountID   string
	ClientScope string // client key id the row belongs to; "" for keyless clients and pins
	SessionID   string // raw session, for operators' searches
	ThreadID    string // raw thread, for operators' searches
	Source      string // how it was set: admission, move, pin, retirement, ...
	CreatedAt   time.Time
	LastSeenAt  time.Time
	ExpiresAt   time.Time // zero: never (hard rows)
	// AbandonedScope, when set, records that the row was retired for that
	// interpretation and by which source (seed 003); it then no longer binds.
	AbandonedScope string
}

type bindingRow struct {
	ID             string  `db:"id"`
	Key            string  `db:"binding_key"`
	Kind           string  `db:"kind"`
	Strength       string  `db:"strength"`
	AccountID      string  `db:"account_id"`
	ClientScope    string  `db:"client_scope"`
	SessionID      string  `db:"session_id"`
	ThreadID       string  `db:"thread_id"`
	Source         string  `db:"source"`
	CreatedAt      int64   `db:"created_at"`
	LastSeenAt     int64   `db:"last_seen_at"`
	ExpiresAt      *int64  `db:"expires_at"`
	AbandonedScope *string `db:"abandoned_scope"`
}

func (r bindingRow) binding() Binding {
	b := Binding{
		ID: r.ID, Key: r.Key, Kind: BindingKind(r.Kind), Strength: Strength(r.Strength), AccountID: r.AccountID,
		ClientScope: r.ClientScope, SessionID: r.SessionID, ThreadID: r.ThreadID, Source: r.Source,
		CreatedAt: time.UnixMilli(r.CreatedAt).UTC(), LastSeenAt: time.UnixMilli(r.LastSeenAt).UTC(),
		ExpiresAt: fromMillis(r.ExpiresAt),
	}
	if r.AbandonedScope != nil {
		b.AbandonedScope = *r.AbandonedScope
	}
	return b
}

const bindingColumns = `id, binding_key, kind, strength, account_id, client_scope, session_id, thread_id, source,
	created_at, last_seen_at, expires_at, abandoned_scope`

// BindingLookup names the rows that may bear on one request.
type BindingLookup struct {
	ClientScope string
	ThreadKey   string // derived thread key (may be a session-only key)
	SessionKey  string // derived process-session key
	RawSession  string
	RawThread   string
}

// BindingsFor returns the live rows for a request: its thread row and
// process-session preference within the client scope, and any operator pin of
// its raw session or raw thread. Expired and abandoned rows are left out.
// Lookups made at the same time share one read (see batcher).
func (s *Store) BindingsFor(ctx context.Context, l BindingLookup) ([]Binding, error) {
	if l.ThreadKey == "" && l.SessionKey == "" && l.RawSession == "" && l.RawThread == "" {
		return nil, nil // asks for no row
	}
	rows, err := s.bindingReads.do(ctx, l)
	if err != nil {
		return nil, fmt.Errorf("read bindings: %w", err)
	}
	return rows, nil
}

// keys is the binding keys l asks for, of whatever kind.
func (l BindingLookup) keys() []string {
	var keys []string
	for _, k := range [...]string{l.ThreadKey, l.SessionKey, l.RawSession, l.RawThread} {
		if k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// wants reports whether row r is one l asks for: its thread or session row
// in l's client scope, or a pin of its raw session or thread in any. Pure.
func (l BindingLookup) wants(r bindingRow) bool {
	switch BindingKind(r.Kind) {
	case BindThread:
		return l.ThreadKey != "" && r.Key == l.ThreadKey && r.ClientScope == l.ClientScope
	case BindSession:
		return l.SessionKey != "" && r.Key == l.SessionKey && r.ClientScope == l.ClientScope
	case BindRawSession:
		return l.RawSession != "" && r.Key == l.RawSession
	case BindRawThread:
		return l.RawThread != "" && r.Key == l.RawThread
	}
	return false
}

// bindingsQueries[i] reads the live rows of 1<<i binding keys, of any
// kind and scope (the kinds are named so the unique index on kind,
// binding_key, client_scope serves the read); a read pads its keys up to
// the next of these sizes (repeating its last), so a few prepared
// statements serve every batch. An IN list, not an OR of (kind, key)
// pairs: PostgreSQL plans 256 ORed pairs in about 5 ms, this in under 1.
var bindingsQueries = func() []string {
	var qs []string
	for n := 1; n <= 4*batchMax; n *= 2 {
		qs = append(qs, `SELECT `+bindingColumns+` FROM bindings
		WHERE kind IN ('`+string(BindThread)+`', '`+string(BindSession)+`', '`+string(BindRawSession)+`', '`+string(BindRawThread)+`')
		AND binding_key IN (`+strings.Repeat("?, ", n-1)+`?)
		AND (expires_at IS NULL OR expires_at > ?) AND abandoned_scope IS NULL`)
	}
	return qs
}()

// readBindings answers lookups with one read: the rows of every key they
// ask for, whatever their kind and scope, each lookup then given those it
// wants.
func (s *Store) readBindings(ctx context.Context, ls []BindingLookup) ([][]Binding, error) {
	var keys []string
	seen := map[string]bool{}
	for _, l := range ls {
		for _, k := range l.keys() {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	size := 0
	for 1<<size < len(keys) {
		size++
	}
	args := make([]any, 0, 1<<size+1)
	for i := range 1 << size {
		args = append(args, keys[min(i, len(keys)-1)])
	}
	args = append(args, s.now().UnixMilli())
	var rows []bindingRow
	if err := s.selectAll(ctx, &rows, bindingsQueries[size], args...); err != nil {
		return nil, err
	}
	out := make([][]Binding, len(ls))
	for i, l := range ls {
		for _, r := range rows {
			if l.wants(r) {
				out[i] = append(out[i], r.binding())
			}
		}
	}
	return out, nil
}

// Placement records where a request was served, for its thread and, on a
// first admission, its process session.
type Placement struct {
	ClientScope string
	ThreadKey   string
	SessionKey  string // empty: no process preference to seed
	SessionID   string
	ThreadID    string
	AccountID   string
	Source      string
	// TTL bounds the soft rows: they expire after TTL without activity.
	TTL time.Duration
	// SeedSession inserts the process preference when absent (or expired),
	// in the same transaction as the thread row. A later move leaves it.
	SeedSession bool
	// At is set on a placement written late (retried after the database
	// refused it): when the relay decided it. A thread row written or
	// touched after At is then left as it is, so a late placement never
	// undoes a later one. Zero: written now, as decided now, over whatever
	// the row holds (the clocks of several replicas need not agree to the
	// millisecond for a move to take).
	At time.Time
}

// Place upserts the thread row (only that thread's row is ever rewritten)
// and, when asked, inserts the process-session preference if absent, in one
// transaction: a process default without its initiating thread would be
// false evidence.
func (s *Store) Place(ctx context.Context, p Placement) error {
	if p.ThreadKey == "" || p.AccountID == "" {
		return errors.New("place: thread key and account required")
	}
	now, late := s.now(), ""
	if !p.At.IsZero() {
		now, late = p.At, ` WHERE bindings.last_seen_at <= excluded.last_seen_at`
	}
	exp := now.Add(p.TTL).UnixMilli()
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		if p.SeedSession && p.SessionKey != "" && p.SessionKey != p.ThreadKey {
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO bindings (id, binding_key, kind, strength, account_id, client_scope,
				session_id, thread_id, source, created_at, last_seen_at, expires_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?)
				ON CONFLICT (kind, binding_key, client_scope) DO UPDATE SET account_id = excluded.account_id,
					source = excluded.source, created_at = excluded.created_at, last_seen_at = excluded.last_seen_at,
					expires_at = excluded.expires_at, id = excluded.id
				WHERE bindings.expires_at IS NOT NULL AND bindings.expires_at <= ?`),
				NewID("bnd", now), p.SessionKey, string(BindSession), string(Soft), p.AccountID, p.ClientScope,
				p.SessionID, p.Source, now.UnixMilli(), now.UnixMilli(), exp, now.UnixMilli())
			if err != nil {
				return fmt.Errorf("seed session preference: %w", err)
			}
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO bindings (id, binding_key, kind, strength, account_id, client_scope,
			session_id, thread_id, source, created_at, last_seen_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (kind, binding_key, client_scope) DO UPDATE SET
				account_id = excluded.account_id,
				source = CASE WHEN bindings.account_id = excluded.account_id THEN bindings.source ELSE excluded.source END,
				last_seen_at = excluded.last_seen_at, expires_at = excluded.expires_at, abandoned_scope = NULL`+late),
			NewID("bnd", now), p.ThreadKey, string(BindThread), string(Soft), p.AccountID, p.ClientScope,
			p.SessionID, p.ThreadID, p.Source, now.UnixMilli(), now.UnixMilli(), exp)
		if err != nil {
			return fmt.Errorf("place thread: %w", err)
		}
		return nil
	})
}

// TouchBindings keeps the soft rows of an active thread fresh.
func (s *Store) TouchBindings(ctx context.Context, ids []string, ttl time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	now := s.now()
	q, args, err := sqlx.In(`UPDATE bindings SET last_seen_at = ?, expires_at = ? WHERE id IN (?) AND strength = ?`,
		now.UnixMilli(), now.Add(ttl).UnixMilli(), ids, string(Soft))
	if err != nil {
		return err
	}
	if _, err := s.execUnprepared(ctx, q, args...); err != nil {
		return fmt.Errorf("touch bindings: %w", err)
	}
	return nil
}

// Pin makes a hard operator binding of a raw session or raw thread to an
// account, replacing an earlier pin of the same key.
func (s *Store) Pin(ctx context.Context, kind BindingKind, raw, accountID, source string) (Binding, error) {
	if kind != BindRawSession && kind != BindRawThread {
		return Binding{}, fmt.Errorf("pin: kind %q cannot be pinned", kind)
	}
	now := s.now()
	var sessionID, threadID string
	if kind == BindRawSession {
		sessionID = raw
	} else {
		threadID = raw
	}
	_, err := s.exec(ctx, `INSERT INTO bindings (id, binding_key, kind, strength, account_id, client_scope,
		session_id, thread_id, source, created_at, last_seen_at, expires_at)
		VALUES (?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?, NULL)
		ON CONFLICT (kind, binding_key, client_scope) DO UPDATE SET account_id = excluded.account_id,
			source = excluded.source, last_seen_at = excluded.last_seen_at, abandoned_scope = NULL`,
		NewID("bnd", now), raw, string(kind), string(Hard), accountID, sessionID, threadID, source,
		now.UnixMilli(), now.UnixMilli())
	if err != nil {
		return Binding{}, fmt.Errorf("pin: %w", err)
	}
	var r bindingRow
	if err := s.get(ctx, &r, `SELECT `+bindingColumns+` FROM bindings WHERE kind = ? AND binding_key = ? AND client_scope = ''`,
		string(kind), raw); err != nil {
		return Binding{}, fmt.Errorf("pin: %w", err)
	}
	return r.binding(), nil
}

// Binding reads one binding by id.
func (s *Store) Binding(ctx context.Context, id string) (Binding, error) {
	var r bindingRow
	err := s.get(ctx, &r, `SELECT `+bindingColumns+` FROM bindings WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Binding{}, fmt.Errorf("binding %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Binding{}, fmt.Errorf("read binding: %w", err)
	}
	return r.binding(), nil
}

// BindingFilter selects bindings for operators. Empty fields do not filter.
type BindingFilter struct {
	SessionID   string
	ThreadID    string
	AccountID   string
	ClientScope string
	Kind        BindingKind
	// IncludeExpired lists rows past their expiry too.
	IncludeExpired bool
	Limit, Offset  int
}

func (f BindingFilter) where(now int64) (string, []any) {
	conds := []string{"1 = 1"}
	var args []any
	add := func(c string, v any) { conds = append(conds, c); args = append(args, v) }
	if f.SessionID != "" {
		add("session_id = ?", f.SessionID)
	}
	if f.ThreadID != "" {
		add("thread_id = ?", f.ThreadID)
	}
	if f.AccountID != "" {
		add("account_id = ?", f.AccountID)
	}
	if f.ClientScope != "" {
		add("client_scope = ?", f.ClientScope)
	}
	if f.Kind != "" {
		add("kind = ?", string(f.Kind))
	}
	if !f.IncludeExpired {
		add("(expires_at IS NULL OR expires_at > ?)", now)
	}
	return strings.Join(conds, " AND "), args
}

// Bindings lists bindings matching f, most recently seen first, and how many
// match in all.
func (s *Store) Bindings(ctx context.Context, f BindingFilter) ([]Binding, int, error) {
	where, args := f.where(s.now().UnixMilli())
	var rows []bindingRow
	total, err := s.page(ctx, &rows, "bindings", bindingColumns, where, args, "last_seen_at DESC, id DESC", f.Limit, f.Offset)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Binding, len(rows))
	for i, r := range rows {
		out[i] = r.binding()
	}
	return out, total, nil
}

// BindingReset names what to reset: exactly one field is set.
type BindingReset struct {
	BindingID string
	ThreadID  string
	SessionID string
	AccountID string
}

// ResetBindings deletes the bindings r names and returns them.
func (s *Store) ResetBindings(ctx context.Context, r BindingReset) ([]Binding, error) {
	var col, val string
	n := 0
	for _, c := range []struct{ col, val string }{{"id", r.BindingID}, {"thread_id", r.ThreadID}, {"session_id", r.SessionID}, {"account_id", r.AccountID}} {
		if c.val != "" {
			col, val = c.col, c.val
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("reset bindings: name exactly one of binding, thread, session, account")
	}
	var rows []bindingRow
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		if err := tx.SelectContext(ctx, &rows, s.q(`SELECT `+bindingColumns+` FROM bindings WHERE `+col+` = ?`), val); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM bindings WHERE `+col+` = ?`), val)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reset bindings: %w", err)
	}
	out := make([]Binding, len(rows))
	for i, r := range rows {
		out[i] = r.binding()
	}
	return out, nil
}

// DeleteExpiredBindings removes soft rows past their expiry and reports how many.
func (s *Store) DeleteExpiredBindings(ctx context.Context) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM bindings WHERE expires_at IS NOT NULL AND expires_at <= ?`, s.now().UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete expired bindings: %w", err)
	}
	return res.RowsAffected()
}

// inTx runs f in a write transaction, committing when it returns nil. On
// SQLite, transactions queue for the write lock here, in order (writeTx).
func (s *Store) inTx(ctx context.Context, f func(tx *sqlx.Tx) error) error {
	defer s.writeTurn()()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
