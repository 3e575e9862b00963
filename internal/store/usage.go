package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// UsageFilter selects request log rows for usage reports. From is
// inclusive and To exclusive; a zero time does not bound. Empty strings do
// not filter. Model matches either the model the upstream served or the
// one the client asked for, so a report can be narrowed by either name.
type UsageFilter struct {
	From, To  time.Time
	KeyID     string
	AccountID string
	Model     string
	ThreadID  string
}

// UsageRow is what a usage report reads of one request log row: its
// identities, outcome, token counts, cost and timings.
type UsageRow struct {
	StartedAt       time.Time // UTC, millisecond precision
	KeyID           string    // client_key_id; "" in keyless mode
	AccountID       string    // "" when no account was chosen
	ThreadID        string
	Model           string // as the client asked
	ModelServed     string // as the upstream answered; "" when none did
	ServiceTier     string
	Status          int    // HTTP status; 499 when the client went away
	ErrorCode       string // "" on success
	InputTokens     int64
	CachedTokens    int64 // the cached part of InputTokens
	OutputTokens    int64
	ReasoningTokens int64
	TotalTokens     int64
	CostNanos       int64 // billionths of a US dollar
	Charged         bool
	Unpriced        bool // priced by the table's fallback model (or not at all)
	// FirstEventMS and FirstOutputMS are the milliseconds to the first
	// event and to the first output token the client got; nil when there
	// was none.
	FirstEventMS  *int64
	FirstOutputMS *int64
	DurationMS    int64
}

type usageRowDB struct {
	StartedAt    int64  `db:"started_at"`
	KeyID        string `db:"client_key_id"`
	AccountID    string `db:"account_id"`
	ThreadID     string `db:"thread_id"`
	Model        string `db:"model"`
	ModelServed  string `db:"model_served"`
	ServiceTier  string `db:"service_tier"`
	Status       int    `db:"status"`
	ErrorCode    string `db:"error_code"`
	InputTokens  int64  `db:"input_tokens"`
	CachedTokens int64  `db:"cached_tokens"`
	OutputTokens int64  `db:"output_tokens"`
	Reasoning    int64  `db:"reasoning_tokens"`
	TotalTokens  int64  `db:"total_tokens"`
	CostNanos    int64  `db:"cost_nanos"`
	Charged      int    `db:"charged"`
	Unpriced     int    `db:"unpriced"`
	FirstEventMS *int64 `db:"first_event_ms"`
	FirstOutMS   *int64 `db:"first_output_ms"`
	DurationMS   int64  `db:"duration_ms"`
}

func (r usageRowDB) row() UsageRow {
	return UsageRow{StartedAt: time.UnixMilli(r.StartedAt).UTC(), KeyID: r.KeyID, AccountID: r.AccountID,
		ThreadID: r.ThreadID, Model: r.Model, ModelServed: r.ModelServed, ServiceTier: r.ServiceTier,
		Status: r.Status, ErrorCode: r.ErrorCode, InputTokens: r.InputTokens, CachedTokens: r.CachedTokens,
		OutputTokens: r.OutputTokens, ReasoningTokens: r.Reasoning, TotalTokens: r.TotalTokens,
		CostNanos: r.CostNanos, Charged: r.Charged != 0, Unpriced: r.Unpriced != 0, FirstEventMS: r.FirstEventMS, FirstOutputMS: r.FirstOutMS,
		DurationMS: r.DurationMS}
}

const usageColumns = `started_at, client_key_id, account_id, thread_id, model, model_served, service_tier, status,
	error_code, input_tokens, cached_tokens, output_tokens, reasoning_tokens, total_tokens, cost_nanos, charged, unpriced,
	first_event_ms, first_output_ms, duration_ms`

// usageWhere builds the WHERE clause of a usage query.
func usageWhere(f UsageFilter) (string, []any) {
	conds := []string{"1 = 1"}
	var args []any
	if !f.From.IsZero() {
		conds = append(conds, "started_at >= ?")
		args = append(args, f.From.UnixMilli())
	}
	if !f.To.IsZero() {
		conds = append(conds, "started_at < ?")
		args = append(args, f.To.UnixMilli())
	}
	for _, c := range []colValue{{"client_key_id", f.KeyID}, {"account_id", f.AccountID}, {"thread_id", f.ThreadID}} {
		if c.v != "" {
			conds = append(conds, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	if f.Model != "" {
		conds = append(conds, "(model_served = ? OR model = ?)")
		args = append(args, f.Model, f.Model)
	}
	return strings.Join(conds, " AND "), args
}

// EachUsageRow calls fn with every request log row f selects, oldest
// first, as the database returns them: the rows are never all in memory
// at once. An error from fn stops the iteration and is returned as is.
// fn runs while a database connection is held, so it should be quick (fold
// the row into a report, not write to a slow client).
func (s *Store) EachUsageRow(ctx context.Context, f UsageFilter, fn func(UsageRow) error) error {
	where, args := usageWhere(f)
	rows, err := s.db.QueryxContext(ctx, s.q(`SELECT `+usageColumns+` FROM requests WHERE `+where+
		` ORDER BY started_at, id`), args...)
	if err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r usageRowDB
		if err := rows.StructScan(&r); err != nil {
			return fmt.Errorf("read usage: %w", err)
		}
		if err := fn(r.row()); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	return nil
}
