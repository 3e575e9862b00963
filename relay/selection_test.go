package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
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

func cands(accounts ...store.Account) []candidate {
	out := make([]candidate, len(accounts))
	for i, a := range accounts {
		out[i] = candidate{Account: a}
	}
	return out
}

func TestSelectOrder(t *testing.T) {
	t.Parallel()
	later := now.Add(time.Hour)
	pool := cands(acct("a"), acct("b"), acct("c"))
	cases := []struct {
		name    string
		in      selectInput
		want    string
		reason  string
		hard    bool
		wantErr any
	}{
		{"balancer when nothing is known", selectInput{Candidates: pool}, "a", "balancer", false, nil},
		{"thread row first", selectInput{Candidates: pool, Prefs: preferences{Thread: "b", Session: "c"}}, "b", "thread", false, nil},
		{"session preference for a new thread", selectInput{Candidates: pool, Prefs: preferences{Session: "c"}}, "c", "session", false, nil},
		{"hard owner beats rows", selectInput{Candidates: pool, Prefs: preferences{Thread: "b"}, Owner: hardOwner{"c", hardPreviousResponse}}, "c", "previous_response", true, nil},
		{"pin is hard", selectInput{Candidates: pool, Prefs: preferences{Thread: "a", Lane: "a"}, Owner: hardOwner{"c", hardSessionPin}}, "c", "raw_session", true, nil},
		{"the lane first among preferences", selectInput{Candidates: pool, Prefs: preferences{Lane: "c", Thread: "b", Session: "a"}}, "c", "lane", false, nil},
		{"an unavailable lane is left for the thread row", selectInput{Candidates: cands(acct("a"), acct("b"), acct("c", status(store.StatusPaused, time.Time{}))), Prefs: preferences{Lane: "c", Thread: "b"}}, "b", "thread", false, nil},
		{"a lane outside the key's scope is left", selectInput{Candidates: pool, Prefs: preferences{Lane: "gone", Thread: "b"}}, "b", "thread", false, nil},
		{"unavailable hard owner fails closed", selectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b")), Owner: hardOwner{"a", hardPreviousResponse}}, "", "", false, &ownerUnavailableError{}},
		{"hard owner outside scope fails closed", selectInput{Candidates: pool, Owner: hardOwner{"zzz", hardSessionPin}}, "", "", false, &ownerUnavailableError{}},
		{"tried hard owner fails closed", selectInput{Candidates: pool, Owner: hardOwner{"a", hardTurnState}, Exclude: map[string]bool{"a": true}}, "", "", false, &ownerUnavailableError{}},
		{"limited thread row falls to session", selectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b"), acct("c")), Prefs: preferences{Thread: "a", Session: "c"}}, "c", "session", false, nil},
		{"limited thread and session rows fall to balancer", selectInput{Candidates: cands(acct("a", status(store.StatusPaused, time.Time{})), acct("b"), acct("c", status(store.StatusQuotaExceeded, later))), Prefs: preferences{Thread: "a", Session: "c"}}, "b", "balancer", false, nil},
		{"rate limit past its reset serves again", selectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, now.Add(-time.Second)))), Prefs: preferences{Thread: "a"}}, "a", "thread", false, nil},
		{"excluded thread row is skipped", selectInput{Candidates: pool, Prefs: preferences{Thread: "a"}, Exclude: map[string]bool{"a": true}}, "b", "balancer", false, nil},
		{"thread row outside scope is skipped", selectInput{Candidates: pool, Prefs: preferences{Thread: "gone"}}, "a", "balancer", false, nil},
		{"nothing usable", selectInput{Candidates: cands(acct("a", status(store.StatusRateLimited, later)), acct("b", status(store.StatusReauthRequired, time.Time{})))}, "", "", false, &noAccountError{}},
		{"empty scope", selectInput{}, "", "", false, &noAccountError{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			sel, err := selectAccount(tc.in)
			switch want := tc.wantErr.(type) {
			case nil:
				require.NoError(t, err)
				assert.Equal(t, tc.want, sel.AccountID)
				assert.Equal(t, tc.reason, sel.Reason)
				assert.Equal(t, tc.hard, sel.Hard)
			case *ownerUnavailableError:
				assert.ErrorAs(t, err, &want)
			case *noAccountError:
				assert.ErrorAs(t, err, &want)
			}
		})
	}
}

func TestNoAccountReportsEarliestReset(t *testing.T) {
	t.Parallel()
	soon, later := now.Add(10*time.Minute), now.Add(3*time.Hour)
	_, err := selectAccount(selectInput{Now: now, Candidates: cands(
		acct("a", status(store.StatusQuotaExceeded, later)),
		acct("b", status(store.StatusRateLimited, soon)),
		acct("c", status(store.StatusPaused, time.Time{})),
	)})
	var na *noAccountError
	require.True(t, errors.As(err, &na))
	assert.Equal(t, soon, na.EarliestReset)
	assert.Equal(t, 3, na.Considered)
}

func TestBalance(t *testing.T) {
	t.Parallel()
	soon, later := now.Add(30*time.Minute), now.Add(4*time.Hour)
	cases := []struct {
		name string
		pool []candidate
		org  string
		want string
	}{
		{"more headroom wins", cands(acct("a", used(80, later)), acct("b", used(20, later))), "", "b"},
		{"in-flight load shares headroom", []candidate{{Account: acct("a"), InFlight: 3}, {Account: acct("b", used(50, later))}}, "", "b"},
		{"priority before headroom", cands(acct("a", used(90, later), prio(1)), acct("b")), "", "a"},
		{"organisation before priority", cands(acct("a", prio(5), org("o1")), acct("b", org("o2"))), "o2", "b"},
		{"equal headroom: sooner reset wins", cands(acct("a", used(40, later)), acct("b", used(40, soon))), "", "b"},
		{"a window past its reset counts as full", cands(acct("a", used(99, now.Add(-time.Minute))), acct("b", used(10, later))), "", "a"},
		{"ties break by id", cands(acct("b"), acct("a")), "", "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, balance(tc.pool, tc.org, now).Account.ID)
		})
	}
}

func TestConcurrencyCap(t *testing.T) {
	t.Parallel()
	pool := []candidate{{Account: acct("a", capped(2)), InFlight: 2}, {Account: acct("b", capped(2)), InFlight: 1}}
	sel, err := selectAccount(selectInput{Now: now, Candidates: pool, Prefs: preferences{Thread: "a"}})
	require.NoError(t, err)
	assert.Equal(t, "b", sel.AccountID, "a full account is skipped")
	pool[1].InFlight = 2
	_, err = selectAccount(selectInput{Now: now, Candidates: pool})
	var na *noAccountError
	assert.ErrorAs(t, err, &na)
}

func TestPlanBinding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		sel   selection
		prefs preferences
		want  bindingPlan
	}{
		{"first admission by balancer seeds the session", selection{AccountID: "a", Reason: "balancer"}, preferences{}, bindingPlan{Write: true, SeedSession: true, Source: "admission:balancer"}},
		{"sibling admitted on the session preference", selection{AccountID: "a", Reason: "session"}, preferences{Session: "a"}, bindingPlan{Write: true, SeedSession: true, Source: "admission:session"}},
		{"first admission by a hard owner", selection{AccountID: "b", Reason: "previous_response", Hard: true}, preferences{}, bindingPlan{Write: true, SeedSession: true, Source: "admission:previous_response"}},
		{"served by its own row", selection{AccountID: "a", Reason: "thread"}, preferences{Thread: "a", Session: "a"}, bindingPlan{}},
		{"moved: only the thread row", selection{AccountID: "b", Reason: "balancer"}, preferences{Thread: "a", Session: "a"}, bindingPlan{Write: true, Source: "move:balancer"}},
		{"served on its lane, row agrees", selection{AccountID: "a", Reason: "lane"}, preferences{Lane: "a", Thread: "a"}, bindingPlan{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, planBinding(tc.sel, tc.prefs)) })
	}
}

// The group limits soft rows and the balancer, never hard owners.
func TestSelectGroup(t *testing.T) {
	t.Parallel()
	pool := cands(acct("p1"), acct("f1", func(a *store.Account) { a.Tags = []string{"fallback"} }))
	inPool := func(a store.Account) bool { return !isFallback(a) }
	inFallback := isFallback
	sel, err := selectAccount(selectInput{Now: now, Candidates: pool, Group: inPool})
	require.NoError(t, err)
	assert.Equal(t, "p1", sel.AccountID)
	sel, err = selectAccount(selectInput{Now: now, Candidates: pool, Group: inPool, Prefs: preferences{Thread: "f1"}})
	require.NoError(t, err)
	assert.Equal(t, "p1", sel.AccountID, "a thread row on the fallback returns to the pool")
	sel, err = selectAccount(selectInput{Now: now, Candidates: pool, Group: inFallback})
	require.NoError(t, err)
	assert.Equal(t, "f1", sel.AccountID)
	sel, err = selectAccount(selectInput{Now: now, Candidates: pool, Group: inPool, Owner: hardOwner{"f1", hardTurnState}})
	require.NoError(t, err)
	assert.Equal(t, "f1", sel.AccountID, "a turn the fallback started stays on it")
	_, err = selectAccount(selectInput{Now: now, Candidates: pool, Group: inPool, Exclude: map[string]bool{"p1": true}})
	var na *noAccountError
	require.ErrorAs(t, err, &na)
	assert.Equal(t, 1, na.Considered, "only the group counts")
}

// Which evidence is a conflict (409, nothing sent), which names the owner,
// and which is only a preference. A live lane is never evidence: an
// operator's pin moves a thread off it at its next request.
func TestWeighEvidence(t *testing.T) {
	t.Parallel()
	ident := Identity{Key: "v1:st:t", SessionKey: "v1:s:s", Session: "s", Thread: "t"}
	row := func(kind store.BindingKind, key, account string) store.Binding {
		return store.Binding{Kind: kind, Key: key, AccountID: account}
	}
	threadRow, sessionRow := row(store.BindThread, "v1:st:t", "A"), row(store.BindSession, "v1:s:s", "S")
	sessionPin, threadPin := row(store.BindRawSession, "s", "P"), row(store.BindRawThread, "t", "Q")
	cases := []struct {
		name     string
		in       evidenceInput
		owner    hardOwner
		prefs    preferences
		conflict [2]hardSource
	}{
		{"nothing: rows are preferences", evidenceInput{rows: []store.Binding{threadRow, sessionRow}},
			hardOwner{}, preferences{Thread: "A", Session: "S"}, [2]hardSource{}},
		{"a lane is a preference, not evidence", evidenceInput{lane: "L", rows: []store.Binding{threadRow}},
			hardOwner{}, preferences{Lane: "L", Thread: "A"}, [2]hardSource{}},
		{"a pin beats the lane: the thread moves", evidenceInput{lane: "L", rows: []store.Binding{sessionPin}},
			hardOwner{"P", hardSessionPin}, preferences{Lane: "L"}, [2]hardSource{}},
		{"a thread pin beats a session pin", evidenceInput{rows: []store.Binding{sessionPin, threadPin}},
			hardOwner{"Q", hardThreadPin}, preferences{}, [2]hardSource{}},
		{"a pin beats a previous response elsewhere: Codex resends in full", evidenceInput{prevOwner: "B", rows: []store.Binding{sessionPin}},
			hardOwner{"P", hardSessionPin}, preferences{}, [2]hardSource{}},
		{"previous response alone", evidenceInput{prevOwner: "B", rows: []store.Binding{threadRow}},
			hardOwner{"B", hardPreviousResponse}, preferences{Thread: "A"}, [2]hardSource{}},
		{"turn state alone", evidenceInput{turnStateOwner: "T"}, hardOwner{"T", hardTurnState}, preferences{}, [2]hardSource{}},
		{"turn state agreeing with the pin", evidenceInput{turnStateOwner: "P", rows: []store.Binding{sessionPin}},
			hardOwner{"P", hardTurnState}, preferences{}, [2]hardSource{}},
		{"turn state and previous response of different accounts", evidenceInput{turnStateOwner: "T", prevOwner: "B"},
			hardOwner{}, preferences{}, [2]hardSource{hardTurnState, hardPreviousResponse}},
		{"a turn state issued elsewhere than the pin, mid-turn", evidenceInput{turnStateOwner: "T", rows: []store.Binding{sessionPin}},
			hardOwner{}, preferences{}, [2]hardSource{hardTurnState, hardSessionPin}},
		{"a client without thread ids: its session row is its thread's", evidenceInput{rows: []store.Binding{row(store.BindSession, "v1:st:t", "A")}},
			hardOwner{}, preferences{Thread: "A"}, [2]hardSource{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.ident = ident
			owner, prefs, err := weighEvidence(tc.in)
			if tc.conflict != [2]hardSource{} {
				var c *conflictError
				require.ErrorAs(t, err, &c)
				assert.Equal(t, tc.conflict, [2]hardSource{c.A.source, c.B.source})
				f, class := failureFor(err, now)
				assert.Equal(t, 409, f.status)
				assert.Equal(t, classConflict, class)
				assert.NotContains(t, f.err.Message, c.A.account, "no account id reaches the client")
				assert.NotContains(t, f.err.Message, c.B.account)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.owner, owner)
			assert.Equal(t, tc.prefs, prefs)
		})
	}
}

// An account whose upstream did not answer lately is passed over by new
// threads while another can take them, and still taken when none can; a
// thread that prefers it, or must have it, still goes there.
func TestUnreachableAccounts(t *testing.T) {
	now := time.Now()
	dead := candidate{Account: acct("dead", prio(10)), Unreachable: true}
	live := candidate{Account: acct("live")}
	for _, tc := range []struct {
		name string
		in   selectInput
		want string
	}{
		{"a new thread goes elsewhere", selectInput{Candidates: []candidate{dead, live}}, "live"},
		{"unless no other can serve", selectInput{Candidates: []candidate{dead, live}, Exclude: map[string]bool{"live": true}}, "dead"},
		{"the thread's own row still tries it", selectInput{Candidates: []candidate{dead, live}, Prefs: preferences{Thread: "dead"}}, "dead"},
		{"a hard owner still tries it", selectInput{Candidates: []candidate{dead, live}, Owner: hardOwner{account: "dead", source: hardPreviousResponse}}, "dead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			sel, err := selectAccount(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, sel.AccountID)
		})
	}
}

func TestUnreachableSign(t *testing.T) {
	for _, tc := range []struct {
		class attemptClass
		end   attemptEnd
		want  bool
	}{
		{classTransport, attemptEnd{}, true},
		{classStall, attemptEnd{Stalled: true}, true},
		{classStall, attemptEnd{Stalled: true, Committed: true}, false},
		{classTransport, attemptEnd{Cancelled: true}, false},
		{classStreamCut, attemptEnd{StreamCut: true}, false},
		{classStall, attemptEnd{Stalled: true, Status: 200}, false},
		{classUsageLimit, attemptEnd{Status: 429}, false},
	} {
		assert.Equal(t, tc.want, unreachableSign(tc.class, tc.end), "%s %+v", tc.class, tc.end)
	}
}
