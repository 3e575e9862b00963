package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ObjectKind is what an object is.
type ObjectKind string

// The kinds of objects the relay places.
const (
	ObjectFile     ObjectKind = "file"     // an uploaded file (OpenAI's /files, ChatGPT's file upload)
	ObjectResponse ObjectKind = "response" // a stored or background response
	// ObjectRealtimeCall is a realtime (WebRTC) call, whose sideband
	// WebSocket (?call_id=) must reach the account that took the call.
	ObjectRealtimeCall ObjectKind = "realtime_call"
)

// Object is something a client created upstream through the relay: it
// lives on the account that created it, and every later request naming it
// goes there. IDs are the upstream's, unique within a client scope.
type Object struct {
	Scope        string // the client scope of the key that created it ("" keyless)
	ID           string
	Kind         ObjectKind
	AccountID    string
	Organization string // the account's organisation when it was created
	ClientKeyID  string
	ThreadKey    string // the thread that created it, if any
	RequestID    string // the request log row that created it
	Created      time.Time
	Expires      time.Time // zero: until deleted
	// Settled is when the object's usage was charged (a background
	// response); zero while it was not.
	Settled time.Time
}

type objectRow struct {
	Scope        string `db:"client_scope"`
	ID           string `db:"id"`
	Kind         string `db:"kind"`
	AccountID    string `db:"account_id"`
	Organization string `db:"organization"`
	ClientKeyID  string `db:"client_key_id"`
	ThreadKey    string `db:"thread_key"`
	RequestID    string `db:"request_id"`
	Created      int64  `db:"created_at"`
	Expires      *int64 `db:"expires_at"`
	Settled      *int64 `db:"settled_at"`
}

const objectColumns = `client_scope, id, kind, account_id, organization, client_key_id, thread_key, request_id,
	created_at, expires_at, settled_at`

func (r objectRow) object() Object {
	return Object{Scope: r.Scope, ID: r.ID, Kind: ObjectKind(r.Kind), AccountID: r.AccountID, Organization: r.Organization,
		ClientKeyID: r.ClientKeyID, ThreadKey: r.ThreadKey, RequestID: r.RequestID, Created: time.UnixMilli(r.Created).UTC(),
		Expires: fromMillis(r.Expires), Settled: fromMillis(r.Settled)}
}

// PutObject records an object. Recorded again (a retry), the first record
// stands: an id names one object on one account.
func (s *Store) PutObject(ctx context.Context, o Object) error {
	if o.ID == "" || o.AccountID == "" || o.Kind == "" {
		return errors.New("put object: an id, a kind and an account are required")
	}
	_, err := s.exec(ctx, `INSERT INTO objects (`+objectColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (client_scope, id) DO NOTHING`,
		o.Scope, o.ID, string(o.Kind), o.AccountID, o.Organization, o.ClientKeyID, o.ThreadKey, o.RequestID,
		o.Created.UnixMilli(), millis(o.Expires), millis(o.Settled))
	if err != nil {
		return fmt.Errorf("put object: %w", err)
	}
	return nil
}

// Object reads an object by scope and id: ErrNotFound when the relay never
// recorded it there, or it expired.
func (s *Store) Object(ctx context.Context, scope, id string, now time.Time) (Object, error) {
	var r objectRow
	err := s.get(ctx, &r, `SELECT `+objectColumns+` FROM objects WHERE client_scope = ? AND id = ?
		AND (expires_at IS NULL OR expires_at > ?)`, scope, id, now.UnixMilli())
	if errors.Is(err, sql.ErrNoRows) {
		return Object{}, fmt.Errorf("object %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Object{}, fmt.Errorf("read object: %w", err)
	}
	return r.object(), nil
}

// ObjectFilter selects objects; empty fields do not filter.
type ObjectFilter struct {
	Scope, ThreadKey, AccountID string
	Kind                        ObjectKind
	Limit                       int // zero: 1000
}

// Objects lists objects, newest first.
func (s *Store) Objects(ctx context.Context, f ObjectFilter) ([]Object, error) {
	where, args := filterWhere([]colValue{{"client_scope", f.Scope}, {"thread_key", f.ThreadKey},
		{"account_id", f.AccountID}, {"kind", string(f.Kind)}})
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	var rows []objectRow
	if err := s.selectAll(ctx, &rows, `SELECT `+objectColumns+` FROM objects WHERE `+where+
		fmt.Sprintf(` ORDER BY created_at DESC, id DESC LIMIT %d`, limit), args...); err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	out := make([]Object, len(rows))
	for i, r := range rows {
		out[i] = r.object()
	}
	return out, nil
}

// DeleteObject forgets an object (the upstream deleted it). Forgetting one
// that is not there is not an error.
func (s *Store) DeleteObject(ctx context.Context, scope, id string) error {
	if _, err := s.exec(ctx, `DELETE FROM objects WHERE client_scope = ? AND id = ?`, scope, id); err != nil {
		return fmt.Errorf("delete object: %w", err)
	}
	return nil
}

// SettleObject marks an object's usage charged at at, and reports whether
// this call did: of many answers reporting a background response complete,
// on any replica, exactly one settles it.
func (s *Store) SettleObject(ctx context.Context, scope, id string, at time.Time) (bool, error) {
	res, err := s.exec(ctx, `UPDATE objects SET settled_at = ? WHERE client_scope = ? AND id = ? AND settled_at IS NULL`,
		at.UnixMilli(), scope, id)
	if err != nil {
		return false, fmt.Errorf("settle object: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("settle object: %w", err)
	}
	return n == 1, nil
}

// DeleteExpiredObjects deletes the objects whose expiry is at or before
// now, and reports how many.
func (s *Store) DeleteExpiredObjects(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM objects WHERE expires_at IS NOT NULL AND expires_at <= ?`, now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete expired objects: %w", err)
	}
	return res.RowsAffected()
}
