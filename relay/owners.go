package relay

import "sync"

// owner is who produced a response id or issued a turn state.
type owner struct {
	account string
	scope   string
	// proxy marks a turn state the relay generated (the upstream never saw
	// it, so it is not forwarded).
	proxy bool
}

// ownerIndex maps response ids and turn states to the account that produced
// them, bounded: the oldest entries go first. Safe for concurrent use.
type ownerIndex struct {
	mu    sync.Mutex
	max   int              // static
	m     map[string]owner // guarded by mu
	order []string         // guarded by mu; ring of keys in insertion order
	next  int              // guarded by mu
}

func newOwnerIndex(max int) *ownerIndex {
	return &ownerIndex{max: max, m: make(map[string]owner, 1024)}
}

func (o *ownerIndex) put(key string, v owner) {
	if key == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; ok {
		o.m[key] = v
		return
	}
	if len(o.order) < o.max {
		o.order = append(o.order, key)
	} else {
		delete(o.m, o.order[o.next])
		o.order[o.next] = key
		o.next = (o.next + 1) % o.max
	}
	o.m[key] = v
}

func (o *ownerIndex) get(key string) (owner, bool) {
	if key == "" {
		return owner{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[key]
	return v, ok
}

// Keys are namespaced so a turn state can never be read as a response id.
func responseKey(id string) string  { return "r:" + id }
func turnStateKey(ts string) string { return "t:" + ts }
