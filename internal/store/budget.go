package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/codexrelay/codex-relay/internal/budget"
)

// A key's budgets are counted from two places: the request log (a
// request's settled use is its row: total_tokens, cost_nanos, and one
// request when charged) and key_reservations (the requests admitted and
// not yet settled). Settling is writing the request's row and deleting its
// reservation in one transaction (RecordRequest), so at every moment each
// request counts exactly once, on every replica.

// Admission asks whether a request of a key with limits may start.
type Admission struct {
	Key       ClientKey // its ID and Limits
	RequestID string
	// Replica is the replica serving the request. A reservation counts
	// while it is young (see reservationYoung), and after that while its
	// replica's heartbeat is at or after LiveSince: a dead replica's
	// requests will never settle.
	Replica   string
	LiveSince time.Time
	// Estimate is what the request reserves when admitted; Reserve false
	// only checks (a prewarm, which does no work, reserves nothing).
	Estimate budget.Use
	Reserve  bool
	Location *time.Location // calendar windows
	Now      time.Time      // the relay's clock; zero: the store's
}

// Refused is a request a key's limit does not admit: the limit, its use,
// and when the key may try again.
type Refused struct {
	budget.Refusal
	RetryAt time.Time
}

// Admitted is what an admission decided: Refused nil when the request may
// start; Used is each limit's use as the admission saw it (settled plus
// reserved, before this request), in the limit's unit.
type Admitted struct {
	Refused *Refused
	Used    []float64
	// Oldest is, by limit index, when the oldest settled use a rolling
	// limit counts started (zero: none, or not a rolling limit).
	Oldest []time.Time
}

// Admit decides an admission in one transaction that holds the key's row
// (PostgreSQL: FOR UPDATE; SQLite has one writer), so concurrent requests
// of one key, on any replica, are decided one after the other, each seeing
// the others' reservations: it reads the use settled in each limit's
// window and the live reservations, and either reserves the estimate
// (nil) or answers the refusal.
func (s *Store) Admit(ctx context.Context, a Admission) (Admitted, error) {
	var out Admitted
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		if s.loc.Dialect == Postgres {
			var id string
			if err := tx.GetContext(ctx, &id, s.q(`SELECT id FROM client_keys WHERE id = ? FOR UPDATE`), a.Key.ID); err != nil {
				return fmt.Errorf("lock client key: %w", err)
			}
		}
		now := a.Now
		if now.IsZero() {
			now = s.now()
		}
		st, err := s.budgetState(ctx, tx, a.Key, a.Replica, a.LiveSince, now, a.Location)
		if err != nil {
			return err
		}
		out.Used, out.Oldest = make([]float64, len(a.Key.Limits)), st.Oldest

		for i, l := range a.Key.Limits {
			out.Used[i] = st.Used(i, l)
		}
		if r := budget.Check(a.Key.Limits, st); r != nil {
			at, err := s.retryAt(ctx, tx, a.Key.ID, r.Limit, st.Reserved, now, a.Location)
			if err != nil {
				return err
			}
			out.Refused = &Refused{Refusal: *r, RetryAt: at}
			return nil
		}
		if !a.Reserve {
			return nil
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO key_reservations (request_id, key_id, replica_id, tokens, cost_nanos, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`), a.RequestID, a.Key.ID, a.Replica, a.Estimate.Tokens, a.Estimate.CostNanos, now.UnixMilli())
		if err != nil {
			return fmt.Errorf("reserve budget: %w", err)
		}
		return nil
	})
	if err != nil {
		return Admitted{}, fmt.Errorf("admit request: %w", err)
	}
	return out, nil
}

// reservationYoung is how long a reservation counts whatever its replica's
// heartbeat says: a replica that has not beaten yet, or whose heartbeat is
// late under load, still holds its requests' budget. A dead replica's
// reservations stop counting after this, or after the heartbeat window if
// that is longer.
const reservationYoung = time.Minute

// querier is what budget reads need: the database or a transaction.
type querier interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
	QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error)
}

// budgetState reads a key's use: settled in each limit's window, and its
// live reservations.
func (s *Store) budgetState(ctx context.Context, q querier, k ClientKey, replica string, liveSince, now time.Time, loc *time.Location) (budget.State, error) {
	st := budget.State{Settled: make([]budget.Use, len(k.Limits))}
	var (
		sums     []string
		args     []any
		earliest = now
		idx      []int
		// rolling are the rolling limits, whose oldest counted use is read
		// after the sums: when it leaves the window is when the window
		// next frees some room.
		rolling     []int
		oldest      []string
		oldestStart []any
	)
	for i, l := range k.Limits {
		if l.Metric == budget.Concurrent {
			continue
		}
		start, _ := l.Window.Span(now, loc)
		if start.Before(earliest) {
			earliest = start
		}
		expr := map[budget.Metric]string{budget.Requests: "1", budget.Tokens: "total_tokens", budget.CostUSD: "cost_nanos"}[l.Metric]
		sums = append(sums, fmt.Sprintf("COALESCE(SUM(CASE WHEN started_at >= ? THEN %s ELSE 0 END), 0)", expr))
		args = append(args, start.UnixMilli())
		idx = append(idx, i)
		if l.Window.Rolling() > 0 {
			oldest = append(oldest, "COALESCE(MIN(CASE WHEN started_at >= ? THEN started_at END), 0)")
			oldestStart = append(oldestStart, start.UnixMilli())
			rolling = append(rolling, i)
		}
	}
	sums, args = append(sums, oldest...), append(args, oldestStart...)
	// One statement, so one snapshot on PostgreSQL: a request settling
	// meanwhile (its row written, its reservation deleted) is seen on one
	// side or the other, never on neither.
	young := min(liveSince.UnixMilli(), now.Add(-reservationYoung).UnixMilli())
	reserved := `SELECT COUNT(*) AS n, COALESCE(SUM(1 - done), 0) AS in_flight,
		COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_nanos), 0) AS cost
		FROM key_reservations WHERE key_id = ?
		AND (replica_id = ? OR created_at >= ? OR replica_id IN (SELECT id FROM replicas WHERE heartbeat_at >= ?))`
	query := `SELECT r.* FROM (` + reserved + `) r`
	qargs := []any{k.ID, replica, young, liveSince.UnixMilli()}
	if len(sums) > 0 {
		query = `SELECT u.*, r.* FROM (SELECT ` + strings.Join(sums, ", ") + ` FROM requests
			WHERE client_key_id = ? AND charged = 1 AND started_at >= ?) u, (` + reserved + `) r`
		qargs = append(append(args, k.ID, earliest.UnixMilli()), qargs...)
	}
	vals, err := s.queryRow(ctx, q, query, qargs...)
	if err != nil {
		return st, fmt.Errorf("read budget use: %w", err)
	}
	for j, i := range idx {
		switch k.Limits[i].Metric {
		case budget.Requests:
			st.Settled[i].Requests = vals[j]
		case budget.Tokens:
			st.Settled[i].Tokens = vals[j]
		case budget.CostUSD:
			st.Settled[i].CostNanos = vals[j]
		}
	}
	st.Oldest = make([]time.Time, len(k.Limits))
	for j, i := range rolling {
		if ms := vals[len(idx)+j]; ms > 0 {
			st.Oldest[i] = time.UnixMilli(ms)
		}
	}
	rv := vals[len(idx)+len(rolling):]
	st.Reserved = budget.Use{Requests: rv[0], Tokens: rv[2], CostNanos: rv[3]}
	st.InFlight = rv[1]
	return st, nil
}

// queryRow reads one row of int64 columns.
func (s *Store) queryRow(ctx context.Context, q querier, query string, args ...any) ([]int64, error) {
	r, err := q.QueryxContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return scanInts(r)
}

func scanInts(r *sqlx.Rows) ([]int64, error) {
	cols, err := r.Columns()
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(cols))
	if !r.Next() {
		return out, r.Err()
	}
	ptrs := make([]any, len(cols))
	for i := range out {
		ptrs[i] = &out[i]
	}
	if err := r.Scan(ptrs...); err != nil {
		return nil, err
	}
	return out, r.Err()
}

// retryAt is when a key refused under l may try again (see budget.RetryAt).
func (s *Store) retryAt(ctx context.Context, q querier, keyID string, l budget.Limit, reserved budget.Use, now time.Time, loc *time.Location) (time.Time, error) {
	events, err := s.settledEvents(ctx, q, keyID, l, now, loc)
	if err != nil {
		return time.Time{}, err
	}
	return budget.RetryAt(l, events, reserved, now, loc, time.Second), nil
}

// settledEvents lists the requests a rolling limit counts now (none for
// other limits: their reset does not depend on them).
func (s *Store) settledEvents(ctx context.Context, q querier, keyID string, l budget.Limit, now time.Time, loc *time.Location) ([]budget.Event, error) {
	if l.Window.Rolling() == 0 {
		return nil, nil
	}
	start, _ := l.Window.Span(now, loc)
	var rows []struct {
		At     int64 `db:"started_at"`
		Tokens int64 `db:"total_tokens"`
		Cost   int64 `db:"cost_nanos"`
	}
	if err := q.SelectContext(ctx, &rows, s.q(`SELECT started_at, total_tokens, cost_nanos FROM requests
		WHERE client_key_id = ? AND charged = 1 AND started_at >= ? ORDER BY started_at`), keyID, start.UnixMilli()); err != nil {
		return nil, fmt.Errorf("read settled requests: %w", err)
	}
	out := make([]budget.Event, len(rows))
	for i, r := range rows {
		out[i] = budget.Event{At: time.UnixMilli(r.At), Use: budget.Use{Requests: 1, Tokens: r.Tokens, CostNanos: r.Cost}}
	}
	return out, nil
}

// LimitUse is one limit of a key as it stands: its use (settled in its
// window; for concurrent, the requests in flight), the reservations in
// flight, and when it next resets: a calendar window's end; for a rolling
// window, when its oldest counted use leaves it (when the key may try
// again, if it is at its max); zero for concurrent or an empty rolling
// window.
type LimitUse struct {
	budget.Limit
	Used     float64
	Reserved float64
	ResetsAt time.Time
}

// KeyBudget reads how each of a key's limits stands now.
func (s *Store) KeyBudget(ctx context.Context, k ClientKey, replica string, liveSince time.Time, loc *time.Location) ([]LimitUse, error) {
	if len(k.Limits) == 0 {
		return nil, nil
	}
	now := s.now()
	st, err := s.budgetState(ctx, s.db, k, replica, liveSince, now, loc)
	if err != nil {
		return nil, err
	}
	out := make([]LimitUse, len(k.Limits))
	for i, l := range k.Limits {
		u := LimitUse{Limit: l, Reserved: l.Of(st.Reserved)}
		if l.Metric == budget.Concurrent {
			u.Used, u.Reserved = float64(st.InFlight), float64(st.InFlight)
			out[i] = u
			continue
		}
		u.Used = l.Of(st.Settled[i])
		if l.Window.Rolling() == 0 {
			_, u.ResetsAt = l.Window.Span(now, loc)
			out[i] = u
			continue
		}
		events, err := s.settledEvents(ctx, s.db, k.ID, l, now, loc)
		if err != nil {
			return nil, err
		}
		switch {
		case u.Used+u.Reserved >= l.Max:
			u.ResetsAt = budget.RetryAt(l, events, st.Reserved, now, loc, time.Second)
		case len(events) > 0:
			u.ResetsAt = events[0].At.Add(l.Window.Rolling())
		}
		out[i] = u
	}
	return out, nil
}

// FinishReservation records a completed response's real use in its
// request's reservation, before the client has its terminal event: from
// then on the reservation counts that use exactly and no longer counts as
// a request in flight, so the client's next request (sent the moment it
// reads the event) sees both. Writing the request's log row settles it.
func (s *Store) FinishReservation(ctx context.Context, requestID string, use budget.Use) error {
	const q = `UPDATE key_reservations SET tokens = ?, cost_nanos = ?, done = 1 WHERE request_id = ?`
	if _, err := s.exec(ctx, q, use.Tokens, use.CostNanos, requestID); err != nil {
		return fmt.Errorf("finish reservation: %w", err)
	}
	return nil
}

// finishedGrace is how long a completed request's reservation may wait for
// its log row: the row is written right after the client's answer, so one
// still there later was never written (the database failed then) and
// would otherwise count its use in every window for good.
const finishedGrace = 10 * time.Minute

// DeleteStaleReservations deletes the reservations that will never settle:
// those of replicas that are no longer alive, other than replica's own,
// no longer young (see reservationYoung); and completed ones whose log
// row never came.
func (s *Store) DeleteStaleReservations(ctx context.Context, replica string, liveSince time.Time) (int64, error) {
	young := min(liveSince.UnixMilli(), s.now().Add(-reservationYoung).UnixMilli())
	res, err := s.exec(ctx, `DELETE FROM key_reservations WHERE (replica_id <> ? AND created_at < ?
		AND replica_id NOT IN (SELECT id FROM replicas WHERE heartbeat_at >= ?)) OR (done = 1 AND created_at < ?)`,
		replica, young, liveSince.UnixMilli(), liveSince.Add(-finishedGrace).UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete stale reservations: %w", err)
	}
	return res.RowsAffected()
}
