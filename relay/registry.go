package relay

import (
	"sort"
	"sync"
	"time"
)

// LaneInfo describes one live upstream lane, for operators.
type LaneInfo struct {
	Kind      string    `json:"kind"` // direct (a client WebSocket) or bridge (HTTP clients)
	AccountID string    `json:"account_id"`
	SessionID string    `json:"session_id"`
	ThreadID  string    `json:"thread_id"`
	ThreadKey string    `json:"thread_key"`
	OpenedAt  time.Time `json:"opened_at"`
	Requests  int64     `json:"requests"`
	Replica   string    `json:"replica"` // the replica holding it (its name)
}

// sessionRegistry tracks live client WebSocket sessions so operators can
// list their lanes and a reset can close them. Safe for concurrent use.
type sessionRegistry struct {
	mu       sync.Mutex
	sessions map[*wsSession]struct{} // guarded by mu
}

func (r *sessionRegistry) add(ws *wsSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions == nil {
		r.sessions = map[*wsSession]struct{}{}
	}
	r.sessions[ws] = struct{}{}
}

func (r *sessionRegistry) remove(ws *wsSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sessions, ws)
}

func (r *sessionRegistry) each(f func(ws *wsSession)) {
	r.mu.Lock()
	list := make([]*wsSession, 0, len(r.sessions))
	for ws := range r.sessions {
		list = append(list, ws)
	}
	r.mu.Unlock()
	for _, ws := range list {
		f(ws)
	}
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
	s.registry.each(func(ws *wsSession) {
		if info, ok := ws.laneInfo(); ok {
			out = append(out, info)
		}
	})
	if s.pool != nil {
		for _, in := range s.pool.Infos() {
			kind := "bridge"
			if in.Fork {
				kind = "bridge_fork"
			}
			out = append(out, LaneInfo{Kind: kind, AccountID: in.Account, SessionID: in.SessionID, ThreadID: in.ThreadID,
				ThreadKey: in.Key.Thread, OpenedAt: in.Opened, Requests: in.Requests})
		}
	}
	for i := range out {
		out[i].Replica = s.cfg.Replica.Name
	}
	return out
}
