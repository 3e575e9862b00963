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

// maxMismatchSwitches caps how many other accounts one request's rejected
// ciphertext is offered to (seed 000), inside the request's switch budget.
const maxMismatchSwitches = 3

// ciphertextStep is what to do after an account rejected a request's
// ciphertext.
type ciphertextStep int

const (
	cipherAnswer      ciphertextStep = iota // the client gets the failure
	cipherStripRetry                        // strip reasoning ciphertext, retry on the same account
	cipherNextAccount                       // mismatch: the unchanged request to another account
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
// most maxMismatchSwitches times, within the budget), with no health penalty.
// Never a mismatch: recovery off, output committed, cancelled, an account
// status (401/402/403/407/429), or a chained request.
func decideCiphertext(c ciphertextCase) ciphertextStep {
	switch {
	case !c.RecoveryOn, c.Committed, c.Cancelled, c.Chained, c.BudgetLeft <= 0:
		return cipherAnswer
	case c.Status == 401 || c.Status == 402 || c.Status == 403 || c.Status == 407 || c.Status == 429:
		return cipherAnswer
	case c.Strippable && !c.StrippedSent:
		return cipherStripRetry
	case c.Mismatches >= maxMismatchSwitches:
		return cipherAnswer
	}
	return cipherNextAccount
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
