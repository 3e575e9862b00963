package alert

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
)

func typesAndKeys(cs []Condition) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Type+" "+c.Key)
	}
	return out
}

func TestAccountConditions(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	soon, later := now.Add(time.Hour), now.Add(3*time.Hour)
	acc := func(id string, st store.Status, until time.Time, tags ...string) store.Account {
		return store.Account{ID: id, Label: id, Status: st, StatusUntil: until, Tags: tags}
	}
	team := store.ClientKey{ID: "key_team", ScopeTag: "team"}
	revoked := store.ClientKey{ID: "key_old", ScopeTag: "old", RevokedAt: now.Add(-time.Hour)}
	cases := []struct {
		name  string
		accts []store.Account
		keys  []store.ClientKey
		want  []string
	}{
		{"all well", []store.Account{acc("a", store.StatusActive, time.Time{})}, nil, nil},
		{"a refused refresh token", []store.Account{acc("a", store.StatusReauthRequired, time.Time{}), acc("b", store.StatusActive, time.Time{})}, nil,
			[]string{"account.needs_login a"}},
		{"one limited of two", []store.Account{acc("a", store.StatusRateLimited, soon), acc("b", store.StatusActive, time.Time{})}, nil,
			[]string{"account.exhausted a"}},
		{"every account limited: the pool too", []store.Account{acc("a", store.StatusRateLimited, later), acc("b", store.StatusQuotaExceeded, soon)}, nil,
			[]string{"account.exhausted a", "account.exhausted b", "pool.exhausted all"}},
		{"every account paused: no alert", []store.Account{acc("a", store.StatusPaused, time.Time{})}, nil, nil},
		{"a key's scope exhausted, the pool not", []store.Account{acc("a", store.StatusRateLimited, soon, "team"), acc("b", store.StatusActive, time.Time{})},
			[]store.ClientKey{team, revoked}, []string{"account.exhausted a", "pool.exhausted tag:team"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, typesAndKeys(AccountConditions(c.accts, c.keys, now)))
		})
	}

	cs := AccountConditions([]store.Account{acc("a", store.StatusRateLimited, later), acc("b", store.StatusQuotaExceeded, soon)}, nil, now)
	assert.Equal(t, soon, cs[2].Data["resets_at"], "the pool's earliest reset")
	assert.Equal(t, "secondary", cs[1].Data["window"])
	assert.Equal(t, later, cs[0].Data["resets_at"])
}

func TestKeyConditions(t *testing.T) {
	k := store.ClientKey{ID: "key_1", Name: "ci"}
	day := budget.Limit{Metric: budget.Requests, Window: budget.Day, Max: 10}
	conc := budget.Limit{Metric: budget.Concurrent, Max: 2}
	for _, c := range []struct {
		used float64
		want []string
	}{
		{7.9, nil},
		{8, []string{"key.limit_threshold key_1|requests/day|80"}},
		{9.99, []string{"key.limit_threshold key_1|requests/day|80"}},
		{10, []string{"key.limit_threshold key_1|requests/day|80", "key.limit_threshold key_1|requests/day|100"}},
		{12, []string{"key.limit_threshold key_1|requests/day|80", "key.limit_threshold key_1|requests/day|100"}},
	} {
		got := KeyConditions(k, []store.LimitUse{{Limit: day, Used: c.used}, {Limit: conc, Used: 2}})
		assert.Equal(t, c.want, typesAndKeys(got), "used %v of 10", c.used)
		for _, g := range got {
			assert.Equal(t, "key_1", g.Subject["key_id"])
		}
	}
}

func TestErrorConditions(t *testing.T) {
	accts := []store.Account{{ID: "a", Label: "a"}, {ID: "b", Label: "b"}}
	counts := []store.AttemptCount{
		{AccountID: "a", Class: "ok", N: 5}, {AccountID: "a", Class: "server", N: 3}, {AccountID: "a", Class: "transport", N: 2},
		{AccountID: "b", Class: "ok", N: 5}, {AccountID: "b", Class: "cancelled", N: 4}, {AccountID: "b", Class: "usage_limit", N: 4},
		{AccountID: "gone", Class: "server", N: 50},
	}
	got := ErrorConditions(accts, counts, 0.5, 10)
	assert.Equal(t, []string{"upstream.errors a"}, typesAndKeys(got), "b's failures are the client's and its usage: not the upstream failing")
	assert.Equal(t, 5, got[0].Data["failed"])
	assert.Equal(t, 10, got[0].Data["attempts"])
	assert.Empty(t, ErrorConditions(accts, counts, 0.51, 10), "below the share")
	assert.Empty(t, ErrorConditions(accts, counts, 0.5, 11), "too few attempts")
}

func TestReplicaConditions(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	deps := []store.ReplicaDeparture{
		{ID: "rep_a", Name: "host:1", StartedAt: t0.Add(-time.Hour), HeartbeatAt: t0.Add(-time.Minute), DepartedAt: t0},
		{ID: "rep_b", Name: "host:2", StartedAt: t0.Add(-time.Hour), HeartbeatAt: t0.Add(-time.Minute), DepartedAt: t0.Add(time.Minute)},
	}
	old := store.Replica{ID: "rep_c", StartedAt: t0.Add(-2 * time.Hour)}
	assert.Equal(t, []string{"replica.lost rep_a", "replica.lost rep_b"}, typesAndKeys(ReplicaConditions(deps, []store.Replica{old})),
		"a replica older than the departures takes no one's place")
	fresh := store.Replica{ID: "rep_d", StartedAt: t0.Add(30 * time.Second)}
	assert.Equal(t, []string{"replica.lost rep_b"}, typesAndKeys(ReplicaConditions(deps, []store.Replica{old, fresh})),
		"one started after a departure takes its place")
	c := ReplicaConditions(deps[:1], nil)[0]
	assert.Equal(t, "host:1", c.Subject["name"])
	assert.Contains(t, c.Data["message"], "host:1 stopped heartbeating")
	assert.Empty(t, ReplicaConditions(nil, nil))
}
