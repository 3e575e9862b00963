package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/pricing"
)

// pricesTTL bounds how long the current price table is reused. A save
// through this Store drops it at once; the TTL is how soon a table saved by
// another process (a second replica) is seen.
const pricesTTL = 10 * time.Second

// maxPriceHistory bounds PriceTables; defaultPriceHistory is its default.
const (
	maxPriceHistory     = 1000
	defaultPriceHistory = 100
)

type priceTableRow struct {
	ID        string `db:"id"`
	Source    string `db:"source"`
	AsOf      string `db:"as_of"`
	Entries   string `db:"entries"`
	Fallback  string `db:"fallback_model"`
	CreatedAt int64  `db:"created_at"`
	CreatedBy string `db:"created_by"`
}

func (r priceTableRow) table() (pricing.Table, error) {
	t := pricing.Table{ID: r.ID, Source: r.Source, AsOf: r.AsOf, FallbackModel: r.Fallback, CreatedAt: time.UnixMilli(r.CreatedAt).UTC(), CreatedBy: r.CreatedBy}
	if err := json.Unmarshal([]byte(r.Entries), &t.Entries); err != nil {
		return pricing.Table{}, fmt.Errorf("price table %s: entries: %w", r.ID, err)
	}
	return t, nil
}

const priceTableColumns = `id, source, as_of, entries, created_at, created_by, fallback_model`

// PriceTable returns the table requests are priced with: the newest one
// stored, or pricing.Default() (ID pricing.DefaultID) while none is.
//
// It is meant to be called on every request: the table is read at most
// once per 10 seconds and reused meanwhile. SavePriceTable through this
// Store drops the reused table at once; a table saved by another replica
// is seen here within those 10 seconds. The entries returned are shared
// with other callers: treat them as read-only.
func (s *Store) PriceTable(ctx context.Context) (pricing.Table, error) {
	c := (&s.prices)
	now := s.now()
	t, gen, ok := c.cached(now)
	if ok {
		return t, nil
	}
	var row priceTableRow
	err := s.get(ctx, &row, `SELECT `+priceTableColumns+` FROM price_tables ORDER BY created_at DESC, id DESC LIMIT 1`)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		t = pricing.Default()
	case err != nil:
		return pricing.Table{}, fmt.Errorf("read price table: %w", err)
	default:
		if t, err = row.table(); err != nil {
			return pricing.Table{}, fmt.Errorf("read price table: %w", err)
		}
	}
	c.keep(t, gen, now)
	return t, nil
}

// SavePriceTable stores t, after t.Validate (whose error, a
// *pricing.FieldError, is returned as is), as the new current table, saved
// by by (the actor, e.g. "admin-token" or a user's email). It returns the table as
// stored: a new ID, the creation time, and copies of the entries. Stored
// tables are never changed or deleted: each request's cost was worked out
// when it settled and stays in its row. A table saved in the same
// millisecond as the newest one is dated a millisecond after it.
func (s *Store) SavePriceTable(ctx context.Context, t pricing.Table, by string) (pricing.Table, error) {
	if err := t.Validate(); err != nil {
		return pricing.Table{}, err
	}
	entries, err := json.Marshal(t.Entries)
	if err != nil {
		return pricing.Table{}, fmt.Errorf("save price table: %w", err)
	}
	// Dated after the newest, so the table saved last is the current one.
	at := s.now().UnixMilli()
	var newest sql.NullInt64
	if err := s.get(ctx, &newest, `SELECT MAX(created_at) FROM price_tables`); err != nil {
		return pricing.Table{}, fmt.Errorf("save price table: %w", err)
	}
	if newest.Valid && newest.Int64 >= at {
		at = newest.Int64 + 1
	}
	created := time.UnixMilli(at).UTC()
	saved := pricing.Table{ID: NewID("prc", created), Source: t.Source, AsOf: t.AsOf, Entries: slices.Clone(t.Entries),
		FallbackModel: t.FallbackModel, CreatedAt: created, CreatedBy: by}
	_, err = s.exec(ctx, `INSERT INTO price_tables (`+priceTableColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		saved.ID, saved.Source, saved.AsOf, string(entries), saved.CreatedAt.UnixMilli(), saved.CreatedBy, saved.FallbackModel)
	// Dropped even when the insert failed: it may have been committed.
	(&s.prices).changed()
	if err != nil {
		return pricing.Table{}, fmt.Errorf("save price table: %w", err)
	}
	return saved, nil
}

// PriceTables lists the stored tables, newest (the current one) first, at
// most limit of them (1 to 1000; 100 when out of range). The default table
// is not listed: it is never stored.
func (s *Store) PriceTables(ctx context.Context, limit int) ([]pricing.Table, error) {
	if limit < 1 || limit > maxPriceHistory {
		limit = defaultPriceHistory
	}
	var rows []priceTableRow
	err := s.selectAll(ctx, &rows, `SELECT `+priceTableColumns+` FROM price_tables ORDER BY created_at DESC, id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list price tables: %w", err)
	}
	out := make([]pricing.Table, 0, len(rows))
	for _, r := range rows {
		t, err := r.table()
		if err != nil {
			return nil, fmt.Errorf("list price tables: %w", err)
		}
		out = append(out, t)
	}
	return out, nil
}

// priceCache keeps the current price table. Safe for concurrent use.
type priceCache struct {
	mu    sync.Mutex
	gen   uint64 // bumped after every save
	table pricing.Table
	have  bool      // table was read since the last save
	at    time.Time // when table was read
}

// cached returns the table if it is current, and the generation a fresh
// read must be kept under.
func (c *priceCache) cached(now time.Time) (pricing.Table, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if age := now.Sub(c.at); c.have && age >= 0 && age < pricesTTL {
		return c.table, c.gen, true
	}
	return pricing.Table{}, c.gen, false
}

// keep stores a table read under generation gen, unless a save came after
// the read began.
func (c *priceCache) keep(t pricing.Table, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen == c.gen {
		c.table, c.have, c.at = t, true, at
	}
}

func (c *priceCache) changed() {
	c.mu.Lock()
	c.gen++
	c.have, c.table = false, pricing.Table{}
	c.mu.Unlock()
}
