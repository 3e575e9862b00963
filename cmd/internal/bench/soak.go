package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// The soak (-soak DURATION): sessions over both transports, for a long
// time, with faults on both sides, and then the checks that say nothing
// was lost. Each of the -conversations slots runs one session after
// another (3 to 10 turns, a pause like a user's between turns) on its
// transport (even slots WebSocket, odd HTTP) until the duration ends; the
// turns under way then finish. The sim meets -fault-rate of the response
// requests with a fault (soakFaultMix), and a quarter of the upstream
// WebSocket connections reach their age limit after a few seconds; the
// clients are slow readers, or hang up mid-answer, on -client-fault-rate
// of their turns. The accounts belong to two organisations, so a thread
// moved by a fault may land where its ciphertext cannot be read.
//
// What it checks, afterwards (soakReport.Violations; any makes the command
// fail):
//   - every turn ended: completed, or with a terminal event Codex handles
//     (response.failed, response.incomplete, an error event, an HTTP error
//     with a JSON error), never past its deadline, never with a stream that
//     just stopped;
//   - every request has its log row, and the usage the log settled for
//     each thread is the usage the upstream reported for it;
//   - goroutines and open files back to their level before the sessions,
//     the live heap flat across the run;
//   - every account, its credentials (the refresh token the sim holds
//     now: rotations were committed), the client key and every thread's
//     binding still there, bindings on the account that last answered;
//   - every penalty an account got matches a fault the sim gave that
//     account, and no spent refresh token was ever replayed.

// soakDefaults are the soak's workload where its flags are not given: a
// short paced answer (20 deltas 25 ms apart), 1,000 sessions.
const (
	soakSessions     = 1000
	soakWords        = 60
	soakDeltas       = 20
	soakPace         = 25 * time.Millisecond
	soakTurnDeadline = 60 * time.Second
	// soakStallDeadline is the relay's stream idle timeout in the soak: a
	// stalled upstream answer ends (and fails over) after it.
	soakStallDeadline = 3 * time.Second
	// soakLaneIdle closes the relay's idle upstream lanes soon after the
	// sessions end, so the resources can be seen to come back.
	soakLaneIdle = 2 * time.Second
	// soakUsageReset is when an account's usage limit resets.
	soakUsageReset = 5 * time.Second
	// soakLaneAge is the age at which the sim retires the upstream
	// WebSocket connections the age fault picks (soakAgeRate of them).
	soakLaneAge = 4 * time.Second
	soakAgeRate = 0.25
)

// soakAccounts is the pool for sessions: what their lanes need, and room
// for the accounts a fault takes out for a while.
func soakAccounts(sessions int) int {
	return (sessions+relayLanesPerAccount-1)/relayLanesPerAccount + 8
}

// soakFault is one kind of upstream fault and its share of the fault rate.
type soakFault struct {
	name  string
	share float64
	fault sim.Fault
}

// soakFaultMix is what the sim does to the requests it meets with a
// fault: usage limits (reset in seconds; few, or every account would be
// out half the time and every thread moving), 5xx before the stream, 401
// (the relay refreshes and rotates the refresh token), streams cut,
// stalled or failed before and after output. The shares add up to 1.
var soakFaultMix = []soakFault{
	{"usage_limit", 0.06, sim.Fault{Kind: sim.FaultUsageLimit, ResetsIn: sim.Duration(soakUsageReset)}},
	{"500", 0.09, sim.Fault{Kind: sim.FaultServerError, Status: 500}},
	{"502", 0.09, sim.Fault{Kind: sim.FaultServerError, Status: 502}},
	{"503", 0.09, sim.Fault{Kind: sim.FaultServerError, Status: 503}},
	{"overloaded", 0.08, sim.Fault{Kind: sim.FaultOverloaded}},
	{"unauthorized", 0.08, sim.Fault{Kind: sim.FaultUnauthorized}},
	{"cut_before_output", 0.12, sim.Fault{Kind: sim.FaultCutStream, Events: 2}},
	{"cut_after_output", 0.12, sim.Fault{Kind: sim.FaultCutStream, Events: 12}},
	{"stall_before_output", 0.06, sim.Fault{Kind: sim.FaultStall, Events: 2}},
	{"stall_after_output", 0.06, sim.Fault{Kind: sim.FaultStall, Events: 12}},
	{"failed_before_output", 0.05, sim.Fault{Kind: sim.FaultOverloaded, InStream: true}},
	{"failed_after_output", 0.10, sim.Fault{Kind: sim.FaultServerError, InStream: true, Events: 12}},
}

// penaltyCauses are the faults that may put an account in each status: a
// penalty with none of them fired on that account is a wrong one.
var penaltyCauses = map[store.Status][]sim.FaultKind{
	store.StatusRateLimited:    {sim.FaultUsageLimit, sim.FaultSharingCap, sim.FaultRateLimit, sim.FaultForbidden},
	store.StatusQuotaExceeded:  {sim.FaultInsufficientQuota, sim.FaultPaymentRequired},
	store.StatusReauthRequired: {sim.FaultUnauthorized},
}

// How a soak turn ended.
const (
	soakCompleted = "completed"
	soakFailed    = "failed"   // a terminal event or error answer Codex handles
	soakVanished  = "vanished" // the client hung up on purpose
	soakHung      = "hung"     // the turn passed its deadline: a violation
	soakBroken    = "broken"   // the answer stopped without a terminal event, or was unreadable: a violation
)

// soakReport is what a soak did and what its checks found.
type soakReport struct {
	Seconds         float64 `json:"seconds"`
	Sessions        int     `json:"sessions"` // slots running at once
	SessionsRun     int     `json:"sessions_run"`
	Accounts        int     `json:"accounts"`
	FaultRate       float64 `json:"fault_rate"`
	ClientFaultRate float64 `json:"client_fault_rate"`
	Database        string  `json:"database"`
	CPUs            int     `json:"cpus"`
	GoVersion       string  `json:"go_version"`

	// Turns by how they ended, and the failures by their code.
	Turns       map[string]int `json:"turns"`
	Failures    map[string]int `json:"failures"`
	SlowTurns   int            `json:"slow_turns"`
	MaxTurnMs   float64        `json:"max_turn_ms"`
	DeadlineMs  float64        `json:"turn_deadline_ms"`
	Requests    int            `json:"requests"`     // sent by the clients, prewarms included
	LoggedRows  int            `json:"logged_rows"`  // in the relay's request log
	SimRequests int            `json:"sim_requests"` // response requests the sim answered
	Recoveries  map[string]int `json:"recoveries"`   // logged rows by recovery
	Attempts    map[string]int `json:"attempts"`     // the relay's attempts by class
	// Faults the sim fired, by kind (handshake age limits included).
	Faults    map[string]int `json:"faults"`
	Penalties []soakPenalty  `json:"penalties"`
	// Usage the request log settled and the sim reported, in total.
	LoggedUsage   soakUsage `json:"logged_usage"`
	UpstreamUsage soakUsage `json:"upstream_usage"`
	// Undelivered is the part of UpstreamUsage the sim counted for
	// responses whose completion it could not write (their client had
	// gone): no relay can log it, and the check leaves it out.
	Undelivered soakUsage `json:"undelivered_usage"`
	// Threads whose bindings were checked.
	BindingsChecked int `json:"bindings_checked"`
	Refreshes       int `json:"refreshes"`

	Memory      []soakMemSample `json:"memory"`
	Goroutines  [2]int          `json:"goroutines"` // before the sessions, after them
	OpenSockets [2]int          `json:"open_sockets"`

	// Violations lists what the checks found, up to soakExamples of each
	// kind; ViolationsByKind counts every one, past that cap too.
	Violations       []string       `json:"violations"`
	ViolationsByKind map[string]int `json:"violations_by_kind"`
}

// soakPenalty is one status an account was put in during the soak.
type soakPenalty struct {
	Account string    `json:"account"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	Cause   string    `json:"cause,omitempty"` // the fault that explains it; "" when none does
}

// soakUsage sums token counts.
type soakUsage struct {
	Input     int64 `json:"input"`
	Cached    int64 `json:"cached"`
	Output    int64 `json:"output"`
	Reasoning int64 `json:"reasoning"`
	Total     int64 `json:"total"`
}

// minus is u less v.
func (u soakUsage) minus(v soakUsage) soakUsage {
	return soakUsage{Input: u.Input - v.Input, Cached: u.Cached - v.Cached, Output: u.Output - v.Output, Reasoning: u.Reasoning - v.Reasoning, Total: u.Total - v.Total}
}

func (u *soakUsage) add(v soakUsage) {
	u.Input += v.Input
	u.Cached += v.Cached
	u.Output += v.Output
	u.Reasoning += v.Reasoning
	u.Total += v.Total
}

// soakMemSample is the process at one moment of the soak.
type soakMemSample struct {
	Second     float64 `json:"second"`
	LiveHeap   int64   `json:"live_heap_bytes"` // as of the last collection
	RSS        int64   `json:"rss_bytes"`
	Goroutines int     `json:"goroutines"`
}

// soakSession is what the clients know of one session.
type soakSession struct {
	id        string
	transport string
	requests  int // sent, prewarms included
	completed int
	last      string // how its last turn ended
}

// firedFault is one fault the sim gave: what penaltyCause needs of its
// record, and no more (a soak keeps every one; a whole sim.Record is about
// 700 bytes).
type firedFault struct {
	Time    time.Time
	Account string
	Fault   sim.FaultKind
}

// soakRun is one soak's shared state. The counters are guarded by mu.
type soakRun struct {
	env   *benchEnv
	o     options
	start time.Time

	closeIdle        func()
	goroutinesBefore map[string]int

	mu         sync.Mutex
	sessions   []*soakSession
	turns      map[string]int
	failures   map[string]int
	slow       int
	maxTurn    time.Duration
	violations []string
	byKind     map[string]int        // every violation, by kind
	upstream   map[string]*soakUsage // by prompt_cache_key (the session)
	simReqs    map[string]int        // by prompt_cache_key
	fired      []firedFault          // the faults the sim gave, as they went
	faults     map[string]int
	penalties  []soakPenalty
}

// soakExamples is how many violations of each kind the report lists: a
// kind that fires on every session must not hide the others.
const soakExamples = 20

// violate notes a violation of kind (a short name of the check).
func (r *soakRun) violate(kind, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violateLocked(kind, format, args...)
}

func (r *soakRun) violateLocked(kind, format string, args ...any) {
	if r.byKind == nil {
		r.byKind = map[string]int{}
	}
	r.byKind[kind]++
	if r.byKind[kind] <= soakExamples {
		r.violations = append(r.violations, kind+": "+fmt.Sprintf(format, args...))
	}
}

// soak runs the -soak workload and its checks.
func soak(ctx context.Context, o options, log *slog.Logger) (soakReport, error) {
	rep := soakReport{Sessions: o.conversations, Accounts: o.accounts, FaultRate: o.faultRate, ClientFaultRate: o.clientFaultRate,
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), DeadlineMs: ms(o.turnTimeout)}
	env, stopEnv, err := startEnv(ctx, o, log)
	defer stopEnv()
	if err != nil {
		return rep, err
	}
	rep.Database = env.database
	url, stopRelay, err := env.startRelay(ctx, "pooled")
	if err != nil {
		return rep, err
	}
	relayStopped := false
	defer func() {
		if !relayStopped {
			stopRelay()
		}
	}()
	target := benchTarget{name: targetRelay, base: url + "/backend-api/codex", header: func(int) http.Header {
		return http.Header{"Authorization": {"Bearer " + env.key}}
	}}
	r := &soakRun{env: env, o: o, turns: map[string]int{}, failures: map[string]int{}, upstream: map[string]*soakUsage{},
		simReqs: map[string]int{}, faults: map[string]int{}}

	client := benchClient(o.conversations, &wireCounter{})
	defer client.CloseIdleConnections()
	// Idle kept-alive HTTP connections (the clients' to the relay, the
	// relay's to the sim) are pools kept for reuse, not leaks: closed
	// before resources are counted.
	r.closeIdle = func() {
		client.CloseIdleConnections()
		env.relay.CloseIdleConnections()
	}
	// A warm-up turn on each transport opens what the relay keeps for good
	// (database connections, its upstream HTTP connection); then the lanes
	// close, and the level everything must come back to is read.
	for i, transport := range []string{"ws", "http"} {
		s := r.newSession(transport)
		r.session(ctx, client, target, i, s, time.Time{})
	}
	if v, _ := r.takeViolations(); len(v) > 0 {
		return rep, fmt.Errorf("soak: the warm-up failed: %s", v[0])
	}
	warmup := 0
	for _, s := range r.sessions {
		warmup += s.requests
	}
	r.sessions, r.turns = nil, map[string]int{}
	r.drainSim()
	rep.Goroutines[0], rep.OpenSockets[0] = r.quiesce(ctx, 0, 0)
	r.goroutinesBefore = goroutineSites()

	for _, f := range soakFaultMix {
		if o.faultRate == 0 {
			break // a fault of rate 0 would fire on every request
		}
		f.fault.Rate = o.faultRate * f.share
		if _, err := env.upstream.AddFault(f.fault); err != nil {
			return rep, fmt.Errorf("soak: fault %s: %w", f.name, err)
		}
	}
	if o.faultRate > 0 {
		if _, err := env.upstream.AddFault(sim.Fault{Kind: sim.FaultWebSocketMaxAge, MaxAge: sim.Duration(soakLaneAge), Rate: soakAgeRate}); err != nil {
			return rep, fmt.Errorf("soak: fault websocket_max_age: %w", err)
		}
	}

	// The watchers: the sim's finished records, the accounts' statuses,
	// the process's memory. They end with watchCtx.
	r.start = time.Now() // before they start: they read it
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchers sync.WaitGroup
	watchers.Go(func() { r.every(watchCtx, 250*time.Millisecond, r.drainSim) })
	watchers.Go(func() { r.watchAccounts(watchCtx) })
	var samples []soakMemSample
	watchers.Go(func() {
		r.every(watchCtx, time.Second, func() {
			samples = append(samples, soakMemSample{Second: time.Since(r.start).Seconds(), LiveHeap: liveHeap(), RSS: readRSS(), Goroutines: runtime.NumGoroutine()})
		})
	})

	if o.busyProfile != "" {
		// Heap profiles at two fifths and at the end of the run, for
		// go tool pprof -diff_base: what the live heap grew by between.
		for _, at := range []struct {
			name string
			frac float64
		}{{"-mid", 0.4}, {"-end", 0.98}} {
			watchers.Go(func() {
				if sleepCtx(watchCtx, time.Duration(float64(o.soak)*at.frac)) {
					runtime.GC()
					if err := writeHeapProfile(o.busyProfile + at.name); err != nil {
						r.violate("profile", "%v", err)
					}
				}
			})
		}
	}
	end := r.start.Add(o.soak)
	ramp := min(10*time.Second, o.soak/5)
	var slots sync.WaitGroup
	for slot := range o.conversations {
		slots.Go(func() {
			if !sleepCtx(ctx, ramp*time.Duration(slot)/time.Duration(o.conversations)) {
				return
			}
			transport := []string{"ws", "http"}[slot%2]
			for time.Now().Before(end) && ctx.Err() == nil {
				r.session(ctx, client, target, slot, r.newSession(transport), end)
			}
		})
	}
	slots.Wait()
	rep.Seconds = time.Since(r.start).Seconds()
	client.CloseIdleConnections()
	if err := ctx.Err(); err != nil {
		stopWatch()
		watchers.Wait()
		return rep, err
	}
	env.upstream.ClearFaults()

	// Every request's log row is written when it ends: wait for them all.
	sent := 0
	for _, s := range r.sessions {
		sent += s.requests
	}
	rep.LoggedRows = r.waitLogged(ctx, warmup+sent) - warmup
	stopWatch()
	watchers.Wait()
	r.drainSim()
	rep.Goroutines[1], rep.OpenSockets[1] = r.quiesce(ctx, rep.Goroutines[0], rep.OpenSockets[0])
	rep.Memory = samples
	rep.Requests = sent
	rep.SessionsRun = len(r.sessions)

	r.checkResources(rep)
	r.checkMemory(samples)
	if err := r.checkLog(ctx, &rep); err != nil {
		return rep, err
	}
	if err := r.checkRows(ctx, &rep); err != nil {
		return rep, err
	}
	r.checkPenalties(&rep)
	if err := r.checkFinalTurn(ctx, client, target); err != nil {
		return rep, err
	}
	stopRelay()
	relayStopped = true

	rep.Turns, rep.Failures, rep.SlowTurns, rep.MaxTurnMs = r.turns, r.failures, r.slow, ms(r.maxTurn)
	rep.Faults = r.faults
	for _, n := range r.simReqs {
		rep.SimRequests += n
	}
	rep.Violations, rep.ViolationsByKind = r.takeViolations()
	return rep, nil
}

// takeViolations returns the violations noted so far and their counts by
// kind, and starts again from none.
func (r *soakRun) takeViolations() ([]string, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, n := r.violations, r.byKind
	r.violations, r.byKind = nil, nil
	return v, n
}

func (r *soakRun) newSession(transport string) *soakSession {
	s := &soakSession{id: store.NewID("soak", time.Now()), transport: transport}
	r.mu.Lock()
	r.sessions = append(r.sessions, s)
	r.mu.Unlock()
	return s
}

// every calls f every period until ctx ends.
func (r *soakRun) every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// soakBehaviour is how a client treats one turn.
type soakBehaviour struct {
	slow        bool // a pause after every event it reads
	vanishAfter int  // > 0: hang up after reading this many events
}

func (r *soakRun) behaviour(faults bool) soakBehaviour {
	if !faults {
		return soakBehaviour{}
	}
	switch x := rand.Float64(); {
	case x < r.o.clientFaultRate/2 || !r.o.clientHangups && x < r.o.clientFaultRate:
		return soakBehaviour{slow: true}
	case x < r.o.clientFaultRate:
		return soakBehaviour{vanishAfter: 1 + rand.IntN(16)}
	}
	return soakBehaviour{}
}

// soakTurn is how one turn ended.
type soakTurn struct {
	outcome  string
	detail   string // the failure's code, or what broke
	output   bool   // output text reached the client before the end
	response string // the response id of a completed turn
	items    []any  // its output items (HTTP)
}

// session runs one session: a WebSocket (with Codex's prewarm when
// -prewarm) or HTTP turns, 3 to 10 of them with a user's pause between,
// until a turn ends it or end passes (a zero end: one turn, without
// pauses or client faults).
func (r *soakRun) session(ctx context.Context, client *http.Client, target benchTarget, slot int, s *soakSession, end time.Time) {
	o := r.o
	faults := !end.IsZero()
	b := &benchConversation{client: client, target: target, conv: slot, o: o, session: s.id}
	turns := 1
	if faults {
		turns = 3 + rand.IntN(8)
	}
	var conn *websocket.Conn
	if s.transport == "ws" {
		var err error
		if conn, err = b.dial(ctx); err != nil {
			if ctx.Err() == nil {
				r.violate("dial", "session %s: %v", s.id, err)
			}
			return
		}
		defer conn.CloseNow()
	}
	var previous string
	var history []any
	for turn := range turns {
		if turn > 0 && (!sleepCtx(ctx, time.Duration(500+rand.IntN(2500))*time.Millisecond) || time.Now().After(end)) {
			break
		}
		if turn == 0 && conn != nil && o.prewarm {
			t := r.turn(ctx, s, "prewarm", soakBehaviour{}, func(tctx context.Context) soakTurn {
				return soakWSTurn(tctx, conn, map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "store": false,
					"prompt_cache_key": s.id, "generate": false, "input": []any{}}, soakBehaviour{})
			})
			if t.outcome != soakCompleted {
				return
			}
			previous = t.response
		}
		be := r.behaviour(faults)
		var t soakTurn
		if conn != nil {
			msg := map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "store": false,
				"prompt_cache_key": s.id, "input": []any{b.prompt(turn)}}
			if previous != "" {
				msg["previous_response_id"] = previous
			}
			t = r.turn(ctx, s, "turn", be, func(tctx context.Context) soakTurn { return soakWSTurn(tctx, conn, msg, be) })
		} else {
			history = append(history, b.prompt(turn))
			body, _ := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false,
				"prompt_cache_key": s.id, "input": history})
			t = r.turn(ctx, s, "turn", be, func(tctx context.Context) soakTurn { return soakHTTPTurn(tctx, b, body, be) })
		}
		switch t.outcome {
		case soakCompleted:
			previous = t.response
			history = append(history, t.items...)
		case soakFailed:
			// Codex keeps the thread and sends the next turn; the failed
			// answer is not part of it.
		default:
			return // vanished, or a violation already noted
		}
	}
	if conn != nil {
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}

// turn runs one request under the soak's turn deadline and records how it
// ended.
func (r *soakRun) turn(ctx context.Context, s *soakSession, what string, be soakBehaviour, do func(context.Context) soakTurn) soakTurn {
	// The deadline is the turn's own: the soak's end lets turns finish.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.turnTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel) // but an interrupt ends them
	defer stop()
	start := time.Now()
	r.mu.Lock()
	s.requests++
	r.mu.Unlock()
	t := do(tctx)
	took := time.Since(start)
	if t.outcome == soakHung && ctx.Err() != nil {
		t.outcome = soakVanished // interrupted, not hung
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.turns[t.outcome]++
	s.last = strings.TrimSuffix(t.outcome+": "+t.detail, ": ")
	r.maxTurn = max(r.maxTurn, took)
	if be.slow {
		r.slow++
	}
	switch t.outcome {
	case soakCompleted:
		s.completed++
	case soakFailed:
		when := "before output: "
		if t.output {
			when = "after output: "
		}
		r.failures[when+t.detail]++
	case soakHung, soakBroken:
		r.violateLocked("turn "+t.outcome, "%s %s of session %s after %s: %s", s.transport, what, s.id, took.Round(time.Millisecond), t.detail)
	}
	return t
}

// soakWSTurn sends msg and reads its answer to the end.
func soakWSTurn(ctx context.Context, conn *websocket.Conn, msg map[string]any, be soakBehaviour) soakTurn {
	data, err := json.Marshal(msg)
	if err != nil {
		return soakTurn{outcome: soakBroken, detail: err.Error()}
	}
	if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
		return soakReadError(ctx, "write: "+err.Error())
	}
	output := false
	for n := 0; ; n++ {
		if be.vanishAfter > 0 && n == be.vanishAfter {
			conn.CloseNow()
			return soakTurn{outcome: soakVanished}
		}
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return soakReadError(ctx, err.Error())
		}
		t, done := soakEvent(frame)
		if done {
			t.output = t.output || output
			return t
		}
		output = output || t.output
		if be.slow {
			sleepCtx(ctx, 40*time.Millisecond)
		}
	}
}

// soakHTTPTurn posts body and reads the answer to the end.
func soakHTTPTurn(ctx context.Context, b *benchConversation, body []byte, be soakBehaviour) soakTurn {
	rctx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	var conn httptrace.GotConnInfo
	rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conn = i }})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, b.target.base+"/responses", bytes.NewReader(body))
	if err != nil {
		return soakTurn{outcome: soakBroken, detail: err.Error()}
	}
	req.Header = b.headers()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := b.client.Do(req)
	if err != nil {
		if conn.Reused {
			return soakReadError(ctx, fmt.Sprintf("%v (on a kept-alive connection idle for %s)", err, conn.IdleTime.Round(time.Millisecond)))
		}
		return soakReadError(ctx, err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
		var e struct {
			Error *wire.Error `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error == nil {
			return soakTurn{outcome: soakBroken, detail: fmt.Sprintf("HTTP %d without a JSON error: %s", resp.StatusCode, clipText(string(raw), 200))}
		}
		return soakTurn{outcome: soakFailed, detail: fmt.Sprintf("http_%d:%s", resp.StatusCode, cmp.Or(e.Error.Code, e.Error.Type))}
	}
	events := wire.NewSSEReader(resp.Body, 0, 0)
	output := false
	for n := 0; ; n++ {
		if be.vanishAfter > 0 && n == be.vanishAfter {
			hangUp()
			return soakTurn{outcome: soakVanished}
		}
		ev, err := events.Next()
		if err != nil {
			return soakReadError(ctx, "stream ended before a terminal event: "+err.Error())
		}
		t, done := soakEvent(ev.Data)
		output = output || t.output
		if done {
			t.output = output
			if t.outcome == soakCompleted {
				var done struct {
					Response struct {
						Output []any `json:"output"`
					} `json:"response"`
				}
				if json.Unmarshal(ev.Data, &done) == nil {
					t.items = done.Response.Output
				}
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			}
			return t
		}
		if be.slow {
			sleepCtx(ctx, 40*time.Millisecond)
		}
	}
}

// soakReadError is a turn whose connection failed: hung when its deadline
// passed, broken otherwise.
func soakReadError(ctx context.Context, detail string) soakTurn {
	if ctx.Err() != nil {
		return soakTurn{outcome: soakHung, detail: detail}
	}
	return soakTurn{outcome: soakBroken, detail: detail}
}

// soakEvent reads one event: a terminal one ends the turn.
func soakEvent(data []byte) (soakTurn, bool) {
	typ, ok := wire.EventType(data)
	if !ok {
		return soakTurn{outcome: soakBroken, detail: "an event that is not JSON: " + clipText(string(data), 200)}, true
	}
	var ev struct {
		Status   int         `json:"status"`
		Error    *wire.Error `json:"error"`
		Response struct {
			ID    string      `json:"id"`
			Error *wire.Error `json:"error"`
		} `json:"response"`
	}
	switch typ {
	case "response.output_text.delta":
		return soakTurn{output: true}, false
	case "response.completed":
		if json.Unmarshal(data, &ev) != nil || ev.Response.ID == "" {
			return soakTurn{outcome: soakBroken, detail: "response.completed without a response id"}, true
		}
		return soakTurn{outcome: soakCompleted, response: ev.Response.ID}, true
	case "response.failed", "response.incomplete", "error":
		_ = json.Unmarshal(data, &ev)
		e := cmp.Or(ev.Error, ev.Response.Error, &wire.Error{})
		return soakTurn{outcome: soakFailed, detail: typ + ":" + cmp.Or(e.Code, e.Type, "no_code")}, true
	}
	return soakTurn{}, false
}

// drainSim takes the sim's finished records into the soak's sums.
func (r *soakRun) drainSim() {
	recs := r.env.upstream.TakeFinished()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range recs {
		if rec.Fault != "" {
			r.faults[string(rec.Fault)]++
			r.fired = append(r.fired, firedFault{Time: rec.Time, Account: rec.Account, Fault: rec.Fault})
		}
		if rec.Route != sim.RouteResponses || rec.Kind == sim.RecordHandshake || rec.PromptCacheKey == "" {
			continue
		}
		r.simReqs[rec.PromptCacheKey]++
		if u := rec.Usage; u != nil {
			sum := r.upstream[rec.PromptCacheKey]
			if sum == nil {
				sum = &soakUsage{}
				r.upstream[rec.PromptCacheKey] = sum
			}
			sum.add(soakUsage{Input: u.InputTokens, Cached: u.CachedTokens, Output: u.OutputTokens, Reasoning: u.ReasoningTokens, Total: u.TotalTokens})
		}
	}
}

// watchAccounts notes every status an account is put in.
func (r *soakRun) watchAccounts(ctx context.Context) {
	seen := map[string]time.Time{}
	r.every(ctx, 200*time.Millisecond, func() {
		accts, err := r.env.store.Accounts(ctx)
		if err != nil {
			return
		}
		for _, a := range accts {
			if a.Status == store.StatusActive || !a.StatusChangedAt.After(r.start) || seen[a.ID].Equal(a.StatusChangedAt) {
				continue
			}
			seen[a.ID] = a.StatusChangedAt
			r.mu.Lock()
			r.penalties = append(r.penalties, soakPenalty{Account: a.ID, Status: string(a.Status), Reason: a.StatusReason, At: a.StatusChangedAt})
			r.mu.Unlock()
		}
	})
}

// quiesce waits until the goroutines and open files are back at most at
// the given levels (0: for them to settle) and returns them.
func (r *soakRun) quiesce(ctx context.Context, goroutines, files int) (int, int) {
	deadline := time.Now().Add(soakLaneIdle + 20*time.Second)
	if goroutines == 0 && !sleepCtx(ctx, soakLaneIdle+time.Second) {
		// The lanes of the warm-up close when idle: let them.
		return 0, 0
	}
	last, lastFiles, steady := -1, -1, 0
	for {
		r.closeIdle()
		g, f := runtime.NumGoroutine(), openSockets()
		if r.env.store.Dialect() == store.Postgres {
			f -= r.env.store.OpenConnections() // the database pool's, kept for reuse
		}
		if goroutines > 0 && g <= goroutines && f <= files {
			return g, f
		}
		if goroutines == 0 {
			if g == last && f == lastFiles {
				steady++
			} else {
				steady = 0
			}
			if steady >= 5 {
				return g, f
			}
		}
		last, lastFiles = g, f
		if time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return g, f
		}
	}
}
