package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// FoundID is a thread or session id FindIDs found, as its client sent it,
// and whether a binding holds it (else only the request log names it).
type FoundID struct {
	ID    string
	Bound bool
}

// FoundIDs is what FindIDs found, each list sorted.
type FoundIDs struct {
	Requests []string
	Threads  []FoundID
	Sessions []FoundID
}

// maxFound bounds each list of FoundIDs.
const maxFound = 20

// FindIDs looks q up for the console's search: among request ids, the
// thread and session ids clients sent, and derived thread keys, in the
// bindings and the request log. Without prefix only ids equal to q match;
// with it, the ids q begins (case-sensitive, as ids are). A derived key is
// reported as the thread it belongs to, or the session for a client that
// sends no thread id. Each list holds at most maxFound ids.
//
// The request log has no index on its session and thread-key columns, so a
// search reads them whole: an operator's occasional query, never on the
// request path.
func (s *Store) FindIDs(ctx context.Context, q string, prefix bool) (FoundIDs, error) {
	if q == "" {
		return FoundIDs{}, nil
	}
	match := func(col string) (string, []any) {
		if prefix {
			return "substr(" + col + ", 1, ?) = ?", []any{utf8.RuneCountInString(q), q}
		}
		return col + " = ?", []any{q}
	}
	threads, sessions := map[string]bool{}, map[string]bool{}
	note := func(set map[string]bool, id string, bound bool) {
		if id != "" {
			set[id] = set[id] || bound
		}
	}
	var out FoundIDs
	type ids struct {
		ID        string `db:"id"`
		Kind      string `db:"kind"`
		ThreadID  string `db:"thread_id"`
		SessionID string `db:"session_id"`
	}
	for _, l := range []struct {
		what, col, query string
		add              func(ids)
	}{
		{"requests", "id", `SELECT id FROM requests WHERE %s ORDER BY id LIMIT %d`,
			func(r ids) { out.Requests = append(out.Requests, r.ID) }},
		{"bound threads", "thread_id", `SELECT DISTINCT thread_id FROM bindings WHERE thread_id <> '' AND %s ORDER BY thread_id LIMIT %d`,
			func(r ids) { note(threads, r.ThreadID, true) }},
		{"bound sessions", "session_id", `SELECT DISTINCT session_id FROM bindings WHERE session_id <> '' AND %s ORDER BY session_id LIMIT %d`,
			func(r ids) { note(sessions, r.SessionID, true) }},
		{"bound keys", "binding_key", `SELECT DISTINCT kind, thread_id, session_id FROM bindings WHERE kind IN ('thread', 'session') AND %s LIMIT %d`,
			func(r ids) {
				if r.Kind == string(BindThread) && r.ThreadID != "" {
					note(threads, r.ThreadID, true)
				} else {
					note(sessions, r.SessionID, true)
				}
			}},
		{"logged threads", "thread_id", `SELECT DISTINCT thread_id FROM requests WHERE thread_id <> '' AND %s ORDER BY thread_id LIMIT %d`,
			func(r ids) { note(threads, r.ThreadID, false) }},
		{"logged sessions", "session_id", `SELECT DISTINCT session_id FROM requests WHERE session_id <> '' AND %s ORDER BY session_id LIMIT %d`,
			func(r ids) { note(sessions, r.SessionID, false) }},
		{"logged keys", "thread_key", `SELECT DISTINCT thread_id, session_id FROM requests WHERE thread_key <> '' AND %s LIMIT %d`,
			func(r ids) {
				if r.ThreadID != "" {
					note(threads, r.ThreadID, false)
				} else {
					note(sessions, r.SessionID, false)
				}
			}},
	} {
		cond, args := match(l.col)
		var rows []ids
		if err := s.db.SelectContext(ctx, &rows, s.q(fmt.Sprintf(l.query, cond, maxFound)), args...); err != nil {
			return FoundIDs{}, fmt.Errorf("find %s: %w", l.what, err)
		}
		for _, r := range rows {
			l.add(r)
		}
	}
	out.Threads, out.Sessions = found(threads), found(sessions)
	return out, nil
}

// found lists a set of ids sorted, at most maxFound of them.
func found(set map[string]bool) []FoundID {
	out := make([]FoundID, 0, len(set))
	for id, bound := range set {
		out = append(out, FoundID{ID: id, Bound: bound})
	}
	slices.SortFunc(out, func(a, b FoundID) int { return strings.Compare(a.ID, b.ID) })
	return out[:min(len(out), maxFound)]
}
