package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/lib/pq"
)

// Replica is one relay process serving on this database, as its last
// heartbeat left it.
type Replica struct {
	ID   string
	Name string // host and process, for operators
	// Address is the base URL the other replicas forward requests to; ""
	// when this replica takes none.
	Address     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	// Lanes is the replica's snapshot of its live lanes (JSON), written
	// with every heartbeat.
	Lanes json.RawMessage
}

type replicaRow struct {
	ID          string `db:"id"`
	Name        string `db:"name"`
	Address     string `db:"address"`
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
	_, err := s.exec(ctx, `INSERT INTO replicas (id, name, address, started_at, heartbeat_at, lanes) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, address = excluded.address, heartbeat_at = excluded.heartbeat_at, lanes = excluded.lanes`,
		r.ID, r.Name, r.Address, r.StartedAt.UnixMilli(), s.now().UnixMilli(), lanes)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// No client waits behind a heartbeat: its deadline passing means
		// the database did not answer (a link that drops packets, a
		// frozen server), which refuses writes as surely as an error does.
		// Requests are then refused at once rather than each waiting out
		// its own deadline, and /readyz says why.
		err = fmt.Errorf("the database did not answer within the heartbeat's deadline: %w", err)
		s.noteRefused(err)
	} else {
		s.noteWrite(ctx, err)
	}
	if err != nil {
		return fmt.Errorf("replica heartbeat: %w", err)
	}
	return nil
}

// Replicas lists the replicas whose last heartbeat is at or after since,
// oldest first, and deletes the rows of those that stopped before it,
// recorded as departures first (see ReplicaDepartures).
func (s *Store) Replicas(ctx context.Context, since time.Time) ([]Replica, error) {
	if !since.IsZero() {
		now := s.now().UnixMilli()
		if _, err := s.exec(ctx, `INSERT INTO replica_departures (id, name, address, started_at, heartbeat_at, departed_at)
			SELECT id, name, address, started_at, heartbeat_at, ? FROM replicas WHERE heartbeat_at < ?
			ON CONFLICT (id) DO NOTHING`, now, since.UnixMilli()); err != nil {
			return nil, fmt.Errorf("record departed replicas: %w", err)
		}
		if _, err := s.exec(ctx, `DELETE FROM replica_departures WHERE departed_at < ?`, now-departureKeep.Milliseconds()); err != nil {
			return nil, fmt.Errorf("forget old departures: %w", err)
		}
	}
	if _, err := s.exec(ctx, `DELETE FROM replicas WHERE heartbeat_at < ?`, since.UnixMilli()); err != nil {
		return nil, fmt.Errorf("delete dead replicas: %w", err)
	}
	var rows []replicaRow
	if err := s.selectAll(ctx, &rows, `SELECT id, name, address, started_at, heartbeat_at, lanes FROM replicas
		WHERE heartbeat_at >= ? ORDER BY started_at, id`, since.UnixMilli()); err != nil {
		return nil, fmt.Errorf("list replicas: %w", err)
	}
	out := make([]Replica, len(rows))
	for i, r := range rows {
		out[i] = Replica{ID: r.ID, Name: r.Name, Address: r.Address, StartedAt: time.UnixMilli(r.StartedAt).UTC(),
			HeartbeatAt: time.UnixMilli(r.HeartbeatAt).UTC(), Lanes: json.RawMessage(r.Lanes)}
	}
	return out, nil
}

// departureKeep is how long a departure is remembered (and reported).
const departureKeep = 24 * time.Hour

// ReplicaDeparture is a replica whose heartbeat lapsed, without the clean
// stop that deletes its row: killed, frozen, cut off.
type ReplicaDeparture struct {
	ID, Name, Address string
	StartedAt         time.Time
	HeartbeatAt       time.Time // its last
	DepartedAt        time.Time // when another replica found it gone
}

// ReplicaDepartures lists the departures of the last day, oldest first.
func (s *Store) ReplicaDepartures(ctx context.Context) ([]ReplicaDeparture, error) {
	var rows []struct {
		ID          string `db:"id"`
		Name        string `db:"name"`
		Address     string `db:"address"`
		StartedAt   int64  `db:"started_at"`
		HeartbeatAt int64  `db:"heartbeat_at"`
		DepartedAt  int64  `db:"departed_at"`
	}
	if err := s.selectAll(ctx, &rows, `SELECT id, name, address, started_at, heartbeat_at, departed_at FROM replica_departures
		ORDER BY departed_at, id`); err != nil {
		return nil, fmt.Errorf("list replica departures: %w", err)
	}
	out := make([]ReplicaDeparture, len(rows))
	for i, r := range rows {
		out[i] = ReplicaDeparture{ID: r.ID, Name: r.Name, Address: r.Address, StartedAt: time.UnixMilli(r.StartedAt).UTC(),
			HeartbeatAt: time.UnixMilli(r.HeartbeatAt).UTC(), DepartedAt: time.UnixMilli(r.DepartedAt).UTC()}
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
	Kind string `json:"kind"` // AnnounceForget, AnnounceLeaseTaken, AnnounceAccounts or AnnounceKeys
	// Threads are the (thread key, client scope) pairs whose local state
	// (continuity, lanes) every replica drops (AnnounceForget), or whose
	// lane lease the announcing replica took over (AnnounceLeaseTaken).
	Threads []ThreadRef `json:"threads,omitempty"`
}

// ThreadRef names one thread's state: its binding key and client scope.
type ThreadRef struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
}

// Announcement kinds.
const (
	AnnounceForget = "forget"
	// AnnounceLeaseTaken: the announcing replica took over these threads'
	// lane leases (their holder's heartbeat had lapsed, or it had gone):
	// a holder still alive retires their bridge lanes and stops serving
	// them itself.
	AnnounceLeaseTaken = "lease_taken"
	AnnounceAccounts   = "accounts" // an account changed: drop cached listings
	AnnounceKeys       = "keys"     // a client key changed: drop cached keys
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
// ends, dropping this store's cached account listing (or client keys) on
// each accounts (or keys) announcement first. After the connection was lost and regained, f gets
// an announcement of kind AnnounceResync: whatever was announced meanwhile
// is unknown, so local state should be dropped. On SQLite it only waits.
func (s *Store) Listen(ctx context.Context, log *slog.Logger, f func(Announcement)) error {
	if s.loc.Dialect != Postgres {
		<-ctx.Done()
		return nil
	}
	d := &listenDialer{}
	l := pq.NewDialListener(dialFunc(d.dial), s.loc.DSN, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		if err != nil {
			log.Warn("announcements connection", "event", ev, "err", s.loc.scrub(err))
		}
	})
	defer l.Close()
	// The listener waits on the database without a context (to connect, to
	// subscribe, for a ping's answer): when ctx ends, its sockets are cut
	// and it is closed, which ends whatever it waits on, even a database
	// that does not answer.
	stop := context.AfterFunc(ctx, func() {
		d.cut(true)
		l.Close()
	})
	defer stop()
	if err := l.Listen(announceChannel); err != nil {
		return fmt.Errorf("listen for announcements: %w", err)
	}
	// Whatever was cached before now may have missed an announcement made
	// before the subscription (a listing read at start, keys read while
	// the previous listener was down): read afresh from here on.
	s.accts.changed()
	s.keys.changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-l.Notify:
			if n == nil { // reconnected: announcements may have been missed
				s.accts.changed()
				s.keys.changed()
				f(Announcement{Kind: AnnounceResync})
				continue
			}
			var a Announcement
			if err := json.Unmarshal([]byte(n.Extra), &a); err != nil {
				log.Warn("announcement ignored", "err", err)
				continue
			}
			switch a.Kind {
			case AnnounceAccounts:
				s.accts.changed()
			case AnnounceKeys:
				s.keys.changed()
				s.keys.setEverCreated()
			}
			f(a)
		case <-time.After(time.Minute):
			// A quiet minute: check the connection is alive. One that does
			// not answer within listenPingTimeout is cut: the listener
			// connects again and announces a resync.
			cut := time.AfterFunc(listenPingTimeout, func() { d.cut(false) })
			err := l.Ping()
			cut.Stop()
			if err != nil && !errors.Is(err, pq.ErrChannelNotOpen) {
				log.Warn("announcements ping", "err", err)
			}
		}
	}
}

// listenPingTimeout bounds the answer to the announcement listener's ping.
const listenPingTimeout = 10 * time.Second

// AnnounceResync is delivered by Listen after a lost connection came back.
const AnnounceResync = "resync"

// LaneLease is who serves a thread's HTTP requests.
type LaneLease struct {
	ThreadKey, ClientScope string
	ReplicaID              string
	Address                string // the holder's address, for forwarding
	Epoch                  int64
}

// LeaseLane takes or renews the lease of a thread for replica me, unless
// another replica whose heartbeat is at or after liveSince holds it: then
// it returns that replica's lease (and address) to forward to. A lease of a
// dead or vanished replica is taken over with the next epoch. One statement
// decides, so two replicas taking a thread over at once cannot both win;
// it returns the lease when me holds it, so only a lease held elsewhere
// costs a second round trip (to read its holder). Every new thread takes
// one: leases taken at the same time share one statement (see batcher), so
// a burst of new threads does not queue for connections one lease each.
func (s *Store) LeaseLane(ctx context.Context, threadKey, scope, me string, liveSince time.Time) (LaneLease, error) {
	won, err := s.leaseWrites.do(ctx, leaseAsk{thread: threadKey, scope: scope, me: me, liveSince: liveSince.UnixMilli()})
	if err != nil {
		return LaneLease{}, fmt.Errorf("lease lane: %w", err)
	}
	if won.held {
		return LaneLease{ThreadKey: threadKey, ClientScope: scope, ReplicaID: me, Address: won.address, Epoch: won.epoch}, nil
	}
	var row struct {
		ReplicaID string         `db:"replica_id"`
		Epoch     int64          `db:"epoch"`
		Address   sql.NullString `db:"address"`
	}
	err = s.get(ctx, &row, `SELECT l.replica_id, l.epoch, r.address FROM lane_leases l LEFT JOIN replicas r ON r.id = l.replica_id
		WHERE l.thread_key = ? AND l.client_scope = ?`, threadKey, scope)
	if err != nil {
		return LaneLease{}, fmt.Errorf("read lane lease: %w", err)
	}
	return LaneLease{ThreadKey: threadKey, ClientScope: scope, ReplicaID: row.ReplicaID, Address: row.Address.String, Epoch: row.Epoch}, nil
}

// leaseAsk is one LeaseLane call; leaseWon its answer from the write.
type leaseAsk struct {
	thread, scope, me string
	liveSince         int64 // unix ms
}

type leaseWon struct {
	held    bool // me holds the lease now; else another live replica does
	epoch   int64
	address string
}

// leaseUpsert takes or renews leases for one replica: its VALUES rows
// (thread_key, client_scope, replica_id, 1, renewed_at) go after it, then
// leaseOnConflict with the liveness bound.
const (
	leaseUpsert     = `INSERT INTO lane_leases (thread_key, client_scope, replica_id, epoch, renewed_at) VALUES `
	leaseRow        = `(?, ?, ?, 1, ?)`
	leaseOnConflict = `
		ON CONFLICT (thread_key, client_scope) DO UPDATE SET
			epoch = CASE WHEN lane_leases.replica_id = excluded.replica_id THEN lane_leases.epoch ELSE lane_leases.epoch + 1 END,
			replica_id = excluded.replica_id, renewed_at = excluded.renewed_at
		WHERE lane_leases.replica_id = excluded.replica_id
			OR NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = lane_leases.replica_id AND r.heartbeat_at >= ?)
		RETURNING thread_key, client_scope, epoch, (SELECT r.address FROM replicas r WHERE r.id = lane_leases.replica_id) AS address`
)

// writeLeases takes or renews the leases asks name, one statement for
// each replica among them (there is one, this replica, but for tests
// that play several on one Store). A thread asked for twice is written
// once. Within one statement the earliest liveness bound counts: a holder
// that any of the calls would count alive keeps its lease. Rows go in the
// order of their keys, so two replicas' statements lock the rows they
// share in the same order and never deadlock. A lone lease runs prepared;
// a batch's text varies with its size, so it runs unprepared (one
// statement still, instead of one each).
func (s *Store) writeLeases(ctx context.Context, asks []leaseAsk) ([]leaseWon, error) {
	type thread struct{ key, scope string }
	type held struct {
		Thread  string         `db:"thread_key"`
		Scope   string         `db:"client_scope"`
		Epoch   int64          `db:"epoch"`
		Address sql.NullString `db:"address"`
	}
	won := map[string]map[thread]leaseWon{}
	now := s.now().UnixMilli()
	for _, me := range uniqueReplicas(asks) {
		var rows []string
		var args []any
		liveSince := int64(0)
		var threads []thread
		for _, a := range asks {
			if a.me != me {
				continue
			}
			threads = append(threads, thread{a.thread, a.scope})
			if liveSince == 0 || a.liveSince < liveSince {
				liveSince = a.liveSince
			}
		}
		slices.SortFunc(threads, func(a, b thread) int {
			return cmp.Or(strings.Compare(a.key, b.key), strings.Compare(a.scope, b.scope))
		})
		for _, t := range slices.Compact(threads) {
			rows = append(rows, leaseRow)
			args = append(args, t.key, t.scope, me, now)
		}
		args = append(args, liveSince)
		query := leaseUpsert + strings.Join(rows, ", ") + leaseOnConflict
		var got []held
		var err error
		if len(rows) == 1 {
			err = s.writeQuery(ctx, &got, query, args...)
		} else {
			err = s.writeQueryUnprepared(ctx, &got, query, args...)
		}
		s.noteWrite(ctx, err)
		if err != nil {
			return nil, err
		}
		won[me] = map[thread]leaseWon{}
		for _, h := range got {
			won[me][thread{h.Thread, h.Scope}] = leaseWon{held: true, epoch: h.Epoch, address: h.Address.String}
		}
	}
	out := make([]leaseWon, len(asks))
	for i, a := range asks {
		out[i] = won[a.me][thread{a.thread, a.scope}]
	}
	return out, nil
}

// uniqueReplicas is the replicas asks are made for, in order of first ask.
func uniqueReplicas(asks []leaseAsk) []string {
	var mes []string
	for _, a := range asks {
		if !slices.Contains(mes, a.me) {
			mes = append(mes, a.me)
		}
	}
	return mes
}

// DeleteStaleLeases deletes leases last renewed before before.
func (s *Store) DeleteStaleLeases(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM lane_leases WHERE renewed_at < ?`, before.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete stale leases: %w", err)
	}
	return res.RowsAffected()
}
