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

// RequestRecord is one client request in the request log.
type RequestRecord struct {
	ID           string
	ClientKeyID  string
	ThreadKey    string
	SessionID    string
	ThreadID     string
	AccountID    string
	Transport    string // http, ws
	Path         string
	Model        string
	Status       int
	ErrorCode    string
	Recovery     string
	StartedAt    time.Time
	FirstEvent   time.Duration // zero: no event reached the client
	Duration     time.Duration
	InputTokens  int64
	OutputTokens int64
	CachedTokens int64
	// Usage beyond the three counts above, from the terminal event.
	ModelServed     string // the model the upstream answered with ("" when none answered)
	ServiceTier     string // the service tier the upstream served (or the request asked for)
	ReasoningTokens int64
	TotalTokens     int64 // the upstream's usage.total_tokens
	CostNanos       int64 // priced when the request settled, in billionths of a US dollar
	// Charged reports that the request counts toward its key's budgets: the
	// upstream did work for it.
	Charged bool
	// Unpriced: the price table does not price the request's model, and
	// CostNanos is the fallback model's price (or 0 without one).
	Unpriced bool
	// FirstOutput is the time to the first output token the client got
	// (zero: none).
	FirstOutput time.Duration
	// Policy notes what the key's model policy changed (an alias resolved,
	// reasoning effort capped, the priority tier downgraded).
	Policy string
	// Reserved reports that the request holds a budget reservation, which
	// its log row settles (deletes) in the same transaction.
	Reserved bool
	// Route names what the request was: "responses" (or "" in rows from
	// before routes were recorded), "images.generations", "files.create",
	// "responses.get"...; ObjectID is the object it named or created.
	Route    string
	ObjectID string
}

type requestRow struct {
	ID           string `db:"id"`
	ClientKeyID  string `db:"client_key_id"`
	ThreadKey    string `db:"thread_key"`
	SessionID    string `db:"session_id"`
	ThreadID     string `db:"thread_id"`
	AccountID    string `db:"account_id"`
	Transport    string `db:"transport"`
	Path         string `db:"path"`
	Model        string `db:"model"`
	Status       int    `db:"status"`
	ErrorCode    string `db:"error_code"`
	Recovery     string `db:"recovery"`
	StartedAt    int64  `db:"started_at"`
	FirstEventMS *int64 `db:"first_event_ms"`
	DurationMS   int64  `db:"duration_ms"`
	InputTokens  int64  `db:"input_tokens"`
	OutputTokens int64  `db:"output_tokens"`
	CachedTokens int64  `db:"cached_tokens"`
	ModelServed  string `db:"model_served"`
	ServiceTier  string `db:"service_tier"`
	Reasoning    int64  `db:"reasoning_tokens"`
	TotalTokens  int64  `db:"total_tokens"`
	CostNanos    int64  `db:"cost_nanos"`
	Charged      int    `db:"charged"`
	Unpriced     int    `db:"unpriced"`
	FirstOutMS   *int64 `db:"first_output_ms"`
	Policy       string `db:"policy"`
	Route        string `db:"route"`
	ObjectID     string `db:"object_id"`
}

func (r requestRow) record() RequestRecord {
	out := RequestRecord{ID: r.ID, ClientKeyID: r.ClientKeyID, ThreadKey: r.ThreadKey, SessionID: r.SessionID,
		ThreadID: r.ThreadID, AccountID: r.AccountID, Transport: r.Transport, Path: r.Path, Model: r.Model,
		Status: r.Status, ErrorCode: r.ErrorCode, Recovery: r.Recovery, StartedAt: time.UnixMilli(r.StartedAt).UTC(),
		Duration: time.Duration(r.DurationMS) * time.Millisecond, InputTokens: r.InputTokens,
		OutputTokens: r.OutputTokens, CachedTokens: r.CachedTokens, ModelServed: r.ModelServed, ServiceTier: r.ServiceTier,
		ReasoningTokens: r.Reasoning, TotalTokens: r.TotalTokens, CostNanos: r.CostNanos, Charged: r.Charged != 0, Unpriced: r.Unpriced != 0,
		Policy: r.Policy, Route: r.Route, ObjectID: r.ObjectID}
	if r.FirstEventMS != nil {
		out.FirstEvent = time.Duration(*r.FirstEventMS) * time.Millisecond
	}
	if r.FirstOutMS != nil {
		out.FirstOutput = time.Duration(*r.FirstOutMS) * time.Millisecond
	}
	return out
}

const requestColumns = `id, client_key_id, thread_key, session_id, thread_id, account_id, transport, path, model,
	status, error_code, recovery, started_at, first_event_ms, duration_ms, input_tokens, output_tokens, cached_tokens,
	model_served, service_tier, reasoning_tokens, total_tokens, cost_nanos, charged, first_output_ms, policy, unpriced,
	route, object_id`

const attemptColumns = `id, request_id, seq, thread_key, session_id, thread_id, account_id, from_account_id, transport,
	class, recovery, action, status, error_code, detail, started_at, ended_at, first_event_ms`

// The inserts of the request log and the attempt records.
const (
	insertRequest = `INSERT INTO requests (id, client_key_id, thread_key, session_id, thread_id,
		account_id, transport, path, model, status, error_code, recovery, started_at, first_event_ms, duration_ms,
		input_tokens, output_tokens, cached_tokens, model_served, service_tier, reasoning_tokens, total_tokens,
		cost_nanos, charged, first_output_ms, policy, unpriced, route, object_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`
	// settleReservation ends a request's budget reservation: its use is now
	// in its log row, written in the same transaction.
	settleReservation = `DELETE FROM key_reservations WHERE request_id = ?`
	insertAttempt     = `INSERT INTO attempts (id, request_id, seq, thread_key, session_id, thread_id,
		account_id, from_account_id, transport, class, recovery, action, status, error_code, detail, started_at,
		ended_at, first_event_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`
)

// LogRequest appends a row to the request log.
func (s *Store) LogRequest(ctx context.Context, r RequestRecord) error {
	return logRequest(ctx, s.exec, r)
}

// RecordAttempts appends attempt records.
func (s *Store) RecordAttempts(ctx context.Context, as []Attempt) error {
	return recordAttempts(ctx, s.exec, as)
}

// RecordRequest writes a request's log row and its attempt records in one
// transaction (RecordRequests with one).
func (s *Store) RecordRequest(ctx context.Context, r RequestRecord, as []Attempt) error {
	return s.RecordRequests(ctx, []LoggedRequest{{Request: r, Attempts: as}})
}

// LoggedRequest is one request's log row and its attempt records.
type LoggedRequest struct {
	Request  RequestRecord
	Attempts []Attempt
}

// RecordRequests writes requests' log rows and their attempt records in
// one transaction: under load, one commit for many requests. A request
// that held a budget reservation settles it in the same transaction: its
// use moves from the reservation to the log row at once, on every replica,
// and only once. Written again (a retry after a commit whose answer was
// lost), a row that is there already is left as it is: rows have their
// request's id, attempts their own.
func (s *Store) RecordRequests(ctx context.Context, rs []LoggedRequest) error {
	s.warm(ctx, insertRequest, insertAttempt, settleReservation)
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		ex := s.execIn(tx)
		for _, r := range rs {
			if err := logRequest(ctx, ex, r.Request); err != nil {
				return err
			}
			if r.Request.Reserved {
				if _, err := ex(ctx, settleReservation, r.Request.ID); err != nil {
					return fmt.Errorf("settle reservation: %w", err)
				}
			}
			if err := recordAttempts(ctx, ex, r.Attempts); err != nil {
				return err
			}
		}
		return nil
	})
	s.noteWrite(ctx, err)
	return err
}

func logRequest(ctx context.Context, exec execFunc, r RequestRecord) error {
	if r.ID == "" {
		r.ID = NewID("req", r.StartedAt)
	}
	charged, unpriced := 0, 0
	if r.Charged {
		charged = 1
	}
	if r.Unpriced {
		unpriced = 1
	}
	_, err := exec(ctx, insertRequest,
		r.ID, r.ClientKeyID, r.ThreadKey, r.SessionID, r.ThreadID, r.AccountID, r.Transport, r.Path, r.Model,
		r.Status, r.ErrorCode, r.Recovery, r.StartedAt.UnixMilli(), optMillis(r.FirstEvent), r.Duration.Milliseconds(),
		r.InputTokens, r.OutputTokens, r.CachedTokens, r.ModelServed, r.ServiceTier, r.ReasoningTokens, r.TotalTokens,
		r.CostNanos, charged, optMillis(r.FirstOutput), r.Policy, unpriced, r.Route, r.ObjectID)
	if err != nil {
		return fmt.Errorf("log request: %w", err)
	}
	return nil
}

// optMillis is a duration as nullable milliseconds: NULL when not positive.
func optMillis(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	v := d.Milliseconds()
	return &v
}

// RequestFilter selects request log rows; empty fields do not filter.
type RequestFilter struct {
	ThreadID, SessionID, AccountID, ClientKeyID, Transport string
	Limit, Offset                                          int
}

// Requests lists request log rows, newest first, and how many match.
func (s *Store) Requests(ctx context.Context, f RequestFilter) ([]RequestRecord, int, error) {
	where, args := filterWhere([]colValue{{"thread_id", f.ThreadID}, {"session_id", f.SessionID},
		{"account_id", f.AccountID}, {"client_key_id", f.ClientKeyID}, {"transport", f.Transport}})
	var rows []requestRow
	total, err := s.page(ctx, &rows, "requests", requestColumns, where, args, "started_at DESC, id DESC", f.Limit, f.Offset)
	if err != nil {
		return nil, 0, err
	}
	out := make([]RequestRecord, len(rows))
	for i, r := range rows {
		out[i] = r.record()
	}
	return out, total, nil
}

// Request reads one request log row by id; ErrNotFound when the log has
// none (never written, or deleted by retention).
func (s *Store) Request(ctx context.Context, id string) (RequestRecord, error) {
	var r requestRow
	err := s.get(ctx, &r, `SELECT `+requestColumns+` FROM requests WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return RequestRecord{}, fmt.Errorf("request %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return RequestRecord{}, fmt.Errorf("read request: %w", err)
	}
	return r.record(), nil
}

// AnyRequest reports whether the request log holds a row at all, reading
// at most one.
func (s *Store) AnyRequest(ctx context.Context) (bool, error) {
	var n int
	if err := s.get(ctx, &n, `SELECT COUNT(*) FROM (SELECT 1 FROM requests LIMIT 1) one`); err != nil {
		return false, fmt.Errorf("read request log: %w", err)
	}
	return n > 0, nil
}

// Attempt is the diagnostic record of one try of a request on one account,
// classified once when it ended.
type Attempt struct {
	ID            string
	RequestID     string
	Seq           int
	ThreadKey     string
	SessionID     string
	ThreadID      string
	AccountID     string
	FromAccountID string
	Transport     string
	Class         string // e.g. ok, usage_limit, account_mismatch, transport, conflict
	Recovery      string // e.g. failover, reasoning_recovery, account_mismatch, owner_retired
	Action        string // next_account, same_account, terminal, done
	Status        int
	ErrorCode     string
	Detail        string
	StartedAt     time.Time
	EndedAt       time.Time
	FirstEvent    time.Duration
}

func recordAttempts(ctx context.Context, exec execFunc, as []Attempt) error {
	for _, a := range as {
		if a.ID == "" {
			a.ID = NewID("att", a.StartedAt)
		}
		_, err := exec(ctx, insertAttempt,
			a.ID, a.RequestID, a.Seq, a.ThreadKey, a.SessionID, a.ThreadID, a.AccountID, a.FromAccountID, a.Transport,
			a.Class, a.Recovery, a.Action, a.Status, a.ErrorCode, a.Detail, a.StartedAt.UnixMilli(), a.EndedAt.UnixMilli(),
			optMillis(a.FirstEvent))
		if err != nil {
			return fmt.Errorf("record attempt: %w", err)
		}
	}
	return nil
}

type attemptRow struct {
	ID            string `db:"id"`
	RequestID     string `db:"request_id"`
	Seq           int    `db:"seq"`
	ThreadKey     string `db:"thread_key"`
	SessionID     string `db:"session_id"`
	ThreadID      string `db:"thread_id"`
	AccountID     string `db:"account_id"`
	FromAccountID string `db:"from_account_id"`
	Transport     string `db:"transport"`
	Class         string `db:"class"`
	Recovery      string `db:"recovery"`
	Action        string `db:"action"`
	Status        int    `db:"status"`
	ErrorCode     string `db:"error_code"`
	Detail        string `db:"detail"`
	StartedAt     int64  `db:"started_at"`
	EndedAt       int64  `db:"ended_at"`
	FirstEventMS  *int64 `db:"first_event_ms"`
}

// AttemptFilter selects diagnostics; empty fields do not filter.
type AttemptFilter struct {
	Class, Recovery, AccountID, RequestID, ThreadID string
	Limit, Offset                                   int
}

// Attempts lists attempt records, newest first, and how many match.
func (s *Store) Attempts(ctx context.Context, f AttemptFilter) ([]Attempt, int, error) {
	where, args := filterWhere([]colValue{{"class", f.Class}, {"recovery", f.Recovery}, {"account_id", f.AccountID},
		{"request_id", f.RequestID}, {"thread_id", f.ThreadID}})
	var rows []attemptRow
	total, err := s.page(ctx, &rows, "attempts", attemptColumns, where, args, "started_at DESC, seq DESC", f.Limit, f.Offset)
	if err != nil {
		return nil, 0, err
	}
	return attemptsOf(rows), total, nil
}

func attemptsOf(rows []attemptRow) []Attempt {
	out := make([]Attempt, len(rows))
	for i, r := range rows {
		out[i] = Attempt{ID: r.ID, RequestID: r.RequestID, Seq: r.Seq, ThreadKey: r.ThreadKey, SessionID: r.SessionID,
			ThreadID: r.ThreadID, AccountID: r.AccountID, FromAccountID: r.FromAccountID, Transport: r.Transport,
			Class: r.Class, Recovery: r.Recovery, Action: r.Action, Status: r.Status, ErrorCode: r.ErrorCode,
			Detail: r.Detail, StartedAt: time.UnixMilli(r.StartedAt).UTC(), EndedAt: time.UnixMilli(r.EndedAt).UTC()}
		if r.FirstEventMS != nil {
			out[i].FirstEvent = time.Duration(*r.FirstEventMS) * time.Millisecond
		}
	}
	return out
}

// RequestAttempts pages the requests that have an attempt f selects, the
// latest first (by their latest attempt), and returns every attempt of
// those requests, not only the ones f selects: a request that failed over
// from a usage limit to an account that served it is one timeline of two
// attempts, whatever filter found it. total is how many requests match.
func (s *Store) RequestAttempts(ctx context.Context, f AttemptFilter) (attempts []Attempt, total int, err error) {
	where, args := filterWhere([]colValue{{"class", f.Class}, {"recovery", f.Recovery}, {"account_id", f.AccountID},
		{"request_id", f.RequestID}, {"thread_id", f.ThreadID}})
	if err := s.db.GetContext(ctx, &total, s.q(`SELECT COUNT(DISTINCT request_id) FROM attempts WHERE `+where), args...); err != nil {
		return nil, 0, fmt.Errorf("count requests of attempts: %w", err)
	}
	limit := f.Limit
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	var ids []string
	if err := s.db.SelectContext(ctx, &ids, s.q(`SELECT request_id FROM attempts WHERE `+where+
		` GROUP BY request_id ORDER BY MAX(started_at) DESC, request_id DESC LIMIT ? OFFSET ?`), append(args, limit, max(f.Offset, 0))...); err != nil {
		return nil, 0, fmt.Errorf("list requests of attempts: %w", err)
	}
	if len(ids) == 0 {
		return nil, total, nil
	}
	in, inArgs, err := sqlx.In(`SELECT `+attemptColumns+` FROM attempts WHERE request_id IN (?) ORDER BY started_at DESC, seq DESC`, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("list attempts of requests: %w", err)
	}
	var rows []attemptRow
	if err := s.db.SelectContext(ctx, &rows, s.q(in), inArgs...); err != nil {
		return nil, 0, fmt.Errorf("list attempts of requests: %w", err)
	}
	return attemptsOf(rows), total, nil
}

// UpdateUsage records the usage windows an upstream reported for an account.
// A window with Known false is left as stored. A report that repeats what
// is stored, less than 30 seconds after the last write, is not written
// again (see usageUnchanged). The cached listing of the accounts takes the
// windows in place (see usageWritten).
func (s *Store) UpdateUsage(ctx context.Context, id string, primary, secondary Window) error {
	if s.accts.usageUnchanged(id, primary, secondary, s.now()) {
		return nil
	}
	var sets []string
	var args []any
	for _, w := range []struct {
		prefix string
		w      Window
	}{{"primary", primary}, {"secondary", secondary}} {
		if !w.w.Known {
			continue
		}
		sets = append(sets, w.prefix+"_used_percent = ?", w.prefix+"_window_minutes = ?", w.prefix+"_reset_at = ?")
		args = append(args, w.w.UsedPercent, w.w.WindowMinutes, millis(w.w.ResetAt))
	}
	if len(sets) == 0 {
		return nil
	}
	now := s.now().UnixMilli()
	sets = append(sets, "usage_updated_at = ?")
	args = append(args, now, id)
	res, err := s.exec(ctx, `UPDATE accounts SET `+strings.Join(sets, ", ")+` WHERE id = ?`, args...)
	if err = affectedOne(res, err, "update usage", id); err != nil {
		s.accts.changed()
		return err
	}
	// Not announced: other replicas see new windows within their
	// listing's one-second TTL, as soon as they would matter.
	s.accts.usageWritten(id, primary, secondary, time.UnixMilli(now).UTC())
	return nil
}

// colValue is an equality filter; an empty value does not filter.
type colValue struct{ col, v string }

// filterWhere builds the WHERE clause of a listing: one equality per set
// value.
func filterWhere(eq []colValue) (string, []any) {
	conds := []string{"1 = 1"}
	var args []any
	for _, c := range eq {
		if c.v != "" {
			conds = append(conds, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	return strings.Join(conds, " AND "), args
}

// page counts the rows of table matching where and reads one page of them
// into dest. limit is 1 to 1000 (default 100).
func (s *Store) page(ctx context.Context, dest any, table, columns, where string, args []any, order string, limit, offset int) (int, error) {
	var total int
	if err := s.db.GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM `+table+` WHERE `+where), args...); err != nil {
		return 0, fmt.Errorf("count %s: %w", table, err)
	}
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	if err := s.db.SelectContext(ctx, dest, s.q(`SELECT `+columns+` FROM `+table+` WHERE `+where+` ORDER BY `+order+` LIMIT ? OFFSET ?`),
		append(args, limit, max(offset, 0))...); err != nil {
		return 0, fmt.Errorf("list %s: %w", table, err)
	}
	return total, nil
}

// retentionBatch bounds one delete of old records, so pruning a large
// backlog never holds the database for long.
const retentionBatch = 5000

// BudgetHorizon is how long the request log is kept at the least, whatever
// the retention: its rows are what keys' budgets count, and the longest
// window (a month) must still see them.
const BudgetHorizon = 32 * 24 * time.Hour

// DeleteRecordsBefore deletes attempt records that started before before,
// and request log rows that started before it and before BudgetHorizon
// ago, in batches, at most maxBatches per table, and reports how many rows
// went. Call it again to continue a large backlog.
func (s *Store) DeleteRecordsBefore(ctx context.Context, before time.Time, maxBatches int) (int64, error) {
	var total int64
	for _, table := range []string{"requests", "attempts"} {
		cutoff := before
		if horizon := s.now().Add(-BudgetHorizon); table == "requests" && horizon.Before(cutoff) {
			cutoff = horizon
		}
		q := `DELETE FROM ` + table + ` WHERE id IN (SELECT id FROM ` + table + ` WHERE started_at < ? LIMIT ?)`
		for range maxBatches {
			res, err := s.exec(ctx, q, cutoff.UnixMilli(), retentionBatch)
			if err != nil {
				return total, fmt.Errorf("delete old %s: %w", table, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return total, err
			}
			total += n
			if n < retentionBatch {
				break
			}
		}
	}
	return total, nil
}
