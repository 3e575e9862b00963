package relay

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/codexrelay/codex-relay/relay/store"
)

// Candidate is an account selection may choose, with its live load. The
// caller passes only accounts inside the client key's scope.
type Candidate struct {
	Account  store.Account
	InFlight int // requests under way on this replica
}

// HardSource names a kind of hard evidence.
type HardSource string

const (
	HardTurnState        HardSource = "turn_state"        // the client echoed a turn state an account issued
	HardPreviousResponse HardSource = "previous_response" // the account that produced previous_response_id
	HardLane             HardSource = "lane"              // a live lane of this thread
	HardRawSession       HardSource = "raw_session"       // an operator's pin of the session
	HardRawThread        HardSource = "raw_thread"        // an operator's pin of the thread
)

// Evidence is every hard owner a request has, by source; "" is none.
type Evidence map[HardSource]string

// Preferences are the soft rows that bear on a request.
type Preferences struct {
	Thread  string // account of the thread row
	Session string // account of the process-session row
	// Organization issued ciphertext in the thread's history; accounts of it
	// come first when the thread must be placed anew.
	Organization string
}

// Reason says why an account was selected.
type Reason string

const (
	ReasonThread   Reason = "thread"   // the thread's own row
	ReasonSession  Reason = "session"  // the process-session preference
	ReasonBalancer Reason = "balancer" // headroom and load
)

// Selection is the outcome of Select.
type Selection struct {
	AccountID string
	// Reason is a HardSource for hard owners, else a Reason.
	Reason string
	Hard   bool
}

// SelectInput is everything Select decides on.
type SelectInput struct {
	Now        time.Time
	Evidence   Evidence
	Prefs      Preferences
	Candidates []Candidate
	// Exclude holds accounts already tried by this request.
	Exclude map[string]bool
	// Group, when set, limits the soft rows and the balancer to the
	// accounts it admits (the pool, or the fallback group); hard owners are
	// honoured wherever they are in the key's scope.
	Group func(store.Account) bool
}

// ConflictError: hard owners disagree; nothing may go upstream.
type ConflictError struct {
	Owners Evidence
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("continuity owners disagree: %v", map[HardSource]string(e.Owners))
}

// OwnerUnavailableError: the one hard owner cannot serve now. The request
// fails closed with the owner's reason rather than silently moving.
type OwnerUnavailableError struct {
	Source  HardSource
	Account store.Account // only the id when the owner is gone or outside the key's scope
	Cause   string        // why it cannot serve
	// InScope is true when the owner lies inside the client key's scope.
	InScope bool
}

func (e *OwnerUnavailableError) Error() string {
	return fmt.Sprintf("%s owner %s cannot serve: %s", e.Source, e.Account.ID, e.Cause)
}

// NoAccountError: no account in scope can serve now.
type NoAccountError struct {
	// EarliestReset is the soonest time an account in scope comes back; zero
	// when none has a known reset.
	EarliestReset time.Time
	// Considered is how many accounts were in scope.
	Considered int
}

func (e *NoAccountError) Error() string {
	if e.EarliestReset.IsZero() {
		return fmt.Sprintf("no account can serve (%d in scope)", e.Considered)
	}
	return fmt.Sprintf("no account can serve (%d in scope) until %s", e.Considered, e.EarliestReset.Format(time.RFC3339))
}

// Availability says whether an account may take a request at now, and if
// not, why and until when (zero: unknown).
func Availability(c Candidate, now time.Time) (ok bool, why string, until time.Time) {
	a := c.Account
	switch a.Status {
	case store.StatusActive:
	case store.StatusRateLimited, store.StatusQuotaExceeded:
		// Back by itself once its window has reset.
		if a.StatusUntil.IsZero() || now.Before(a.StatusUntil) {
			return false, string(a.Status) + reasonSuffix(a.StatusReason), a.StatusUntil
		}
	default:
		return false, string(a.Status) + reasonSuffix(a.StatusReason), time.Time{}
	}
	if a.MaxConcurrency > 0 && c.InFlight >= a.MaxConcurrency {
		return false, "at its concurrency cap", time.Time{}
	}
	return true, "", time.Time{}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

// hardOrder fixes the order hard owners are reported and checked in.
var hardOrder = []HardSource{HardTurnState, HardPreviousResponse, HardLane, HardRawThread, HardRawSession}

// Select picks the account for one attempt: the one hard owner when there
// is one (conflicting owners fail; an unavailable owner fails closed), else
// the thread's row, else the process-session preference, else the balancer.
func Select(in SelectInput) (Selection, error) {
	byID := make(map[string]Candidate, len(in.Candidates))
	for _, c := range in.Candidates {
		byID[c.Account.ID] = c
	}
	usable := func(id string) bool {
		c, ok := byID[id]
		if !ok || in.Exclude[id] {
			return false
		}
		ok, _, _ = Availability(c, in.Now)
		return ok
	}
	inGroup := func(id string) bool { return in.Group == nil || in.Group(byID[id].Account) }

	owner, source := "", HardSource("")
	for _, src := range hardOrder {
		id := in.Evidence[src]
		if id == "" {
			continue
		}
		if owner != "" && id != owner {
			return Selection{}, &ConflictError{Owners: in.Evidence}
		}
		if owner == "" {
			owner, source = id, src
		}
	}
	if owner != "" {
		if usable(owner) {
			return Selection{AccountID: owner, Reason: string(source), Hard: true}, nil
		}
		c, ok := byID[owner]
		switch {
		case !ok:
			return Selection{}, &OwnerUnavailableError{Source: source, Account: store.Account{ID: owner}, Cause: "the account is gone or outside this client key's scope"}
		case in.Exclude[owner]:
			return Selection{}, &OwnerUnavailableError{Source: source, Account: c.Account, Cause: "it already failed this request", InScope: true}
		default:
			_, why, _ := Availability(c, in.Now)
			return Selection{}, &OwnerUnavailableError{Source: source, Account: c.Account, Cause: why, InScope: true}
		}
	}

	if in.Prefs.Thread != "" && usable(in.Prefs.Thread) && inGroup(in.Prefs.Thread) {
		return Selection{AccountID: in.Prefs.Thread, Reason: string(ReasonThread)}, nil
	}
	if in.Prefs.Session != "" && usable(in.Prefs.Session) && inGroup(in.Prefs.Session) {
		return Selection{AccountID: in.Prefs.Session, Reason: string(ReasonSession)}, nil
	}

	var pool []Candidate
	var earliest time.Time
	for _, c := range in.Candidates {
		if !inGroup(c.Account.ID) {
			continue
		}
		ok, _, until := Availability(c, in.Now)
		if ok && !in.Exclude[c.Account.ID] {
			pool = append(pool, c)
			continue
		}
		if !until.IsZero() && (earliest.IsZero() || until.Before(earliest)) {
			earliest = until
		}
	}
	if len(pool) == 0 {
		n := 0
		for _, c := range in.Candidates {
			if inGroup(c.Account.ID) {
				n++
			}
		}
		return Selection{}, &NoAccountError{EarliestReset: earliest, Considered: n}
	}
	best := Balance(pool, in.Prefs.Organization, in.Now)
	return Selection{AccountID: best.Account.ID, Reason: string(ReasonBalancer)}, nil
}

// Headroom is the fraction of an account's tightest known usage window left
// (1 when nothing is known). A window past its reset counts as full.
func Headroom(a store.Account, now time.Time) float64 {
	h := 1.0
	for _, w := range []store.Window{a.Primary, a.Secondary} {
		if !w.Known || (!w.ResetAt.IsZero() && !now.Before(w.ResetAt)) {
			continue
		}
		h = math.Min(h, math.Max(0, 100-w.UsedPercent)/100)
	}
	return h
}

// nextReset is the soonest future reset among an account's windows.
func nextReset(a store.Account, now time.Time) time.Time {
	var t time.Time
	for _, w := range []store.Window{a.Primary, a.Secondary} {
		if w.Known && w.ResetAt.After(now) && (t.IsZero() || w.ResetAt.Before(t)) {
			t = w.ResetAt
		}
	}
	return t
}

// Balance picks among usable accounts: accounts of the thread's organisation
// first (when known), then the highest priority, then the best score:
// headroom shared by the requests already in flight. Equal scores prefer the
// window that resets sooner (its headroom is worth less), then the id, so the
// choice is deterministic.
func Balance(pool []Candidate, org string, now time.Time) Candidate {
	ranked := make([]Candidate, len(pool))
	copy(ranked, pool)
	score := func(c Candidate) float64 { return Headroom(c.Account, now) / float64(1+c.InFlight) }
	sort.SliceStable(ranked, func(i, j int) bool {
		a, b := ranked[i], ranked[j]
		if org != "" {
			am, bm := a.Account.Organization == org, b.Account.Organization == org
			if am != bm {
				return am
			}
		}
		if a.Account.Priority != b.Account.Priority {
			return a.Account.Priority > b.Account.Priority
		}
		if sa, sb := score(a), score(b); math.Abs(sa-sb) > 1e-9 {
			return sa > sb
		}
		ra, rb := nextReset(a.Account, now), nextReset(b.Account, now)
		if !ra.Equal(rb) {
			if ra.IsZero() || rb.IsZero() {
				return !ra.IsZero()
			}
			return ra.Before(rb)
		}
		return a.Account.ID < b.Account.ID
	})
	return ranked[0]
}

// BindingPlan is what to write after a request succeeded on an account.
type BindingPlan struct {
	// Write upserts the thread row to the account.
	Write bool
	// SeedSession inserts the process preference if absent (first admission).
	SeedSession bool
	// Source records how the row was set.
	Source string
}

// PlanBinding decides the binding write for a served request. A thread
// without a row is admitted (its row written, the process preference seeded
// if absent); a thread whose row named another account was moved (only its
// row rewritten); a thread served by its own row is only touched.
func PlanBinding(sel Selection, prefs Preferences) BindingPlan {
	switch {
	case prefs.Thread == "":
		return BindingPlan{Write: true, SeedSession: true, Source: "admission:" + sel.Reason}
	case prefs.Thread != sel.AccountID:
		return BindingPlan{Write: true, Source: "move:" + sel.Reason}
	default:
		return BindingPlan{}
	}
}
