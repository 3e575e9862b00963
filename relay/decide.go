package relay

import (
	"cmp"
	"errors"
	"time"
)

// The attempt loop (attempts.go) is choose -> attempt -> decide -> act.
// decide is the one decision step: it takes the request's state (tries)
// and how its latest attempt ended, or why no account could be chosen for
// it, and says what comes next. Every rule of seed 000 (ciphertext
// recovery and mismatch switching) and of seed 002 (an account cause
// before any work moves the request on, a token refresh first for a 401, a
// turn state released, the fallback group once the pool is exhausted) is
// decided here, over plain data; the loop only does what it says.

// tries is one request's memory across its attempts: what decide reads and
// updates. Owned by the request's attempt loop.
type tries struct {
	plan plan // what the next attempt sends, and where
	max  int  // the request's switch budget: attempts it may make (Config.MaxAttempts)
	n    int  // attempts made so far
	// prev is the account of the latest attempt ("" before the first).
	prev string
	// recoveryOn: reasoning recovery and mismatch switching are on (seed
	// 000; Config.DisableRecovery switches them off).
	recoveryOn bool
	// fallbackModel is the model a request asks for once it fell back
	// (Config.FallbackModel; "" keeps the client's).
	fallbackModel string
	// compaction: the request is a compaction, which stays where its history
	// can be read (never the fallback group).
	compaction bool
	// turnStateOwner is the account that issued the client's turn state
	// ("": none known); conversation, the request carries a conversation
	// (history the upstream holds, which no other account has).
	turnStateOwner string
	conversation   bool
	// exclude are the accounts this request passes over: they failed it, or
	// cannot serve now. Selection reads it.
	exclude map[string]bool
	// refreshed are the accounts whose token this request refreshed after a
	// 401; stripped, those that got the stripped retry (seed 000).
	refreshed map[string]bool
	stripped  map[string]bool
	// mismatches counts the mismatch switches made; orig is the unchanged
	// request as it first went in full, which each one hands on (nil until
	// the first rejection).
	mismatches int
	orig       *plan
	// first is the first account failure, the answer when the pool runs out
	// (firstClass its class); firstMismatch the first mismatch failure, the
	// answer when no account accepts the ciphertext.
	first         *failure
	firstClass    attemptClass
	firstMismatch *failure
}

// newTries is r's state before its first attempt.
func (s *Server) newTries(r *request) *tries {
	return &tries{plan: r.firstPlan(), max: s.cfg.MaxAttempts, recoveryOn: !s.cfg.DisableRecovery,
		fallbackModel: s.cfg.FallbackModel, compaction: r.compaction != "", turnStateOwner: s.turnStateOwner(r),
		conversation: r.fields.Conversation,
		exclude:      map[string]bool{}, refreshed: map[string]bool{}, stripped: map[string]bool{}}
}

// refreshResult is how the token refresh decide asked for went.
type refreshResult int

const (
	refreshNotTried refreshResult = iota
	refreshDone                   // a fresh token: the same account may take the request again
	refreshRefused                // refused, or not possible now: the request moves on
)

// ended is what decide reads of one attempt's end, or of a choice that
// found no account.
type ended struct {
	// refused is selection's error when no account could be chosen (no
	// attempt ran); fallbackInScope, the key's scope holds an account of the
	// fallback group; now, when selection gave up.
	refused         error
	fallbackInScope bool
	now             time.Time
	// account is the attempt's account; facts how it ended; sentFull, it
	// sent the request in full (so a ciphertext recovery may strip or move
	// it).
	account  string
	facts    attemptEnd
	sentFull bool
	// canRefresh: the account's token can be refreshed (a ChatGPT account,
	// and a token source to do it); refresh, how the refresh decide asked
	// for went.
	canRefresh bool
	refresh    refreshResult
	// gone: the client went away.
	gone bool
}

// stepKind is what the loop does next.
type stepKind int

const (
	stepAttempt stepKind = iota // attempt t.plan (selection chooses its account, or plan.force names it)
	stepRefresh                 // refresh the account's token, then decide again with the result
	stepDone                    // the request ends, answered in full
	stepEnd                     // the request ends with answer, or with the terminal event the client has
)

// step is decide's answer: what comes next, and what the ended attempt's
// record says of it.
type step struct {
	next stepKind
	// class, action, recovery and penalty are the attempt's record: how it
	// ended, what the request does next, the recovery that led to it or that
	// it starts, and what the account's health takes from it.
	class    attemptClass
	action   nextAction
	recovery string
	penalty  *penalty
	// failure is the ended attempt's client failure (clientFailure), built
	// once; nil when the client has its answer or went away.
	failure *failure
	// answer is what the client gets when the request ends (stepEnd; nil:
	// it has its terminal event already, or went away), answerClass the
	// class the request is logged under.
	answer      *failure
	answerClass attemptClass
	// record: a selection that found no account leaves an attempt record
	// of its own (account "").
	record bool
}

// decide says what follows e. Pure: it reads and updates t and nothing
// else.
func (t *tries) decide(e ended) step {
	if e.refused != nil {
		return t.noAccount(e)
	}
	f := clientFailure(e.facts)
	if e.facts.Status == 401 && !e.facts.Committed && e.refresh == refreshNotTried && e.canRefresh && !t.refreshed[e.account] {
		// Seed 002's auth cause, before any work: the account's token is
		// refreshed first (once per account and request); the same account
		// then takes the request again.
		t.refreshed[e.account] = true
		return step{next: stepRefresh}
	}
	facts := e.facts
	facts.Refreshed = e.refresh == refreshDone
	out := classify(facts)
	f = screen(f, out.Class)
	st := step{class: out.Class, action: out.Action, recovery: cmp.Or(out.Recovery, t.plan.recovery), penalty: out.Penalty, failure: f}
	switch out.Action {
	case actionDone:
		st.next = stepDone
		return st
	case actionTerminal:
		if out.Class == classCiphertext && f != nil {
			if t.ciphertext(e, &st) {
				return st
			}
			f = cmp.Or(t.firstMismatch, f) // no account accepted: the client gets the first rejection
		}
		st.next, st.answer, st.answerClass = stepEnd, f, out.Class
		return st
	case actionSame:
		t.plan = t.plan.sameAccount(e.account)
	case actionNext:
		if t.first == nil && f != nil {
			t.first, t.firstClass = f, out.Class
		}
		t.exclude[e.account] = true
		t.plan = t.plan.afterAccountFailed(t.turnStateOwner, e.account)
	}
	switch {
	case e.gone:
		st.next, st.answerClass = stepEnd, classCancelled
	case t.n >= t.max:
		st.next, st.answer, st.answerClass = stepEnd, cmp.Or(t.first, f, failExhausted()), cmp.Or(t.firstClass, out.Class)
	default:
		st.next = stepAttempt
	}
	return st
}

// ciphertext applies seed 000 to an account's rejection of the request's
// ciphertext (decideCiphertext): strip reasoning ciphertext and retry on the
// same account, or hand the unchanged request to another account, with no
// health penalty. It reports false when neither applies: the client gets
// the failure.
func (t *tries) ciphertext(e ended, st *step) bool {
	full, known := t.plan.full()
	_, _, strippable := strippedBody(full.body, full.input)
	next := decideCiphertext(ciphertextCase{RecoveryOn: t.recoveryOn, Committed: e.facts.Committed, Cancelled: e.gone,
		Status: e.facts.Status, Chained: !e.sentFull || !known || t.conversation, Strippable: strippable,
		StrippedSent: t.stripped[e.account], Mismatches: t.mismatches, BudgetLeft: t.max - t.n})
	if next != cipherAnswer && t.orig == nil {
		o := full
		t.orig = &o
	}
	switch next {
	case cipherStripRetry:
		full.body, full.input, _ = strippedBody(full.body, full.input)
		full.force, full.recovery = e.account, RecoveryReasoning
		t.stripped[e.account] = true
		t.plan = full
		st.next, st.action = stepAttempt, actionSame
		return true
	case cipherNextAccount:
		if t.firstMismatch == nil {
			t.firstMismatch = st.failure
		}
		if t.first == nil {
			t.first, t.firstClass = t.firstMismatch, classCiphertext
		}
		t.mismatches++
		t.exclude[e.account] = true
		o := *t.orig
		o.force, o.recovery = "", RecoveryMismatch
		t.plan = o
		st.next, st.action = stepAttempt, actionNext
		return true
	}
	return false
}

// noAccount decides after selection found no account for the request:
// once the pool is exhausted, the fallback group takes it (seed 002: once
// per request, when the key's scope holds a fallback account, never a
// compaction), asking for the fallback model when one is configured;
// otherwise, when an account already failed the request and no account is
// merely at its usage limit until a known time, the client gets that
// first failure; else what selection's error means (failureFor).
func (t *tries) noAccount(e ended) step {
	var none *noAccountError
	exhausted := errors.As(e.refused, &none)
	if exhausted && !t.plan.fallback && e.fallbackInScope && !t.compaction {
		t.plan = t.plan.fellBack(t.fallbackModel)
		return step{next: stepAttempt}
	}
	if exhausted && t.first != nil && none.EarliestReset.IsZero() {
		return step{next: stepEnd, answer: t.first, answerClass: t.firstClass}
	}
	f, class := failureFor(e.refused, e.now)
	return step{next: stepEnd, class: class, action: actionTerminal, failure: f, answer: f, answerClass: class, record: true}
}
