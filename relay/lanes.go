package relay

import (
	"sort"
	"time"
)

// LaneInfo describes one live upstream lane, for operators.
type LaneInfo struct {
	Kind      string    `json:"kind"` // direct (a client WebSocket's), bridge (HTTP clients') or bridge_fork
	AccountID string    `json:"account_id"`
	SessionID string    `json:"session_id"`
	ThreadID  string    `json:"thread_id"`
	ThreadKey string    `json:"thread_key"`
	OpenedAt  time.Time `json:"opened_at"`
	Requests  int64     `json:"requests"`
	Replica   string    `json:"replica"` // the replica holding it (its name)
	// Retiring: the lane closes when its turn ends (its thread was moved or
	// reset while it was busy).
	Retiring bool `json:"retiring,omitempty"`
}

// Lanes lists the live upstream lanes of every replica, oldest first:
// this one's as they are, the others' as their last heartbeat left them.
func (s *Server) Lanes() []LaneInfo {
	out := s.localLanes()
	if remote := s.remoteLanes.Load(); remote != nil {
		out = append(out, *remote...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].OpenedAt.Before(out[j].OpenedAt) })
	return out
}

// localLanes lists this replica's live lanes.
func (s *Server) localLanes() []LaneInfo {
	var out []LaneInfo
	for _, in := range s.pool.Infos() {
		out = append(out, LaneInfo{Kind: in.Kind, AccountID: in.Account, SessionID: in.SessionID, ThreadID: in.ThreadID,
			ThreadKey: in.Key.Thread, OpenedAt: in.Opened, Requests: in.Requests, Replica: s.cfg.Replica.Name, Retiring: in.Retiring})
	}
	return out
}

// AccountLanes reports the upstream lanes open on an account on this
// replica, of every kind, and the cap they count against.
func (s *Server) AccountLanes(accountID string) (open, max int) {
	return s.pool.AccountLanes(accountID)
}
