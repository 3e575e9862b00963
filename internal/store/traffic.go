package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Traffic is the request log and attempt records of a window, counted by
// the database: per minute, per failed attempt class, and for its busiest
// threads. Per-minute slices run oldest first; index i covers the minute
// that ended (len-1-i) minutes before the window's end.
type Traffic struct {
	Requests       []int // requests started in the minute
	Failed         []int // of them, answered with an error status
	Switches       []int // attempts that moved a request to another account
	FailedAttempts []int // attempts that did not end ok
	Classes        map[string]int
	Threads        []ThreadTraffic // busiest first
}

// ThreadTraffic is one thread's part of a window.
type ThreadTraffic struct {
	ThreadID, SessionID string
	AccountID           string // of its latest request
	Requests, Errors    int
	Switches            int
	LastAt              time.Time
}

// Traffic counts the minutes before until (the window is (until - minutes,
// until]) and returns up to top threads, busiest first.
func (s *Store) Traffic(ctx context.Context, until time.Time, minutes, top int) (Traffic, error) {
	t := Traffic{Requests: make([]int, minutes), Failed: make([]int, minutes), Switches: make([]int, minutes),
		FailedAttempts: make([]int, minutes), Classes: map[string]int{}}
	end := until.UnixMilli()
	start := end - int64(minutes)*int64(time.Minute/time.Millisecond)
	// The minute index, counted back from the window's end.
	const minute = `? - (? - started_at) / 60000`
	switched := "from_account_id <> '' AND from_account_id <> account_id"

	var perMinute []struct {
		Minute int `db:"m"`
		A      int `db:"a"`
		B      int `db:"b"`
	}
	if err := s.selectAll(ctx, &perMinute, `SELECT `+minute+` AS m, COUNT(*) AS a,
		SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END) AS b
		FROM requests WHERE started_at > ? AND started_at <= ? GROUP BY 1`, minutes-1, end, start, end); err != nil {
		return t, fmt.Errorf("count requests: %w", err)
	}
	for _, r := range perMinute {
		if r.Minute >= 0 && r.Minute < minutes {
			t.Requests[r.Minute], t.Failed[r.Minute] = r.A, r.B
		}
	}
	perMinute = perMinute[:0]
	if err := s.selectAll(ctx, &perMinute, `SELECT `+minute+` AS m,
		SUM(CASE WHEN `+switched+` THEN 1 ELSE 0 END) AS a, SUM(CASE WHEN class <> 'ok' THEN 1 ELSE 0 END) AS b
		FROM attempts WHERE started_at > ? AND started_at <= ? GROUP BY 1`, minutes-1, end, start, end); err != nil {
		return t, fmt.Errorf("count attempts: %w", err)
	}
	for _, r := range perMinute {
		if r.Minute >= 0 && r.Minute < minutes {
			t.Switches[r.Minute], t.FailedAttempts[r.Minute] = r.A, r.B
		}
	}

	var classes []struct {
		Class string `db:"class"`
		N     int    `db:"n"`
	}
	if err := s.selectAll(ctx, &classes, `SELECT class, COUNT(*) AS n FROM attempts
		WHERE started_at > ? AND started_at <= ? AND class <> 'ok' GROUP BY class`, start, end); err != nil {
		return t, fmt.Errorf("count attempt classes: %w", err)
	}
	for _, c := range classes {
		t.Classes[c.Class] = c.N
	}

	var threads []struct {
		ThreadID  string `db:"thread_id"`
		SessionID string `db:"session_id"`
		AccountID string `db:"account_id"`
		N         int    `db:"n"`
		Errors    int    `db:"errs"`
		Last      int64  `db:"last_at"`
	}
	if err := s.selectAll(ctx, &threads, `SELECT r.thread_id, MAX(r.session_id) AS session_id, COUNT(*) AS n,
		SUM(CASE WHEN r.status >= 400 THEN 1 ELSE 0 END) AS errs, MAX(r.started_at) AS last_at,
		(SELECT l.account_id FROM requests l WHERE l.thread_id = r.thread_id AND l.started_at > ? AND l.started_at <= ?
			ORDER BY l.started_at DESC, l.id DESC LIMIT 1) AS account_id
		FROM requests r WHERE r.started_at > ? AND r.started_at <= ? AND r.thread_id <> ''
		GROUP BY r.thread_id ORDER BY n DESC, last_at DESC, r.thread_id LIMIT ?`, start, end, start, end, top); err != nil {
		return t, fmt.Errorf("count threads: %w", err)
	}
	if len(threads) == 0 {
		return t, nil
	}
	ids := make([]string, len(threads))
	for i, th := range threads {
		ids[i] = th.ThreadID
	}
	q, args, err := sqlx.In(`SELECT thread_id, COUNT(*) AS n FROM attempts
		WHERE started_at > ? AND started_at <= ? AND `+switched+` AND thread_id IN (?) GROUP BY thread_id`, start, end, ids)
	if err != nil {
		return t, err
	}
	var switches []struct {
		ThreadID string `db:"thread_id"`
		N        int    `db:"n"`
	}
	if err := s.db.SelectContext(ctx, &switches, s.q(q), args...); err != nil {
		return t, fmt.Errorf("count thread switches: %w", err)
	}
	byThread := map[string]int{}
	for _, sw := range switches {
		byThread[sw.ThreadID] = sw.N
	}
	for _, th := range threads {
		t.Threads = append(t.Threads, ThreadTraffic{ThreadID: th.ThreadID, SessionID: th.SessionID, AccountID: th.AccountID,
			Requests: th.N, Errors: th.Errors, Switches: byThread[th.ThreadID], LastAt: time.UnixMilli(th.Last).UTC()})
	}
	return t, nil
}
