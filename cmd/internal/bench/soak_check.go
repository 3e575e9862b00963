package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// waitLogged waits (at most 30 s) for the request log to hold a row for
// every request sent, and returns how many it holds.
func (r *soakRun) waitLogged(ctx context.Context, want int) int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, n, err := r.env.store.Requests(ctx, store.RequestFilter{ClientKeyID: r.env.keyID, Limit: 1})
		if err == nil && n >= want || time.Now().After(deadline) || !sleepCtx(ctx, 250*time.Millisecond) {
			return n
		}
	}
}

func (r *soakRun) checkResources(rep soakReport) {
	if rep.Goroutines[1] > rep.Goroutines[0] {
		r.violate("goroutines", "%d before the sessions, %d after them; more than before: %s", rep.Goroutines[0], rep.Goroutines[1],
			goroutineGrowth(r.goroutinesBefore, goroutineSites()))
	}
	if rep.OpenSockets[1] > rep.OpenSockets[0] {
		r.violate("sockets", "%d before the sessions, %d after them", rep.OpenSockets[0], rep.OpenSockets[1])
	}
}

// checkMemory says the live heap is flat when its peak over the last
// fifth of the run is within 25% (and 16 MiB) of its peak over the middle
// fifth. The relay's caches fill as new threads come (continuity: 10,000
// threads or 256 MiB; owners: 200,000 ids), so a run must last until they
// are full (a 1,000-session soak starts about 4,000 threads a minute):
// growth past that is a leak.
func (r *soakRun) checkMemory(samples []soakMemSample) {
	if len(samples) < 10 {
		return
	}
	fifth := len(samples) / 5
	peak := func(s []soakMemSample) int64 {
		var m int64
		for _, x := range s {
			m = max(m, x.LiveHeap)
		}
		return m
	}
	middle, late := peak(samples[2*fifth:3*fifth]), peak(samples[len(samples)-fifth:])
	if late > middle+middle/4+16<<20 {
		r.violate("memory", "the live heap grew from a peak of %.1f MiB in the middle fifth of the run to %.1f MiB in the last", float64(middle)/mib, float64(late)/mib)
	}
}

// checkLog compares every session's log rows with what its client sent
// and what the sim answered.
func (r *soakRun) checkLog(ctx context.Context, rep *soakReport) error {
	st := r.env.store
	rep.Recoveries = map[string]int{}
	accounts := map[string]bool{}
	for _, a := range r.env.accounts {
		accounts[a.ID] = true
	}
	storeIDs, err := r.env.accountIDs(ctx)
	if err != nil {
		return err
	}
	undelivered := r.env.upstream.Undelivered()
	for _, s := range r.sessions {
		rows, _, err := st.Requests(ctx, store.RequestFilter{ThreadID: s.id, Limit: 1000})
		if err != nil {
			return fmt.Errorf("soak: the request log of %s: %w", s.id, err)
		}
		if len(rows) != s.requests {
			r.violate("log rows", "session %s (%s): the client sent %d requests, the log holds %d rows", s.id, s.transport, s.requests, len(rows))
		}
		var logged soakUsage
		lastOK := ""
		slices.SortFunc(rows, func(a, b store.RequestRecord) int { return a.StartedAt.Compare(b.StartedAt) })
		for _, row := range rows {
			logged.add(soakUsage{Input: row.InputTokens, Cached: row.CachedTokens, Output: row.OutputTokens, Reasoning: row.ReasoningTokens, Total: row.TotalTokens})
			if row.Recovery != "" {
				rep.Recoveries[row.Recovery]++
			}
			if row.Duration > r.o.turnTimeout {
				r.violate("duration", "session %s: request %s took %s, past the turn deadline", s.id, row.ID, row.Duration)
			}
			if row.OutputTokens > 0 {
				// The upstream completed it (usage comes with
				// response.completed only), also when its client had hung
				// up by then: its account is where the thread is bound.
				lastOK = storeIDs[row.AccountID]
			}
		}
		r.mu.Lock()
		upstream := *cmp.Or(r.upstream[s.id], &soakUsage{})
		r.mu.Unlock()
		rep.LoggedUsage.add(logged)
		rep.UpstreamUsage.add(upstream)
		lost := soakUsage{}
		if u, ok := undelivered[s.id]; ok {
			lost = soakUsage{Input: u.InputTokens, Cached: u.CachedTokens, Output: u.OutputTokens, Reasoning: u.ReasoningTokens, Total: u.TotalTokens}
			rep.Undelivered.add(lost)
		}
		if delivered := upstream.minus(lost); logged != delivered {
			r.violate("usage", "session %s (%s): the log settled %+v, the upstream reported %+v (of which it could not deliver %+v); its rows: %s", s.id, s.transport, logged, upstream, lost, rowsText(rows))
		}
		if s.completed == 0 {
			continue
		}
		// The thread's binding: there, on an account that exists, the one
		// that answered its last completed turn.
		rep.BindingsChecked++
		bs, _, err := st.Bindings(ctx, store.BindingFilter{ThreadID: s.id, IncludeExpired: true})
		if err != nil {
			return fmt.Errorf("soak: the bindings of %s: %w", s.id, err)
		}
		bs = slices.DeleteFunc(bs, func(b store.Binding) bool { return b.AbandonedScope != "" })
		switch {
		case len(bs) == 0:
			r.violate("binding", "session %s (%s): %d completed turns and no binding", s.id, s.transport, s.completed)
		case !accounts[storeIDs[bs[0].AccountID]]:
			r.violate("binding", "session %s: bound to account %q, which is not in the pool", s.id, bs[0].AccountID)
		case lastOK != "" && storeIDs[bs[0].AccountID] != lastOK:
			r.violate("binding", "session %s (%s): bound to %s, but the last answer the upstream completed for it came from %s", s.id, s.transport, storeIDs[bs[0].AccountID], lastOK)
		}
	}
	return nil
}

// rowsText sums up a session's log rows, oldest first, for a violation
// about them: each row's status, error, recovery and usage (input/cached/
// output), and when it started.
func rowsText(rows []store.RequestRecord) string {
	parts := make([]string, 0, len(rows))
	for _, row := range rows {
		p := fmt.Sprintf("%s %d", row.StartedAt.Format("15:04:05.000"), row.Status)
		if row.ErrorCode != "" {
			p += " " + row.ErrorCode
		}
		if row.Recovery != "" {
			p += " (" + row.Recovery + ")"
		}
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d", p, row.InputTokens, row.CachedTokens, row.OutputTokens))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// checkRows checks the accounts, their credentials and the client key,
// and counts the relay's attempts by class.
func (r *soakRun) checkRows(ctx context.Context, rep *soakReport) error {
	st := r.env.store
	accts, err := st.Accounts(ctx)
	if err != nil {
		return err
	}
	byLabel := map[string]store.Account{}
	for _, a := range accts {
		byLabel[a.Label] = a
	}
	for _, want := range r.env.accounts {
		a, ok := byLabel[want.ID]
		if !ok {
			r.violate("account", "%s lost", want.ID)
			continue
		}
		if a.ChatGPTAccountID != want.ID || a.Organization != want.Organization || a.Kind != store.KindChatGPT || a.BaseURL != r.env.upstream.CodexBaseURL() {
			r.violate("account", "%s changed: %+v", want.ID, a)
		}
		cred, err := st.Credentials(ctx, a.ID)
		if err != nil {
			r.violate("account", "%s: credentials unreadable: %v", want.ID, err)
			continue
		}
		up, _ := r.env.upstream.Account(want.ID)
		rep.Refreshes += up.Refreshes
		if cred.RefreshToken != up.RefreshToken {
			r.violate("refresh token", "account %s: the store holds a refresh token the upstream no longer knows (after %d rotations)", want.ID, up.Refreshes)
		}
		if up.RefreshesRejected > 0 {
			r.violate("refresh token", "account %s: a spent refresh token was replayed %d times", want.ID, up.RefreshesRejected)
		}
	}
	if _, err := st.AuthenticateClientKey(ctx, r.env.key); err != nil {
		r.violate("client key", "the client key no longer authenticates: %v", err)
	}
	rep.Attempts = map[string]int{}
	for _, class := range []string{"ok", "usage_limit", "rate_limit", "quota", "auth", "billing", "forbidden", "server", "transport",
		"stream_cut", "stall", "invalid", "previous_response_not_found", "ciphertext", "failed", "cancelled", "client_stalled",
		"connection_limit", "chain_refused", "lane_capacity", "conflict", "no_account", "store_unavailable", "key_limit"} {
		_, n, err := st.Attempts(ctx, store.AttemptFilter{Class: class, Limit: 1})
		if err != nil {
			return err
		}
		if n > 0 {
			rep.Attempts[class] = n
		}
	}
	return nil
}

// checkPenalties finds each penalty's cause among the faults the sim gave
// that account.
func (r *soakRun) checkPenalties(rep *soakReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	storeIDs, _ := r.env.accountIDs(context.Background())
	for _, p := range r.penalties {
		label := storeIDs[p.Account]
		p.Account, p.Cause = label, penaltyCause(p, label, r.fired)
		if p.Cause == "" {
			r.violateLocked("penalty", "account %s was put in %s (%s) at %s without a fault of its own that explains it",
				label, p.Status, p.Reason, p.At.Format(time.TimeOnly))
		}
		rep.Penalties = append(rep.Penalties, p)
	}
}

// penaltyCause is the kind of the first fault the sim gave account label
// (its sim id) that puts an account in p's status, fired before p was set
// (a second of slack for the clocks' reading), or "" when none explains
// it. Pure.
func penaltyCause(p soakPenalty, label string, fired []firedFault) string {
	for _, f := range fired {
		if f.Account == label && slices.Contains(penaltyCauses[store.Status(p.Status)], f.Fault) && !f.Time.After(p.At.Add(time.Second)) {
			return string(f.Fault)
		}
	}
	return ""
}

// checkFinalTurn runs one more turn on each transport with the soak's
// client key once everything settled: the relay still serves.
func (r *soakRun) checkFinalTurn(ctx context.Context, client *http.Client, target benchTarget) error {
	for i, transport := range []string{"ws", "http"} {
		s := r.newSession(transport)
		r.session(ctx, client, target, i, s, time.Time{})
		if s.last != soakCompleted {
			r.violate("final turn", "after the soak, a %s turn did not complete: %s", transport, s.last)
		}
	}
	return ctx.Err()
}

// accountIDs maps the store's account ids to the sim's (the labels).
func (e *benchEnv) accountIDs(ctx context.Context) (map[string]string, error) {
	accts, err := e.store.Accounts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(accts))
	for _, a := range accts {
		out[a.ID] = a.Label
	}
	return out, nil
}

// goroutineSites counts the goroutines by the first function of theirs
// outside the runtime and the standard library's waits.
func goroutineSites() map[string]int {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return nil
	}
	out := map[string]int{}
	text := b.String()
	if _, rest, ok := strings.Cut(text, "\n"); ok && strings.HasPrefix(text, "goroutine profile:") {
		text = rest
	}
	for block := range strings.SplitSeq(text, "\n\n") {
		var n int
		if _, err := fmt.Sscanf(block, "%d @", &n); err != nil {
			continue
		}
		site := "?"
		for line := range strings.SplitSeq(block, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "#" {
				continue
			}
			fn, _, _ := strings.Cut(f[2], "+0x")
			if !strings.HasPrefix(fn, "runtime") && !strings.HasPrefix(fn, "sync.") && !strings.HasPrefix(fn, "internal/") && !strings.HasPrefix(fn, "time.") {
				site = fn
				break
			}
		}
		out[site] += n
	}
	return out
}

// goroutineGrowth lists the sites with more goroutines now than before.
func goroutineGrowth(before, now map[string]int) string {
	var parts []string
	for _, site := range slices.Sorted(maps.Keys(now)) {
		if d := now[site] - before[site]; d > 0 {
			parts = append(parts, fmt.Sprintf("+%d %s", d, site))
		}
	}
	return strings.Join(parts, ", ")
}

// liveHeap is the heap the last collection found live.
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// openSockets counts the process's open sockets (0 where /proc/self/fd
// cannot be read): the connections. Files are left out: the database's
// connection pool opens more of them under load and keeps them (on
// PostgreSQL, quiesce takes the pool's sockets off too).
func openSockets() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(link, "socket:") {
			n++
		}
	}
	return n
}

// printSoak prints the soak's report.
func printSoak(w io.Writer, rep soakReport) {
	fmt.Fprintf(w, "soak: %d sessions at once (%d run) over WebSocket and HTTP for %.0f s, %d accounts in two organisations, %s\n",
		rep.Sessions, rep.SessionsRun, rep.Seconds, rep.Accounts, rep.Database)
	fmt.Fprintf(w, "faults: %.1f%% of upstream requests, %.1f%% of client turns slow or hung up; %d CPUs, %s\n\n",
		rep.FaultRate*100, rep.ClientFaultRate*100, rep.CPUs, rep.GoVersion)
	counts := func(title string, m map[string]int) {
		keys := slices.Sorted(maps.Keys(m))
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		fmt.Fprintf(w, "%-22s %s\n", title, cmp.Or(strings.Join(parts, ", "), "none"))
	}
	counts("turns", rep.Turns)
	counts("failures seen", rep.Failures)
	fmt.Fprintf(w, "%-22s %d of the turns; longest turn %.0f ms (deadline %.0f ms)\n", "slow readers", rep.SlowTurns, rep.MaxTurnMs, rep.DeadlineMs)
	counts("faults fired", rep.Faults)
	counts("relay attempts", rep.Attempts)
	counts("recoveries", rep.Recoveries)
	fmt.Fprintf(w, "%-22s %d sent, %d logged, %d answered by the sim (attempts included)\n", "requests", rep.Requests, rep.LoggedRows, rep.SimRequests)
	fmt.Fprintf(w, "%-22s logged %+v\n%-22s upstream %+v\n%-22s of which undelivered %+v\n", "usage", rep.LoggedUsage, "", rep.UpstreamUsage, "", rep.Undelivered)
	causes := map[string]int{}
	for _, p := range rep.Penalties {
		causes[p.Status+" <- "+cmp.Or(p.Cause, "NOTHING")]++
	}
	counts("penalties", causes)
	fmt.Fprintf(w, "%-22s %d threads checked; %d refresh-token rotations\n", "bindings", rep.BindingsChecked, rep.Refreshes)
	fmt.Fprintf(w, "%-22s %d -> %d goroutines, %d -> %d open sockets\n", "resources", rep.Goroutines[0], rep.Goroutines[1], rep.OpenSockets[0], rep.OpenSockets[1])
	if n := len(rep.Memory); n > 0 {
		fmt.Fprintf(w, "%-22s", "live heap / RSS")
		for i := range 5 {
			s := rep.Memory[min(n-1, (i+1)*n/5)]
			fmt.Fprintf(w, "  %.0fs %.1f/%.1f MiB", s.Second, float64(s.LiveHeap)/mib, float64(s.RSS)/mib)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	if len(rep.Violations) == 0 {
		fmt.Fprintln(w, "checks: every one passed")
		return
	}
	total := 0
	for _, n := range rep.ViolationsByKind {
		total += n
	}
	fmt.Fprintf(w, "checks: %d violations\n", total)
	counts("by kind", rep.ViolationsByKind)
	fmt.Fprintf(w, "the first %d of each kind:\n", soakExamples)
	for _, v := range rep.Violations {
		fmt.Fprintln(w, "  - "+v)
	}
}

// errSoakViolations makes the command fail when a check did.
var errSoakViolations = errors.New("bench: the soak found violations")
