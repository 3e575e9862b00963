package relay

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// candidate is an account selection may choose, with its live load. The
// caller passes only accounts inside the client key's scope.
type candidate struct {
	Account  store.Account
	InFlight int // requests under way on this replica
	// Unreachable: the account's upstream did not answer lately (a
	// connect, handshake or first-answer deadline passed, the connection
	// was refused): new threads go elsewhere for a while. A thread that
	// prefers or must have the account still tries it.
	Unreachable bool
}

// Why an account was selected, when no hard owner chose it.
const (
	reasonLane     = "lane"     // the thread's live lane
	reasonThread   = "thread"   // the thread's own row
	reasonSession  = "session"  // the process-session preference
	reasonBalancer = "balancer" // headroom and load
	reasonRecovery = "recovery" // a recovery's retry on the same account
)

// selection is the outcome of selectAccount.
type selection struct {
	AccountID string
	// Reason is the hardSource of a hard owner, else one of the reasons above.
	Reason string
	Hard   bool
}

// selectInput is everything selectAccount decides on.
type selectInput struct {
	Now        time.Time
	Owner      hardOwner // from weighEvidence; zero: none
	Prefs      preferences
	Candidates []candidate
	// Exclude holds accounts already tried by this request.
	Exclude map[string]bool
	// Group, when set, limits the soft rows and the balancer to the
	// accounts it admits (the pool, or the fallback group); hard owners are
	// honoured wherever they are in the key's scope.
	Group func(store.Account) bool
}

// ownerUnavailableError: the one hard owner cannot serve now. The request
// fails closed with the owner's reason rather than silently moving.
type ownerUnavailableError struct {
	Source  hardSource
	Account store.Account // only the id when the owner is gone or outside the key's scope
	Cause   string        // why it cannot serve
	// InScope is true when the owner lies inside the client key's scope.
	InScope bool
}

func (e *ownerUnavailableError) Error() string {
	return fmt.Sprintf("%s owner %s cannot serve: %s", e.Source, e.Account.ID, e.Cause)
}

// noAccountError: no account in scope can serve now.
type noAccountError struct {
	// EarliestReset is the soonest time an account in scope comes back; zero
	// when none has a known reset.
	EarliestReset time.Time
	// Considered is how many accounts were in scope.
	Considered int
}

func (e *noAccountError) Error() string {
	if e.EarliestReset.IsZero() {
		return fmt.Sprintf("no account can serve (%d in scope)", e.Considered)
	}
	return fmt.Sprintf("no account can serve (%d in scope) until %s", e.Considered, e.EarliestReset.Format(time.RFC3339))
}

// availability says whether an account may take a request at now, and if
// not, why and until when (zero: unknown).
func availability(c candidate, now time.Time) (ok bool, why string, until time.Time) {
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

// selectAccount picks the account for one attempt: the one hard owner when
// there is one (an unavailable owner fails closed), else the thread's live
// lane, its row, the process-session preference, else the balancer. Pure.
func selectAccount(in selectInput) (selection, error) {
	byID := make(map[string]candidate, len(in.Candidates))
	for _, c := range in.Candidates {
		byID[c.Account.ID] = c
	}
	usable := func(id string) bool {
		c, ok := byID[id]
		if !ok || in.Exclude[id] {
			return false
		}
		ok, _, _ = availability(c, in.Now)
		return ok
	}
	inGroup := func(id string) bool { return in.Group == nil || in.Group(byID[id].Account) }

	if owner := in.Owner.account; owner != "" {
		source := in.Owner.source
		if usable(owner) {
			return selection{AccountID: owner, Reason: string(source), Hard: true}, nil
		}
		c, ok := byID[owner]
		switch {
		case !ok:
			return selection{}, &ownerUnavailableError{Source: source, Account: store.Account{ID: owner}, Cause: "the account is gone or outside this client key's scope"}
		case in.Exclude[owner]:
			return selection{}, &ownerUnavailableError{Source: source, Account: c.Account, Cause: "it already failed this request", InScope: true}
		default:
			_, why, _ := availability(c, in.Now)
			return selection{}, &ownerUnavailableError{Source: source, Account: c.Account, Cause: why, InScope: true}
		}
	}

	for _, pref := range []struct{ id, reason string }{
		{in.Prefs.Lane, reasonLane}, {in.Prefs.Thread, reasonThread}, {in.Prefs.Session, reasonSession},
	} {
		if pref.id != "" && usable(pref.id) && inGroup(pref.id) {
			return selection{AccountID: pref.id, Reason: pref.reason}, nil
		}
	}

	var pool, unreachable []candidate
	var earliest time.Time
	for _, c := range in.Candidates {
		if !inGroup(c.Account.ID) {
			continue
		}
		ok, _, until := availability(c, in.Now)
		if ok && !in.Exclude[c.Account.ID] {
			if c.Unreachable {
				unreachable = append(unreachable, c)
			} else {
				pool = append(pool, c)
			}
			continue
		}
		if !until.IsZero() && (earliest.IsZero() || until.Before(earliest)) {
			earliest = until
		}
	}
	if len(pool) == 0 {
		pool = unreachable // better to try again than to refuse
	}
	if len(pool) == 0 {
		n := 0
		for _, c := range in.Candidates {
			if inGroup(c.Account.ID) {
				n++
			}
		}
		return selection{}, &noAccountError{EarliestReset: earliest, Considered: n}
	}
	best := balance(pool, in.Prefs.Organization, in.Now)
	return selection{AccountID: best.Account.ID, Reason: reasonBalancer}, nil
}

// headroom is the fraction of an account's tightest known usage window left
// (1 when nothing is known). A window past its reset counts as full.
func headroom(a store.Account, now time.Time) float64 {
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

// balance picks among usable accounts: accounts of the thread's organisation
// first (when known), then the highest priority, then the best score:
// headroom shared by the requests already in flight. Equal scores prefer the
// window that resets sooner (its headroom is worth less), then the id, so the
// choice is deterministic.
func balance(pool []candidate, org string, now time.Time) candidate {
	ranked := make([]candidate, len(pool))
	copy(ranked, pool)
	score := func(c candidate) float64 { return headroom(c.Account, now) / float64(1+c.InFlight) }
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

// bindingPlan is what to write after a request succeeded on an account.
type bindingPlan struct {
	// Write upserts the thread row to the account.
	Write bool
	// SeedSession inserts the process preference if absent (first admission).
	SeedSession bool
	// Source records how the row was set.
	Source string
}

// planBinding decides the binding write for a served request. A thread
// without a row is admitted (its row written, the process preference seeded
// if absent); a thread whose row named another account was moved (only its
// row rewritten); a thread served by its own row is only touched.
func planBinding(sel selection, prefs preferences) bindingPlan {
	switch {
	case prefs.Thread == "":
		return bindingPlan{Write: true, SeedSession: true, Source: "admission:" + sel.Reason}
	case prefs.Thread != sel.AccountID:
		return bindingPlan{Write: true, Source: "move:" + sel.Reason}
	default:
		return bindingPlan{}
	}
}
