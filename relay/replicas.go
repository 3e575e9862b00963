package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
)

// Several replicas share one PostgreSQL database. Each registers in the
// replicas table and renews its row every heartbeat with a snapshot of its
// live lanes, so every replica's operators see every lane. Local state
// that a change elsewhere makes stale is announced (LISTEN/NOTIFY): a
// binding reset on one replica drops that thread's continuity and closes
// its lanes on all of them; an account write drops every cached listing.

// ReplicaConfig names this process among the replicas.
type ReplicaConfig struct {
	// ID names the process: unique, and never reused by a later one (a
	// hop addressed to it is refused as a replay only by the process that
	// accepted it: see hopNonces). Default random. It holds no dot.
	ID   string
	Name string // for operators; default host:pid
	// Heartbeat is how often the replica renews its row; one silent for
	// three heartbeats is dead. Default 5s.
	Heartbeat time.Duration
	// Address is the base URL the other replicas forward requests to ("":
	// this replica takes no forwarded requests and forwards none).
	Address string
	// HopKey signs and checks forwarded requests; every replica derives
	// the same from the shared secret key. Nil: no forwarding.
	HopKey []byte
}

func (c ReplicaConfig) withDefaults() ReplicaConfig {
	if c.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.ID = "rep_" + hex.EncodeToString(b[:])
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 5 * time.Second
	}
	return c
}

// ReplicaID names this replica among those sharing the database.
func (s *Server) ReplicaID() string { return s.cfg.Replica.ID }

// ReplicaLiveSince is the heartbeat time before which a replica counts as
// dead: three heartbeats ago.
func (s *Server) ReplicaLiveSince() time.Time { return s.cfg.Now().Add(-3 * s.cfg.Replica.Heartbeat) }

// maxSnapshotLanes bounds the lanes a heartbeat publishes.
const maxSnapshotLanes = 2000

// heartbeat registers this replica, renews it every Heartbeat with its
// lane snapshot, refreshes the other replicas' lanes, and removes the row
// when ctx ends.
func (s *Server) heartbeat(ctx context.Context) {
	rc := s.cfg.Replica
	started := s.cfg.Now()
	beat := func() {
		lanes := s.localLanes()
		if len(lanes) > maxSnapshotLanes {
			lanes = lanes[:maxSnapshotLanes]
		}
		snap, err := json.Marshal(lanes)
		if err != nil {
			s.log.Warn("lane snapshot", "err", err)
			snap = []byte("[]")
		}
		bctx, cancel := context.WithTimeout(ctx, rc.Heartbeat)
		defer cancel()
		if err := s.cfg.Store.Heartbeat(bctx, store.Replica{ID: rc.ID, Name: rc.Name, Address: rc.Address, StartedAt: started, Lanes: snap}); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("replica heartbeat", "err", err)
			}
			// The other replicas may count this one gone and take its
			// threads over, and their announcements may not reach it (a
			// silent link keeps the listener's connection looking open
			// until it heals): each thread's next request here reads its
			// lease afresh instead of trusting the one held in memory.
			s.leased.Clear()
			return
		}
		reps, err := s.cfg.Store.Replicas(bctx, s.ReplicaLiveSince())
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("list replicas", "err", err)
			}
			return
		}
		var remote []LaneInfo
		for _, r := range reps {
			if r.ID == rc.ID {
				continue
			}
			var ls []LaneInfo
			if err := json.Unmarshal(r.Lanes, &ls); err != nil {
				s.log.Warn("replica lane snapshot unreadable", "replica", r.Name, "err", err)
				continue
			}
			for i := range ls {
				ls[i].Replica = r.Name
			}
			remote = append(remote, ls...)
		}
		s.remoteLanes.Store(&remote)
	}
	beat()
	t := time.NewTicker(rc.Heartbeat)
	defer t.Stop()
	// While the database refuses writes the heartbeat comes every second:
	// the first that goes through readmits requests and readies /readyz
	// (see store.WritesRefused), so a database that is back is used at once.
	pace := func() {
		if s.cfg.Store.WritesRefused() != nil {
			t.Reset(min(rc.Heartbeat, time.Second))
		} else {
			t.Reset(rc.Heartbeat)
		}
	}
	pace()
	deregister := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := s.cfg.Store.RemoveReplica(rctx, rc.ID); err != nil {
			s.log.Warn("replica deregistration", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			deregister()
			return
		case <-s.draining.Done():
			// A draining replica hands its threads over at once: with its
			// row gone, its lane leases are the next replica's to take
			// (without waiting for the heartbeat to go stale), and no
			// replica forwards to it any more.
			deregister()
			return
		case <-t.C:
			beat()
			pace()
		}
	}
}

// listen applies the other replicas' announcements until ctx ends,
// reconnecting after errors.
func (s *Server) listen(ctx context.Context) {
	for {
		err := s.cfg.Store.Listen(ctx, s.log, s.applyAnnouncement)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("announcements", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func (s *Server) applyAnnouncement(a store.Announcement) {
	if a.From == s.cfg.Replica.ID {
		return // done here before it was announced
	}
	switch a.Kind {
	case store.AnnounceForget:
		s.forgetLocal(a.Threads)
	case store.AnnounceLeaseTaken:
		// Another replica took these threads over while this one was
		// thought gone: their requests go there now. The bridge lane here
		// closes at its turn boundary (a WebSocket client's own lane stays:
		// its connection is here), and the next request that reaches this
		// replica reads the lease afresh, and is forwarded.
		for _, t := range a.Threads {
			s.leased.Delete(leaseKeyOf(t.Scope, t.Key))
			s.pool.Retire(bridge.Key{Thread: t.Key, Scope: t.Scope})
		}
	case store.AnnounceResync:
		// A reset announced while the connection was down went unheard: let
		// no lane here keep a thread on an account it was reset from. Idle
		// lanes close now, busy ones at the end of their turn; each thread's
		// next request is placed afresh, and reads its lease afresh (a
		// takeover may have gone unheard too).
		s.leased.Clear()
		closed := s.pool.RetireAll()
		s.log.Warn("announcements resumed after a lost connection: lanes retired in case a reset was missed", "lanes_closed", closed)
	}
}

// Forget drops what every replica holds for reset bindings: the continuity
// entries of their threads, and the lanes serving them (the client's next
// request is placed afresh). Pins and session rows hold no local state.
func (s *Server) Forget(reset []store.Binding) {
	var threads []store.ThreadRef
	for _, b := range reset {
		if b.Kind == store.BindThread {
			threads = append(threads, store.ThreadRef{Key: b.Key, Scope: b.ClientScope})
		}
	}
	if len(threads) == 0 {
		return
	}
	s.forgetLocal(threads)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Store.Announce(ctx, store.Announcement{From: s.cfg.Replica.ID, Kind: store.AnnounceForget, Threads: threads}); err != nil {
		s.log.Warn("announce reset to the other replicas", "err", err)
	}
}

// forgetLocal drops this replica's continuity and lanes for threads: the
// thread's bridge lane and every client WebSocket's lane of it, each at its
// turn boundary, never mid-turn.
func (s *Server) forgetLocal(threads []store.ThreadRef) {
	for _, t := range threads {
		s.conts.Drop(continuity.Key{Thread: t.Key, Scope: t.Scope})
		s.pool.Forget(bridge.Key{Thread: t.Key, Scope: t.Scope})
	}
}
