package relay

import (
	"encoding/json"

	"github.com/codexrelay/codex-relay/continuity"
)

// plan is what one attempt sends, and where. The first comes from the
// request as the client sent it; each recovery rule returns the next one
// (a stripped body, another model, an account it must stay on) instead of
// editing the request.
type plan struct {
	body  []byte            // a Responses request body
	input []json.RawMessage // the whole input behind body; nil when continuity does not hold its chain
	prev  string            // body's previous_response_id ("": a full request)
	model string
	// force is the account the attempt must use ("": selection chooses): a
	// recovery's retry on the same account.
	force string
	// recovery names the recovery this attempt is a step of ("" none).
	recovery string
	// fallback selects in the fallback group: the pool was exhausted.
	fallback bool
	// released: the account that issued the client's turn state failed this
	// request before any work; the state binds nothing and goes nowhere.
	released bool
}

// firstPlan is the request as the client sent it.
func (r *request) firstPlan() plan {
	return plan{body: r.body, input: r.history, prev: r.fields.PreviousResponseID, model: r.fields.Model}
}

// known reports whether the whole history behind p is known, so it can go
// in full anywhere: it chains to nothing, or continuity holds its chain.
// Unlike full, it builds nothing.
func (p plan) known() bool { return p.prev == "" || p.input != nil }

// full is p as a full request: the whole input, chained to nothing. ok is
// false when the history behind p's chain is unknown.
func (p plan) full() (plan, bool) {
	if p.prev == "" {
		return p, true
	}
	if !p.known() {
		return p, false
	}
	b, err := continuity.WithFullInput(p.body, p.input)
	if err != nil {
		return p, false
	}
	p.body, p.prev = b, ""
	return p, true
}

// moveIsFailover reports whether a move to another account is an ordinary
// failover, rather than a step of a more specific recovery already named.
func (p plan) moveIsFailover() bool {
	switch p.recovery {
	case RecoveryMismatch, RecoveryFallback, RecoveryRetired:
		return false
	}
	return true
}

// afterAccountFailed is the plan after account failed the request before
// any work: it moves, and a turn state that account issued binds nothing
// any more (seed 002's "no work observed": nothing of the turn lives there
// that another account needs, and keeping the state hard would fail the
// request closed while other accounts have room).
func (p plan) afterAccountFailed(turnStateOwner, account string) plan {
	p.force = ""
	if turnStateOwner == account {
		p.released = true
	}
	return p
}

// sameAccount is the plan for a retry on account (a fresh lane, a
// refreshed token, the full request after a refused chain).
func (p plan) sameAccount(account string) plan {
	p.force = account
	return p
}
