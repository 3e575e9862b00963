package bridge

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Key names a canonical lane: a derived thread key and the client key scope,
// and for a client WebSocket's own (direct) lane, that connection. Never the
// (session, prompt_cache_key) pair, which every thread of a tree shares.
type Key struct {
	Thread string
	Scope  string
	// Conn names the client connection a direct lane serves; "" for a
	// thread's bridge lane, which any HTTP request of the thread may use.
	Conn string
}

// sameThread reports whether k is a lane of the thread t names (any
// connection's).
func (k Key) sameThread(t Key) bool { return k.Thread == t.Thread && k.Scope == t.Scope }

// PoolConfig tunes a Pool; zero values select the defaults.
type PoolConfig struct {
	// IdleTimeout closes a canonical lane unused this long. Default 5m.
	IdleTimeout time.Duration
	// MaxAge retires a lane this old, ahead of the upstream's 60-minute
	// connection limit: only between requests (at the next Acquire, or by
	// the sweeper while it is idle), never while a request streams on it,
	// so the margin below the limit must cover the longest request. The
	// next request then goes on a fresh lane of the same account, in full.
	// Bridge lanes and client WebSockets' direct lanes alike. Default 55m.
	MaxAge time.Duration
	// MaxLanesPerAccount caps open lanes per account: bridge lanes, their
	// forks and client WebSockets' direct lanes alike. Default 64.
	MaxLanesPerAccount int
	// WaitTimeout bounds waiting for lane capacity. Default 30s.
	WaitTimeout time.Duration
	// SweepEvery is how often Run closes idle and aged lanes. Default 5s.
	SweepEvery time.Duration
	// KeepAliveEvery is how often a request waiting for capacity hears its
	// onWait callback (the relay sends an SSE comment). Default 5s.
	KeepAliveEvery time.Duration
	Now            func() time.Time
	// OnEvent is told of lane lifecycle events (opened, reused, forked,
	// released, retired, idle_closed, aged_out, evicted, closed), for
	// metrics.
	OnEvent func(event string)
}

func (c *PoolConfig) defaults() {
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 55 * time.Minute
	}
	if c.MaxLanesPerAccount <= 0 {
		c.MaxLanesPerAccount = 64
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = 30 * time.Second
	}
	if c.SweepEvery <= 0 {
		c.SweepEvery = 5 * time.Second
	}
	if c.KeepAliveEvery <= 0 {
		c.KeepAliveEvery = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.OnEvent == nil {
		c.OnEvent = func(string) {}
	}
}

// entry is a canonical lane and what its upstream holds.
type entry struct {
	lane     *Lane // nil while being dialled
	account  string
	state    State
	busy     bool
	lastUsed time.Time
	thread   Key
	// retire closes the lane when its request ends: the thread must be
	// placed afresh (an operator's reset, a missed announcement), and a
	// busy lane is never cut mid-turn.
	retire bool
}

// Pool keeps the relay's upstream lanes: one canonical lane per key, used by
// one request at a time. A thread's bridge lane serves its HTTP requests; a
// concurrent request on a busy thread gets a fork lane of its own, closed
// when that request ends. A client WebSocket's direct lane is keyed by its
// connection too, so it serves that connection alone. All of them count
// against one cap per account. Safe for concurrent use.
type Pool struct {
	cfg PoolConfig // static after NewPool

	mu         sync.Mutex
	canon      map[Key]*entry  // guarded by mu
	perAccount map[string]int  // guarded by mu; lanes open or being dialled
	aliases    map[string]Key  // guarded by mu; response id -> the lane that produced it
	freed      chan struct{}   // guarded by mu; closed and replaced when capacity frees up
	closed     bool            // guarded by mu
	forks      map[*Lease]bool // guarded by mu; live fork leases, for Close
}

// NewPool returns an empty pool. Run its sweeper with Run.
func NewPool(cfg PoolConfig) *Pool {
	cfg.defaults()
	return &Pool{cfg: cfg, canon: map[Key]*entry{}, perAccount: map[string]int{}, aliases: map[string]Key{},
		freed: make(chan struct{}), forks: map[*Lease]bool{}}
}

// Lease is one request's use of a lane.
type Lease struct {
	Lane *Lane
	// State is what the lane's upstream holds (empty for a new lane).
	State State
	// Fork is true for a request-scoped lane.
	Fork bool
	// Fresh is true when the lane was dialled for this request.
	Fresh bool
	pool  *Pool
	key   Key
	entry *entry // canonical leases only
	done  bool
}

// Owner reports the account of k's live canonical lane: where its upstream
// holds the thread's chain, so the thread's first preference (never hard
// evidence: an operator's decision moves it).
func (p *Pool) Owner(k Key) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.canon[k]
	if e == nil || e.lane == nil || !e.lane.Alive() {
		return "", false
	}
	return e.account, true
}

// Holds reports whether k's live canonical lane is on account and holds the
// chain up to responseID (its last response), so a request chained to it
// can be sent as it is.
func (p *Pool) Holds(k Key, account, responseID string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.canon[k]
	return e != nil && e.lane != nil && e.lane.Alive() && e.account == account && e.state.ResponseID == responseID && !e.state.NoChain
}

// Alias reports the thread whose lane produced a response id.
func (p *Pool) Alias(responseID string) (Key, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.aliases[responseID]
	return k, ok
}

// Dialer opens a lane on an account.
type Dialer func(ctx context.Context) (*Lane, error)

// Acquire leases a lane of thread k on account for one request. The thread's
// idle canonical lane is reused when it is alive, on that account and young
// enough; a busy one makes this a fork; otherwise a new lane is dialled,
// waiting (at most WaitTimeout, calling onWait every tick) for capacity.
func (p *Pool) Acquire(ctx context.Context, k Key, account string, dial Dialer, onWait func()) (*Lease, error) {
	now := p.cfg.Now()
	var stale *Lane
	staleEvent := "retired"
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	e := p.canon[k]
	if e != nil && !e.busy {
		aged := e.lane != nil && now.Sub(e.lane.Opened) >= p.cfg.MaxAge
		if e.lane == nil || !e.lane.Alive() || e.account != account || aged {
			// The thread's lane cannot serve this request: retire it. An
			// aged one is idle here, between two requests: this is its
			// turn boundary.
			if aged && e.lane.Alive() && e.account == account {
				staleEvent = "aged_out"
			}
			stale = e.lane
			p.dropLocked(k, e)
			e = nil
		}
	}
	if e != nil && !e.busy {
		e.busy = true
		lease := &Lease{Lane: e.lane, State: e.state, pool: p, key: k, entry: e}
		p.mu.Unlock()
		p.cfg.OnEvent("reused")
		return lease, nil
	}
	fork := e != nil
	var mine *entry
	if !fork {
		mine = &entry{account: account, busy: true, thread: k}
		p.canon[k] = mine
	}
	p.mu.Unlock()
	if stale != nil {
		stale.Close()
		p.cfg.OnEvent(staleEvent)
	}

	if err := p.reserve(ctx, account, onWait); err != nil {
		if mine != nil {
			p.mu.Lock()
			if p.canon[k] == mine {
				delete(p.canon, k)
			}
			p.mu.Unlock()
		}
		return nil, err
	}
	lane, err := dial(ctx)
	if err != nil {
		p.mu.Lock()
		p.perAccount[account]--
		if mine != nil && p.canon[k] == mine {
			delete(p.canon, k)
		}
		p.signalLocked()
		p.mu.Unlock()
		return nil, err
	}
	lease := &Lease{Lane: lane, Fork: fork, Fresh: true, pool: p, key: k}
	p.mu.Lock()
	if p.closed {
		p.perAccount[account]--
		p.mu.Unlock()
		lane.Close()
		return nil, ErrClosed
	}
	if fork {
		p.forks[lease] = true
	} else {
		mine.lane, mine.lastUsed = lane, now
		lease.entry = mine
	}
	p.mu.Unlock()
	if fork {
		p.cfg.OnEvent("forked")
	} else {
		p.cfg.OnEvent("opened")
	}
	return lease, nil
}

// reserve takes one lane slot on account, waiting for one to free up.
func (p *Pool) reserve(ctx context.Context, account string, onWait func()) error {
	deadline := time.NewTimer(p.cfg.WaitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(p.cfg.KeepAliveEvery)
	defer tick.Stop()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		if p.perAccount[account] < p.cfg.MaxLanesPerAccount {
			p.perAccount[account]++
			p.mu.Unlock()
			return nil
		}
		if victim := p.idlestLocked(account); victim != nil {
			// At the cap, an idle lane of another thread gives way: a
			// request in hand beats a lane that may never be used again.
			p.dropLocked(victim.thread, victim)
			p.perAccount[account]++
			p.mu.Unlock()
			victim.lane.Close()
			p.cfg.OnEvent("evicted")
			return nil
		}
		freed := p.freed
		p.mu.Unlock()
		select {
		case <-freed:
		case <-tick.C:
			if onWait != nil {
				onWait()
			}
		case <-deadline.C:
			return ErrNoCapacity
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// idlestLocked returns the account's least recently used idle canonical
// lane, or nil.
func (p *Pool) idlestLocked(account string) *entry {
	var victim *entry
	for _, e := range p.canon {
		if e.account == account && !e.busy && e.lane != nil && (victim == nil || e.lastUsed.Before(victim.lastUsed)) {
			victim = e
		}
	}
	return victim
}

func (p *Pool) signalLocked() {
	close(p.freed)
	p.freed = make(chan struct{})
}

// dropLocked forgets a canonical entry and its slot; the caller closes the lane.
func (p *Pool) dropLocked(k Key, e *entry) {
	if p.canon[k] == e {
		delete(p.canon, k)
	}
	if e.lane != nil {
		p.perAccount[e.account]--
		if p.perAccount[e.account] <= 0 {
			delete(p.perAccount, e.account)
		}
		p.signalLocked()
	}
	if id := e.state.ResponseID; id != "" && p.aliases[id] == k {
		delete(p.aliases, id)
	}
}

// Release ends the lease. A canonical lane that served well keeps st (what
// its upstream now holds) for the thread's next request; one that did not
// (healthy false: broken, stalled, failed mid-request) is closed. A fork is
// always closed. Release is safe to call twice.
func (l *Lease) Release(st State, healthy bool) {
	p := l.pool
	p.mu.Lock()
	if l.done {
		p.mu.Unlock()
		return
	}
	l.done = true
	if l.Fork {
		delete(p.forks, l)
		p.perAccount[l.Lane.Account]--
		if p.perAccount[l.Lane.Account] <= 0 {
			delete(p.perAccount, l.Lane.Account)
		}
		p.signalLocked()
		p.mu.Unlock()
		l.Lane.Close()
		p.cfg.OnEvent("released")
		return
	}
	e := l.entry
	if healthy && !e.retire && e.lane.Alive() && !p.closed && p.canon[l.key] == e {
		if e.state.ResponseID != "" && e.state.ResponseID != st.ResponseID {
			delete(p.aliases, e.state.ResponseID)
		}
		e.state, e.busy, e.lastUsed = st, false, p.cfg.Now()
		if st.ResponseID != "" && l.key.Conn == "" {
			p.aliases[st.ResponseID] = l.key
		}
		p.mu.Unlock()
		return
	}
	p.dropLocked(l.key, e)
	p.mu.Unlock()
	e.lane.Close()
	p.cfg.OnEvent("retired")
}

// Run closes idle, aged and dead canonical lanes every SweepEvery until ctx
// ends, then closes every lane.
func (p *Pool) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.Close()
			return
		case <-t.C:
			p.Sweep()
		}
	}
}

// Sweep closes idle, aged and dead canonical lanes now.
func (p *Pool) Sweep() {
	now := p.cfg.Now()
	var closing []*Lane
	var events []string
	p.mu.Lock()
	for k, e := range p.canon {
		if e.busy || e.lane == nil {
			continue
		}
		switch {
		case !e.lane.Alive():
			events = append(events, "retired")
		case now.Sub(e.lastUsed) >= p.cfg.IdleTimeout:
			events = append(events, "idle_closed")
		case now.Sub(e.lane.Opened) >= p.cfg.MaxAge:
			events = append(events, "aged_out")
		default:
			continue
		}
		p.dropLocked(k, e)
		closing = append(closing, e.lane)
	}
	p.mu.Unlock()
	for i, l := range closing {
		l.Close()
		p.cfg.OnEvent(events[i])
	}
}

// CloseAccount closes the idle lanes of an account (it became unavailable)
// and reports how many; busy ones are retired when their request ends.
func (p *Pool) CloseAccount(account string) int {
	return p.retire(func(e *entry) bool { return e.account == account })
}

// RetireAll retires every lane and reports how many closed at once: what
// this replica may have missed being told (a reset elsewhere) no lane keeps
// alive. Idle lanes close now; busy ones when their request ends.
func (p *Pool) RetireAll() int {
	return p.retire(func(*entry) bool { return true })
}

// Forget retires the lanes of k's thread, its bridge lane and every client
// connection's direct lane (an operator reset or moved the thread): idle
// ones close now, busy ones when their request ends, never mid-turn. k's
// Conn is ignored.
func (p *Pool) Forget(k Key) {
	p.retire(func(e *entry) bool { return e.thread.sameThread(k) })
}

// Retire retires k's canonical lane alone (k's Conn counts: "" names the
// thread's bridge lane): now when idle, at its release when busy.
func (p *Pool) Retire(k Key) {
	p.retire(func(e *entry) bool { return e.thread == k })
}

// retire closes the idle canonical lanes match picks and marks the busy
// ones to close at their release; it reports how many closed now.
func (p *Pool) retire(match func(*entry) bool) int {
	var closing []*Lane
	p.mu.Lock()
	for k, e := range p.canon {
		if !match(e) {
			continue
		}
		if e.busy {
			e.retire = true
			continue
		}
		if e.lane != nil {
			p.dropLocked(k, e)
			closing = append(closing, e.lane)
		}
	}
	p.mu.Unlock()
	for _, l := range closing {
		l.Close()
		p.cfg.OnEvent("retired")
	}
	return len(closing)
}

// Drop closes k's canonical lane now, busy or not: the client connection
// it served has ended.
func (p *Pool) Drop(k Key) {
	p.mu.Lock()
	e := p.canon[k]
	if e == nil || e.lane == nil {
		if e != nil {
			e.retire = true // still being dialled: closed when its request releases it
		}
		p.mu.Unlock()
		return
	}
	p.dropLocked(k, e)
	p.mu.Unlock()
	e.lane.Close()
	p.cfg.OnEvent("closed")
}

// Close closes every lane, idle or busy, and refuses new leases. Requests
// using a closed lane see it end and finish with an error of their own.
func (p *Pool) Close() {
	var closing []*Lane
	p.mu.Lock()
	p.closed = true
	for k, e := range p.canon {
		if e.lane != nil {
			closing = append(closing, e.lane)
		}
		delete(p.canon, k)
	}
	for l := range p.forks {
		closing = append(closing, l.Lane)
	}
	p.signalLocked()
	p.mu.Unlock()
	for _, l := range closing {
		l.Close()
	}
}

// Info describes a live lane.
type Info struct {
	Key     Key
	Kind    string // "bridge", "bridge_fork" or "direct" (a client WebSocket's)
	Account string
	// SessionID and ThreadID are the client's raw ids (see Lane).
	SessionID, ThreadID string
	Opened              time.Time
	Busy                bool
	Fork                bool
	// Retiring: the lane closes when its request ends (an operator moved
	// or reset its thread while it was busy).
	Retiring bool
	Requests int64
}

// Infos lists the pool's live lanes, oldest first.
func (p *Pool) Infos() []Info {
	p.mu.Lock()
	var out []Info
	for k, e := range p.canon {
		if e.lane != nil {
			kind := "bridge"
			if k.Conn != "" {
				kind = "direct"
			}
			out = append(out, Info{Key: k, Kind: kind, Account: e.account, SessionID: e.lane.SessionID, ThreadID: e.lane.ThreadID,
				Opened: e.lane.Opened, Busy: e.busy, Retiring: e.retire, Requests: e.lane.Requests.Load()})
		}
	}
	for l := range p.forks {
		out = append(out, Info{Key: l.key, Kind: "bridge_fork", Account: l.Lane.Account, SessionID: l.Lane.SessionID, ThreadID: l.Lane.ThreadID,
			Opened: l.Lane.Opened, Busy: true, Fork: true, Requests: l.Lane.Requests.Load()})
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Opened.Before(out[j].Opened) })
	return out
}

// AccountLanes reports how many lanes are open or being dialled on
// account, and the cap they count against.
func (p *Pool) AccountLanes(account string) (open, max int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.perAccount[account], p.cfg.MaxLanesPerAccount
}

// Len reports how many lanes are open or being dialled.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.perAccount {
		n += c
	}
	return n
}
