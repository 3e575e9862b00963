package relay

import (
	"encoding/json"

	"github.com/codexrelay/codex-relay/continuity"
)

// Recovery actions, as recorded in diagnostics and named by the
// X-Codex-Relay-Recovery header.
const (
	RecoveryReasoning = "reasoning_recovery" // reasoning ciphertext stripped, same account
	RecoveryMismatch  = "account_mismatch"   // the unchanged request handed to another account
	RecoveryFailover  = "failover"           // an account failed before any work: next account
	RecoveryFallback  = "fallback"           // the pool was exhausted: the fallback group
	RecoveryRetired   = "owner_retired"      // a goal restart retired an unavailable owner
)

// MaxMismatchSwitches caps how many other accounts one request's rejected
// ciphertext is offered to (seed 000), inside the request's switch budget.
const MaxMismatchSwitches = 3

// ciphertextStep is what to do after an account rejected a request's
// ciphertext.
type ciphertextStep int

const (
	stepTerminal    ciphertextStep = iota // the client gets the failure
	stepStripRetry                        // strip reasoning ciphertext, retry on the same account
	stepNextAccount                       // mismatch: the unchanged request to another account
)

// ciphertextCase is what the decision looks at.
type ciphertextCase struct {
	RecoveryOn   bool // the relay's reasoning recovery is switched on
	Committed    bool // output (or a failure terminal) already reached the client
	Cancelled    bool
	Status       int  // the rejection's status
	Chained      bool // the request sent carried previous_response_id or conversation
	Strippable   bool // it held reasoning ciphertext that stripping would remove
	StrippedSent bool // this account already got the stripped retry
	Mismatches   int  // mismatch switches this request already made
	BudgetLeft   int  // attempts left in the request's switch budget
}

// decideCiphertext is the rule of seed 000: a rejection of ciphertext the
// account cannot read first strips reasoning ciphertext and retries once on
// the same account; if nothing could be stripped, or the stripped retry is
// rejected the same way, the unchanged request goes to another account (at
// most MaxMismatchSwitches times, within the budget), with no health penalty.
// Never a mismatch: recovery off, output committed, cancelled, an account
// status (401/402/403/407/429), or a chained request.
func decideCiphertext(c ciphertextCase) ciphertextStep {
	switch {
	case !c.RecoveryOn, c.Committed, c.Cancelled, c.Chained, c.BudgetLeft <= 0:
		return stepTerminal
	case c.Status == 401 || c.Status == 402 || c.Status == 403 || c.Status == 407 || c.Status == 429:
		return stepTerminal
	case c.Strippable && !c.StrippedSent:
		return stepStripRetry
	case c.Mismatches >= MaxMismatchSwitches:
		return stepTerminal
	}
	return stepNextAccount
}

// strippedBody returns the request with reasoning ciphertext removed from its
// input, and whether anything was removed.
func strippedBody(body []byte, input []json.RawMessage) ([]byte, []json.RawMessage, bool) {
	stripped, ok := continuity.StripReasoningCiphertext(input)
	if !ok {
		return nil, nil, false
	}
	b, err := continuity.WithFullInput(body, stripped)
	if err != nil {
		return nil, nil, false
	}
	return b, stripped, true
}

// ciphertextRecovery carries one request's recovery state across attempts.
type ciphertextRecovery struct {
	on         bool
	origBody   []byte
	origInput  []json.RawMessage
	stripped   map[string]bool // accounts that got the stripped retry
	mismatches int
	first      *failure // the first mismatch failure: what the client gets if no account accepts
}

func newCiphertextRecovery(on bool, c *call) *ciphertextRecovery {
	return &ciphertextRecovery{on: on, origBody: c.body, origInput: c.fields.Input, stripped: map[string]bool{}}
}

// after decides the next step after an attempt on account ended with a
// ciphertext rejection f, and prepares c for it: the stripped body for a
// retry on the same account, the unchanged request for another account.
func (r *ciphertextRecovery) after(c *call, account string, f *failure, status int, committed, cancelled bool, budgetLeft int) ciphertextStep {
	_, _, strippable := strippedBody(c.body, c.fields.Input)
	step := decideCiphertext(ciphertextCase{RecoveryOn: r.on, Committed: committed, Cancelled: cancelled, Status: status,
		Chained: c.fields.PreviousResponseID != "" || c.fields.Conversation, Strippable: strippable,
		StrippedSent: r.stripped[account], Mismatches: r.mismatches, BudgetLeft: budgetLeft})
	switch step {
	case stepStripRetry:
		body, input, _ := strippedBody(c.body, c.fields.Input)
		c.body, c.fields.Input = body, input
		r.stripped[account] = true
		c.force, c.recovery = account, RecoveryReasoning
	case stepNextAccount:
		if r.first == nil {
			r.first = f
		}
		r.mismatches++
		c.body, c.fields.Input = r.origBody, r.origInput
		c.force, c.recovery = "", RecoveryMismatch
	}
	return step
}

// retry applies after to a rejection on account and reports whether the
// request goes on (the same account stripped, or another one, which it then
// excludes); false: the client gets the failure (the first mismatch failure
// when there was one: see first).
func (r *ciphertextRecovery) retry(c *call, account string, f *failure, status int, committed, cancelled bool, budgetLeft int, exclude map[string]bool) bool {
	switch r.after(c, account, f, status, committed, cancelled, budgetLeft) {
	case stepStripRetry:
		return true
	case stepNextAccount:
		exclude[account] = true
		return true
	}
	return false
}

// moveIsFailover reports whether a move to another account is an ordinary
// failover, rather than a step of a more specific recovery already named.
func (c *call) moveIsFailover() bool {
	switch c.recovery {
	case RecoveryMismatch, RecoveryFallback, RecoveryRetired:
		return false
	}
	return true
}
