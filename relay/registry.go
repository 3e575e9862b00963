package relay

import (
	"sort"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/store"
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

// Lanes lists the live upstream lanes of this replica, oldest first.
func (s *Server) Lanes() []LaneInfo {
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
			out = append(out, LaneInfo{Kind: kind, AccountID: in.Account, ThreadKey: in.Key.Thread, OpenedAt: in.Opened, Requests: in.Requests})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].OpenedAt.Before(out[j].OpenedAt) })
	return out
}

// Forget drops what this replica holds for reset bindings: the continuity
// entries of their threads, and the lanes serving them (the client's next
// request is placed afresh). Pins and session rows hold no local state.
func (s *Server) Forget(reset []store.Binding) {
	keys := map[continuity.Key]bool{}
	for _, b := range reset {
		if b.Kind == store.BindThread {
			keys[continuity.Key{Thread: b.Key, Scope: b.ClientScope}] = true
			s.conts.Drop(continuity.Key{Thread: b.Key, Scope: b.ClientScope})
			if s.pool != nil {
				s.pool.Forget(bridge.Key{Thread: b.Key, Scope: b.ClientScope})
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	s.registry.each(func(ws *wsSession) {
		if keys[continuity.Key{Thread: string(ws.ident.Key), Scope: ws.client.scope()}] {
			ws.requestLaneReset()
		}
	})
}
