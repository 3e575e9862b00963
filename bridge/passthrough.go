package bridge

import (
	"context"
	"errors"
)

// ErrNoIdleLane means a key has no idle, live lane to write to.
var ErrNoIdleLane = errors.New("bridge: no idle lane")

// SendIdle writes msg on k's lane when it is idle and alive, without
// leasing it for a request: a client frame that is not a request (an
// acknowledgement, a message type this relay does not know) passes
// through on the connection it belongs to. It never dials: with no idle
// lane there is no upstream conversation to pass it to (ErrNoIdleLane). A
// write that fails retires the lane.
func (p *Pool) SendIdle(ctx context.Context, k Key, msg []byte) error {
	p.mu.Lock()
	e := p.canon[k]
	if p.closed || e == nil || e.busy || e.lane == nil || !e.lane.Alive() {
		p.mu.Unlock()
		return ErrNoIdleLane
	}
	e.busy = true
	lease := &Lease{Lane: e.lane, State: e.state, pool: p, key: k, entry: e}
	p.mu.Unlock()
	err := lease.Lane.Send(ctx, msg)
	lease.Release(lease.State, err == nil)
	return err
}
