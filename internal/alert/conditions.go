package alert

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
)

// Condition is one condition standing now: its event type, a key naming
// its subject among that type's (an account id; a key, limit and
// threshold), and the event's subject and data when it fires.
type Condition struct {
	Type    string
	Key     string
	Subject map[string]any
	Data    map[string]any
}

// loginHint is how an account is given a new login, for the event of one
// that needs it.
const loginHint = "sign in again: `codex-relay accounts login -update` (device code) or " +
	"`codex-relay accounts import -update` with a fresh auth.json, or Accounts > the account > Sign in again in the console"

// AccountConditions are the conditions of the accounts: each that needs a
// new login (its refresh token was refused), each waiting for a usage
// window to reset, and each pool (the accounts a key may use) where no
// account can serve and at least one waits for a reset. keys are the
// client keys, for their pools; the pool of every account is one of them
// whatever the keys.
func AccountConditions(accts []store.Account, keys []store.ClientKey, now time.Time) []Condition {
	var out []Condition
	for _, a := range accts {
		subject := accountSubject(a)
		switch a.Status {
		case store.StatusReauthRequired:
			out = append(out, Condition{Type: AccountNeedsLogin, Key: a.ID, Subject: subject, Data: map[string]any{
				"reason":  a.StatusReason,
				"login":   loginHint,
				"message": fmt.Sprintf("Account %s needs a new login (%s); %s.", name(a), a.StatusReason, loginHint),
			}})
		case store.StatusRateLimited, store.StatusQuotaExceeded:
			window := "primary"
			if a.Status == store.StatusQuotaExceeded {
				window = "secondary"
			}
			data := map[string]any{"window": window, "reason": a.StatusReason,
				"message": fmt.Sprintf("Account %s reached its %s usage window%s.", name(a), window, until(a.StatusUntil))}
			if !a.StatusUntil.IsZero() {
				data["resets_at"] = a.StatusUntil.UTC()
			}
			out = append(out, Condition{Type: AccountExhausted, Key: a.ID, Subject: subject, Data: data})
		}
	}
	return append(out, poolConditions(accts, keys, now)...)
}

func accountSubject(a store.Account) map[string]any {
	s := map[string]any{"account_id": a.ID, "label": a.Label}
	if a.Email != "" {
		s["email"] = a.Email
	}
	return s
}

func name(a store.Account) string {
	if a.Label != "" {
		return a.Label
	}
	return a.ID
}

func until(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return "; it resets at " + t.UTC().Format(time.RFC3339)
}

// pool is the accounts a scope admits, and the keys of that scope.
type pool struct {
	name string
	keys []string
	key  *store.ClientKey // a key of the scope; nil: every account
}

// poolConditions: a pool is exhausted when it has accounts, none of them
// active, and at least one waiting for a reset (a pool whose accounts are
// all paused by an operator is not an alert); resets_at is the earliest
// of those resets.
func poolConditions(accts []store.Account, keys []store.ClientKey, now time.Time) []Condition {
	pools := []*pool{{name: "all"}}
	for _, k := range keys {
		if !k.Usable(now) {
			continue
		}
		name := scopeName(k)
		i := slices.IndexFunc(pools, func(p *pool) bool { return p.name == name })
		if i < 0 {
			k := k
			pools = append(pools, &pool{name: name, key: &k})
			i = len(pools) - 1
		}
		pools[i].keys = append(pools[i].keys, k.ID)
	}
	var out []Condition
	for _, p := range pools {
		n, waiting, active := 0, 0, false
		var resets time.Time
		for _, a := range accts {
			if p.key != nil && !p.key.AllowsAccount(a) {
				continue
			}
			n++
			switch a.Status {
			case store.StatusActive:
				active = true
			case store.StatusRateLimited, store.StatusQuotaExceeded:
				waiting++
				if !a.StatusUntil.IsZero() && (resets.IsZero() || a.StatusUntil.Before(resets)) {
					resets = a.StatusUntil
				}
			}
		}
		if n == 0 || active || waiting == 0 {
			continue
		}
		data := map[string]any{"accounts": n, "waiting": waiting,
			"message": fmt.Sprintf("No account of pool %s can serve: %d of its %d accounts wait for a usage reset%s.", p.name, waiting, n, earliest(resets))}
		if !resets.IsZero() {
			data["resets_at"] = resets.UTC()
		}
		if len(p.keys) > 0 {
			data["keys"] = p.keys
		}
		out = append(out, Condition{Type: PoolExhausted, Key: p.name, Subject: map[string]any{"pool": p.name}, Data: data})
	}
	return out
}

func earliest(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return "; the earliest resets at " + t.UTC().Format(time.RFC3339)
}

// scopeName names the accounts a key's scope admits: "all", or its
// accounts and tag.
func scopeName(k store.ClientKey) string {
	if len(k.ScopeAccounts) == 0 && k.ScopeTag == "" {
		return "all"
	}
	var parts []string
	if len(k.ScopeAccounts) > 0 {
		ids := slices.Clone(k.ScopeAccounts)
		slices.Sort(ids)
		parts = append(parts, "accounts:"+strings.Join(ids, ","))
	}
	if k.ScopeTag != "" {
		parts = append(parts, "tag:"+k.ScopeTag)
	}
	return strings.Join(parts, " ")
}

// Thresholds are the shares of a key's limit that fire
// key.limit_threshold, in percent.
var Thresholds = []int{80, 100}

// KeyConditions are a key's limits at or past each threshold: one
// condition per limit and threshold reached, so 80 and 100 fire once
// each, and clear when the window's use falls back below them (a new
// window). Concurrency has no window and is left out.
func KeyConditions(k store.ClientKey, uses []store.LimitUse) []Condition {
	var out []Condition
	for _, u := range uses {
		if u.Metric == budget.Concurrent || u.Max <= 0 {
			continue
		}
		share := u.Used / u.Max * 100
		for _, th := range Thresholds {
			if share < float64(th) {
				continue
			}
			data := map[string]any{"threshold": th, "limit": u.Name(), "metric": string(u.Metric), "window": string(u.Window),
				"used": u.Used, "max": u.Max,
				"message": fmt.Sprintf("Key %s used %d%% of its %s limit (%g of %g)%s.", keyName(k), th, u.Name(), u.Used, u.Max, until(u.ResetsAt))}
			if !u.ResetsAt.IsZero() {
				data["resets_at"] = u.ResetsAt.UTC()
			}
			out = append(out, Condition{Type: KeyLimitThreshold, Key: fmt.Sprintf("%s|%s|%d", k.ID, u.Name(), th),
				Subject: map[string]any{"key_id": k.ID, "key_name": k.Name, "limit": u.Name()}, Data: data})
		}
	}
	return out
}

func keyName(k store.ClientKey) string {
	if k.Name != "" {
		return k.Name
	}
	return k.ID
}

// ErrorWindow is the span upstream.errors counts an account's attempts
// over.
const ErrorWindow = 5 * time.Minute

// The defaults of upstream.errors: an account whose attempts of the last
// ErrorWindow failed at DefaultErrorShare or more, out of at least
// DefaultErrorMinAttempts (a couple of failures on a quiet account is no
// alert).
const (
	DefaultErrorShare       = 0.5
	DefaultErrorMinAttempts = 10
)

// upstreamFailures are the attempt classes that are the upstream's
// failing (relay/classify.go's names): errors, no answer, cut or stalled
// streams, failed responses, refused credentials. Usage limits are
// account.exhausted's; a client going away or a refused request is no
// upstream's fault.
var upstreamFailures = map[string]bool{
	"server": true, "transport": true, "stream_cut": true, "stall": true, "failed": true,
	"auth": true, "forbidden": true, "billing": true,
}

// ErrorConditions are the accounts whose share of failed attempts over
// the counts (of ErrorWindow) is at or above share, out of at least
// minAttempts.
func ErrorConditions(accts []store.Account, counts []store.AttemptCount, share float64, minAttempts int) []Condition {
	type tally struct {
		total, failed int
		classes       map[string]int
	}
	by := map[string]*tally{}
	var order []string
	for _, c := range counts {
		t := by[c.AccountID]
		if t == nil {
			t = &tally{classes: map[string]int{}}
			by[c.AccountID] = t
			order = append(order, c.AccountID)
		}
		t.total += c.N
		if upstreamFailures[c.Class] {
			t.failed += c.N
			t.classes[c.Class] += c.N
		}
	}
	known := map[string]store.Account{}
	for _, a := range accts {
		known[a.ID] = a
	}
	var out []Condition
	for _, id := range order {
		t := by[id]
		a, ok := known[id]
		if !ok || t.total < minAttempts || float64(t.failed) < share*float64(t.total) {
			continue
		}
		got := float64(t.failed) / float64(t.total)
		out = append(out, Condition{Type: UpstreamErrors, Key: id, Subject: accountSubject(a), Data: map[string]any{
			"window": ErrorWindow.String(), "attempts": t.total, "failed": t.failed, "share": got, "threshold": share, "classes": t.classes,
			"message": fmt.Sprintf("Account %s failed %d of its %d attempts in the last %s (%.0f%%).", name(a), t.failed, t.total, ErrorWindow, got*100),
		}})
	}
	return out
}

// ReplicaConditions are the replicas lost: each departure (a replica whose
// heartbeat lapsed without a clean stop) until a replica started after it
// registers, taking its place. reps are the replicas registered now.
func ReplicaConditions(deps []store.ReplicaDeparture, reps []store.Replica) []Condition {
	var out []Condition
	for _, d := range deps {
		replaced := slices.ContainsFunc(reps, func(r store.Replica) bool { return r.StartedAt.After(d.DepartedAt) })
		if replaced {
			continue
		}
		out = append(out, Condition{Type: ReplicaLost, Key: d.ID,
			Subject: map[string]any{"replica_id": d.ID, "name": d.Name, "address": d.Address},
			Data: map[string]any{"last_heartbeat_at": d.HeartbeatAt, "started_at": d.StartedAt, "departed_at": d.DepartedAt,
				"message": fmt.Sprintf("Replica %s stopped heartbeating at %s without stopping cleanly: its threads moved to the other replicas.",
					d.Name, d.HeartbeatAt.Format(time.RFC3339))}})
	}
	return out
}
