package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/relay/store"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func acct(id string, opts ...func(*store.Account)) store.Account {
	a := store.Account{ID: id, Status: store.StatusActive}
	for _, o := range opts {
		o(&a)
	}
	return a
}

func status(s store.Status, until time.Time) func(*store.Account) {
	return func(a *store.Account) { a.Status, a.StatusUntil, a.StatusReason = s, until, "test" }
}
func org(o string) func(*store.Account) { return func(a *store.Account) { a.Organization = o } }
func prio(p int) func(*store.Account)   { return func(a *store.Account) { a.Priority = p } }
func capped(n int) func(*store.Account) { return func(a *store.Account) { a.MaxConcurrency = n } }
func used(pct float64, reset time.Time) func(*store.Account) {
	return func(a *store.Account) {
		a.Primary = store.Window{UsedPercent: pct, ResetAt: reset, Known: true, WindowMinutes: 300}
	}
}

func cands(accounts ...store.Account) []Candidate {
	out := make([]Candidate, len(accounts))
	for i, a := range accounts {
		out[i] = Candidate{Account: a}
	}
	return out
}

func TestSelectOrder(t *testing.T) {
	t.Parallel()
	later := now.Add(time.Hour)
	pool := cands(acct("a"), acct("b"), acct("c"))
	cases := []struct {
		name    string
		in      SelectInput
		want    string
		reason  string
		hard    bool
		wantErr any
	}{
		{"balancer when nothing is known", SelectInput{Candidates: pool}, "a", "balancer", false, nil},
		{"thread row first", SelectInput{Candidates: pool, Prefs: Preferences{Thread: "b", Session: "c"}}, "b", "thread", false, nil},
		{"session preference for a new thread", SelectInput{Candidates: pool, Prefs: Preferences{Session: "c"}}, "c", "session", false, nil},
		{"hard owner beats rows", SelectInput{Candidates: pool, Prefs: Preferences{Thread: "b"}, Evidence: Evidence{HardPreviousResponse: "c"}}, "c", "previous_response", true, nil},
		{"agreeing hard owners", SelectInput{Candidates: pool, Evidence: Evidence{HardTurnState: "b", HardLane: "b", HardRawSession: "b"}}, "b", "turn_state", true, nil},
		{"pin is hard", SelectInput{Candidates: pool, Prefs: Preferences{Thread: "a"}, Evidence: Evidence{HardRawSession: "c"}}, "c", "raw_session", true, nil},
		{"conflicting hard owners", SelectInput{Candidates: pool, Evidence: Evidence{HardTurnState: "a", HardPreviousResponse: "b"}}, "", "", false, &ConflictError{}},
		{"pin conflicts with lane", SelectInput{Candidates: pool, Evidence: Evidence{HardLane: "a", HardRawThread: "c"}}, "", "", false, &ConflictError{}},
		{"unavailable hard owner fails closed", SelectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b")), Evidence: Evidence{HardPreviousResponse: "a"}}, "", "", false, &OwnerUnavailableError{}},
		{"hard owner outside scope fails closed", SelectInput{Candidates: pool, Evidence: Evidence{HardRawSession: "zzz"}}, "", "", false, &OwnerUnavailableError{}},
		{"tried hard owner fails closed", SelectInput{Candidates: pool, Evidence: Evidence{HardLane: "a"}, Exclude: map[string]bool{"a": true}}, "", "", false, &OwnerUnavailableError{}},
		{"limited thread row falls to session", SelectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b"), acct("c")), Prefs: Preferences{Thread: "a", Session: "c"}}, "c", "session", false, nil},
		{"limited thread and session rows fall to balancer", SelectInput{Candidates: cands(acct("a", status(store.StatusPaused, time.Time{})), acct("b"), acct("c", status(store.StatusQuotaExceeded, later))), Prefs: Preferences{Thread: "a", Session: "c"}}, "b", "balancer", false, nil},
		{"rate limit past its reset serves again", SelectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, now.Add(-time.Second)))), Prefs: Preferences{Thread: "a"}}, "a", "thread", false, nil},
		{"excluded thread row is skipped", SelectInput{Candidates: pool, Prefs: Preferences{Thread: "a"}, Exclude: map[string]bool{"a": true}}, "b", "balancer", false, nil},
		{"thread row outside scope is skipped", SelectInput{Candidates: pool, Prefs: Preferences{Thread: "gone"}}, "a", "balancer", false, nil},
		{"nothing usable", SelectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b", status(store.StatusReauthRequired, time.Time{})))}, "", "", false, &NoAccountError{}},
		{"empty scope", SelectInput{}, "", "", false, &NoAccountError{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			sel, err := Select(tc.in)
			switch want := tc.wantErr.(type) {
			case nil:
				require.NoError(t, err)
				assert.Equal(t, tc.want, sel.AccountID)
				assert.Equal(t, tc.reason, sel.Reason)
				assert.Equal(t, tc.hard, sel.Hard)
			case *ConflictError:
				assert.ErrorAs(t, err, &want)
			case *OwnerUnavailableError:
				assert.ErrorAs(t, err, &want)
			case *NoAccountError:
				assert.ErrorAs(t, err, &want)
			}
		})
	}
}

func TestNoAccountReportsEarliestReset(t *testing.T) {
	t.Parallel()
	soon, later := now.Add(10*time.Minute), now.Add(3*time.Hour)
	_, err := Select(SelectInput{Now: now, Candidates: cands(
		acct("a", status(store.StatusQuotaExceeded, later)),
		acct("b", status(store.StatusRateLimited, soon)),
		acct("c", status(store.StatusPaused, time.Time{})),
	)})
	var na *NoAccountError
	require.True(t, errors.As(err, &na))
	assert.Equal(t, soon, na.EarliestReset)
	assert.Equal(t, 3, na.Considered)
}

func TestBalance(t *testing.T) {
	t.Parallel()
	soon, later := now.Add(30*time.Minute), now.Add(4*time.Hour)
	cases := []struct {
		name string
		pool []Candidate
		org  string
		want string
	}{
		{"more headroom wins", cands(acct("a", used(80, later)), acct("b", used(20, later))), "", "b"},
		{"in-flight load shares headroom", []Candidate{{Account: acct("a"), InFlight: 3}, {Account: acct("b", used(50, later))}}, "", "b"},
		{"priority before headroom", cands(acct("a", used(90, later), prio(1)), acct("b")), "", "a"},
		{"organisation before priority", cands(acct("a", prio(5), org("o1")), acct("b", org("o2"))), "o2", "b"},
		{"equal headroom: sooner reset wins", cands(acct("a", used(40, later)), acct("b", used(40, soon))), "", "b"},
		{"a window past its reset counts as full", cands(acct("a", used(99, now.Add(-time.Minute))), acct("b", used(10, later))), "", "a"},
		{"ties break by id", cands(acct("b"), acct("a")), "", "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Balance(tc.pool, tc.org, now).Account.ID)
		})
	}
}

func TestConcurrencyCap(t *testing.T) {
	t.Parallel()
	pool := []Candidate{{Account: acct("a", capped(2)), InFlight: 2}, {Account: acct("b", capped(2)), InFlight: 1}}
	sel, err := Select(SelectInput{Now: now, Candidates: pool, Prefs: Preferences{Thread: "a"}})
	require.NoError(t, err)
	assert.Equal(t, "b", sel.AccountID, "a full account is skipped")
	pool[1].InFlight = 2
	_, err = Select(SelectInput{Now: now, Candidates: pool})
	var na *NoAccountError
	assert.ErrorAs(t, err, &na)
}

func TestPlanBinding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		sel   Selection
		prefs Preferences
		want  BindingPlan
	}{
		{"first admission by balancer seeds the session", Selection{AccountID: "a", Reason: "balancer"}, Preferences{}, BindingPlan{Write: true, SeedSession: true, Source: "admission:balancer"}},
		{"sibling admitted on the session preference", Selection{AccountID: "a", Reason: "session"}, Preferences{Session: "a"}, BindingPlan{Write: true, SeedSession: true, Source: "admission:session"}},
		{"first admission by a hard owner", Selection{AccountID: "b", Reason: "previous_response", Hard: true}, Preferences{}, BindingPlan{Write: true, SeedSession: true, Source: "admission:previous_response"}},
		{"served by its own row", Selection{AccountID: "a", Reason: "thread"}, Preferences{Thread: "a", Session: "a"}, BindingPlan{}},
		{"moved: only the thread row", Selection{AccountID: "b", Reason: "balancer"}, Preferences{Thread: "a", Session: "a"}, BindingPlan{Write: true, Source: "move:balancer"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, PlanBinding(tc.sel, tc.prefs)) })
	}
}

// The group limits soft rows and the balancer, never hard owners.
func TestSelectGroup(t *testing.T) {
	t.Parallel()
	pool := cands(acct("p1"), acct("f1", func(a *store.Account) { a.Tags = []string{"fallback"} }))
	inPool := func(a store.Account) bool { return !isFallback(a) }
	inFallback := isFallback
	sel, err := Select(SelectInput{Now: now, Candidates: pool, Group: inPool})
	require.NoError(t, err)
	assert.Equal(t, "p1", sel.AccountID)
	sel, err = Select(SelectInput{Now: now, Candidates: pool, Group: inPool, Prefs: Preferences{Thread: "f1"}})
	require.NoError(t, err)
	assert.Equal(t, "p1", sel.AccountID, "a thread row on the fallback returns to the pool")
	sel, err = Select(SelectInput{Now: now, Candidates: pool, Group: inFallback})
	require.NoError(t, err)
	assert.Equal(t, "f1", sel.AccountID)
	sel, err = Select(SelectInput{Now: now, Candidates: pool, Group: inPool, Evidence: Evidence{HardTurnState: "f1"}})
	require.NoError(t, err)
	assert.Equal(t, "f1", sel.AccountID, "a turn the fallback started stays on it")
	_, err = Select(SelectInput{Now: now, Candidates: pool, Group: inPool, Exclude: map[string]bool{"p1": true}})
	var na *NoAccountError
	require.ErrorAs(t, err, &na)
	assert.Equal(t, 1, na.Considered, "only the group counts")
}
