package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lib/pq"
)

// Replica is one relay process serving on this database, as its last
// heartbeat left it.
type Replica struct {
	ID          string
	Name        string // host and process, for operators
	StartedAt   time.Time
	HeartbeatAt time.Time
	// Lanes is the replica's snapshot of its live lanes (JSON), written
	// with every heartbeat.
	Lanes json.RawMessage
}

type replicaRow struct {
	ID          string `db:"id"`
	Name        string `db:"name"`
	StartedAt   int64  `db:"started_at"`
	HeartbeatAt int64  `db:"heartbeat_at"`
	Lanes       string `db:"lanes"`
}

// Heartbeat writes the replica's row: registered on the first call, its
// heartbeat time (now) and lane snapshot renewed on every later one.
func (s *Store) Heartbeat(ctx context.Context, r Replica) error {
	lanes := string(r.Lanes)
	if lanes == "" {
		lanes = "[]"
	}
	_, err := s.exec(ctx, `INSERT INTO replicas (id, name, started_at, heartbeat_at, lanes) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, heartbeat_at = excluded.heartbeat_at, lanes = excluded.lanes`,
		r.ID, r.Name, r.StartedAt.UnixMilli(), s.now().UnixMilli(), lanes)
	if err != nil {
		return fmt.Errorf("replica heartbeat: %w", err)
	}
	return nil
}

// Replicas lists the replicas whose last heartbeat is at or after since,
// oldest first, and deletes the rows of those that stopped before it.
func (s *Store) Replicas(ctx context.Context, since time.Time) ([]Replica, error) {
	if _, err := s.exec(ctx, `DELETE FROM replicas WHERE heartbeat_at < ?`, since.UnixMilli()); err != nil {
		return nil, fmt.Errorf("delete dead replicas: %w", err)
	}
	var rows []replicaRow
	if err := s.selectAll(ctx, &rows, `SELECT id, name, started_at, heartbeat_at, lanes FROM replicas
		WHERE heartbeat_at >= ? ORDER BY started_at, id`, since.UnixMilli()); err != nil {
		return nil, fmt.Errorf("list replicas: %w", err)
	}
	out := make([]Replica, len(rows))
	for i, r := range rows {
		out[i] = Replica{ID: r.ID, Name: r.Name, StartedAt: time.UnixMilli(r.StartedAt).UTC(),
			HeartbeatAt: time.UnixMilli(r.HeartbeatAt).UTC(), Lanes: json.RawMessage(r.Lanes)}
	}
	return out, nil
}

// RemoveReplica deletes a replica's row, as it stops.
func (s *Store) RemoveReplica(ctx context.Context, id string) error {
	if _, err := s.exec(ctx, `DELETE FROM replicas WHERE id = ?`, id); err != nil {
		return fmt.Errorf("remove replica: %w", err)
	}
	return nil
}

// announceChannel is the PostgreSQL NOTIFY channel replicas talk on.
const announceChannel = "codex_relay"

// maxAnnouncement bounds one announcement's JSON: PostgreSQL refuses
// NOTIFY payloads of 8000 bytes or more.
const maxAnnouncement = 7900

// Announcement is a change one replica tells the others about, so what
// they hold in memory stays coherent with the database.
type Announcement struct {
	From string `json:"from"` // the announcing replica
	Kind string `json:"kind"` // AnnounceForget or AnnounceAccounts
	// Threads are the (thread key, client scope) pairs whose local state
	// (continuity, lanes) every replica drops (AnnounceForget).
	Threads []ThreadRef `json:"threads,omitempty"`
}

// ThreadRef names one thread's state: its binding key and client scope.
type ThreadRef struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
}

// Announcement kinds.
const (
	AnnounceForget   = "forget"
	AnnounceAccounts = "accounts" // an account changed: drop cached listings
)

// Announce tells every replica listening on this database (this one too)
// about a change. On SQLite, which one process serves, it does nothing.
// A forget naming many threads goes out in several announcements, each
// under PostgreSQL's payload limit.
func (s *Store) Announce(ctx context.Context, a Announcement) error {
	if s.loc.Dialect != Postgres {
		return nil
	}
	for _, part := range splitAnnouncement(a) {
		payload, err := json.Marshal(part)
		if err != nil {
			return err
		}
		if _, err := s.exec(ctx, `SELECT pg_notify(?, ?)`, announceChannel, string(payload)); err != nil {
			return fmt.Errorf("announce %s: %w", a.Kind, err)
		}
	}
	return nil
}

// splitAnnouncement cuts a's thread list into announcements that each
// encode within maxAnnouncement bytes.
func splitAnnouncement(a Announcement) []Announcement {
	if len(a.Threads) == 0 {
		return []Announcement{a}
	}
	var out []Announcement
	cur := Announcement{From: a.From, Kind: a.Kind}
	size := len(a.From) + len(a.Kind) + 64
	for _, t := range a.Threads {
		n := len(t.Key) + len(t.Scope) + 32
		if len(cur.Threads) > 0 && size+n > maxAnnouncement {
			out = append(out, cur)
			cur = Announcement{From: a.From, Kind: a.Kind}
			size = len(a.From) + len(a.Kind) + 64
		}
		cur.Threads = append(cur.Threads, t)
		size += n
	}
	return append(out, cur)
}

// Listen delivers every announcement made on this database to f until ctx
// ends, dropping this store's cached account listing on each accounts
// announcement first. After the connection was lost and regained, f gets
// an announcement of kind AnnounceResync: whatever was announced meanwhile
// is unknown, so local state should be dropped. On SQLite it only waits.
func (s *Store) Listen(ctx context.Context, log *slog.Logger, f func(Announcement)) error {
	if s.loc.Dialect != Postgres {
		<-ctx.Done()
		return nil
	}
	l := pq.NewListener(s.loc.DSN, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		if err != nil {
			log.Warn("announcements connection", "event", ev, "err", err)
		}
	})
	defer l.Close()
	if err := l.Listen(announceChannel); err != nil {
		return fmt.Errorf("listen for announcements: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-l.Notify:
			if n == nil { // reconnected: announcements may have been missed
				s.accts.changed()
				f(Announcement{Kind: AnnounceResync})
				continue
			}
			var a Announcement
			if err := json.Unmarshal([]byte(n.Extra), &a); err != nil {
				log.Warn("announcement ignored", "err", err)
				continue
			}
			if a.Kind == AnnounceAccounts {
				s.accts.changed()
			}
			f(a)
		case <-time.After(time.Minute):
			// A quiet minute: check the connection is alive.
			if err := l.Ping(); err != nil && !errors.Is(err, pq.ErrChannelNotOpen) {
				log.Warn("announcements ping", "err", err)
			}
		}
	}
}

// AnnounceResync is delivered by Listen after a lost connection came back.
const AnnounceResync = "resync"
