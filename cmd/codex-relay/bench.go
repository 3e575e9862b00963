package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

const benchPurpose = `Measure what the relay adds, against the physical limit. The same conversations run
against three targets in turn, each in its own phase: straight to the simulated upstream
(direct), through a plain byte-copying TCP proxy in front of it (pipe: accept, dial, two
io.Copy goroutines, nothing parsed), and through the relay (on SQLite in a temp folder,
or -database-url), over HTTP/SSE and over WebSocket, the way Codex sends them (HTTP
resends the whole history on kept-alive connections; WebSocket keeps one connection per
session, offers permessage-deflate with context takeover, and chains turns with
previous_response_id).

The report puts direct, pipe and relay side by side, with relay against pipe: CPU per
forwarded event (the process's user+system time over each phase, from getrusage,
divided by the events the clients received; "over direct" subtracts the direct phase's
figure, since the process also runs the clients and the sim), events/s, time to first
event and to first output token (the first response.output_text.delta) p50/p99, peak
memory per session, and allocations. -paced gives token pace (208 events of about 40 B
of text per response, 20 ms apart); -idle N measures memory per idle session instead;
-burst starts every session's first turn at the same instant. Everything runs in this
process on loopback: nothing leaves the machine. On a machine shared with other work,
take two runs.`

// relayLanesPerAccount is the relay's cap on open upstream lanes per
// account (bridge.PoolConfig's default, which serve keeps): a session
// holds a lane, so more sessions than accounts x this would queue.
const relayLanesPerAccount = 64

// The bench's targets, in the order they run.
const (
	targetDirect = "direct"
	targetPipe   = "pipe"
	targetRelay  = "relay"
)

// The token pace that -paced stands for: the performance issue's shape,
// 199 output_text.delta events of about 40 B of text (1270 words of the
// sim's vocabulary, 6.3 B a word) and 9 other events, 208 over HTTP (210
// over WebSocket, which adds the rate limits and turn state as events),
// 20 ms apart.
const (
	pacedWords  = 1270
	pacedDeltas = 199
	pacedGap    = 20 * time.Millisecond
)

// benchOptions is one bench run's workload.
type benchOptions struct {
	conversations int // sessions run at once
	turns         int
	words         int
	deltas        int           // output_text.delta events per answer; 0: the sim's default
	pace          time.Duration // between a response's events; 0: unpaced
	ramp          time.Duration // sessions start spread over this long
	burst         bool          // every first turn starts at one instant
	idle          int           // > 0: the idle-sessions mode with this many sessions
	idleHold      time.Duration
	idleProfile   string // a heap profile written while the last target's idle sessions are held
	busyProfile   string // a heap profile written while the last target's sessions are mid-turn
	accounts      int
	transports    []string
	targets       []string
	clientDeflate bool
	prewarm       bool // WebSocket sessions send Codex's generate:false request first
	// compressions are the relay's answers to the clients' deflate offer:
	// the relay target runs once with each. upstreamCompression is what
	// its upstream lanes offer; simCompression how the sim answers.
	compressions        []relay.CompressionMode
	upstreamCompression relay.CompressionMode
	simCompression      string
	turnTimeout         time.Duration
	databaseURL         string // "" for a SQLite file in a temp folder
	// soak > 0 runs the soak (bench_soak.go) for that long instead of the
	// phases, with faultRate of the upstream requests and clientFaultRate
	// of the client turns meeting a fault.
	soak            time.Duration
	faultRate       float64
	clientFaultRate float64
	clientHangups   bool
	// cacheThreads bounds the relay's continuity cache (and its owner
	// index, 20 ids a thread) in a soak; 0: the relay's defaults.
	cacheThreads int
	// hostile runs the hostile clients mode (bench_hostile.go) instead.
	hostile hostileOptions
}

func runBench(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "bench", benchPurpose)
	var o benchOptions
	fs.IntVar(&o.conversations, "conversations", 32, "sessions (conversations) run at once, each on its own connection")
	fs.IntVar(&o.turns, "turns", 5, "turns in every session, one after another on the same session")
	fs.IntVar(&o.words, "words", 40, "words in every answer")
	fs.IntVar(&o.deltas, "deltas", 0, "output_text.delta events every answer is streamed in (the sim's [[sim:events N]]); 0: the sim's default, one a word up to 16")
	fs.DurationVar(&o.pace, "pace", 0, "time between a response's events, as a model streams tokens (the sim's [[sim:gap]]); 0: unpaced, as fast as the path goes")
	paced := fs.Bool("paced", false, fmt.Sprintf("token pace, the performance issue's shape: -words %d -deltas %d -pace %s (208 events of about 40 B of text per response over HTTP, 210 over WebSocket), for those of them not given", pacedWords, pacedDeltas, pacedGap))
	fs.DurationVar(&o.ramp, "ramp", 0, "start the sessions spread evenly over this long (0: all at once, each as soon as it is connected)")
	fs.BoolVar(&o.burst, "burst", false, "connect every session first, then start all first turns at the same instant (all new threads at once)")
	fs.IntVar(&o.idle, "idle", 0, "instead of the turn workload, open this many WebSocket sessions on each target (one turn each, then held open idle with their upstream lanes) and report memory per session")
	fs.DurationVar(&o.idleHold, "idle-hold", 2*time.Second, "with -idle: how long the idle sessions stay open before memory is read")
	fs.StringVar(&o.idleProfile, "idleprofile", "", "with -idle: write a heap profile (memory in use) to this file while the last target's sessions are held open (go tool pprof -sample_index inuse_space)")
	fs.StringVar(&o.busyProfile, "busyprofile", "", "write a heap profile (memory in use, after a collection) to this file while the last target's sessions are mid-turn: 1s after the -ramp, in the last transport's phase (go tool pprof -sample_index inuse_space); every goroutine's stack goes beside it, in FILE.goroutines; with -soak: FILE-mid and FILE-end, at two fifths and at the end of the run (go tool pprof -diff_base FILE-mid FILE-end: what the live heap grew by). The collection and the writing count in that phase's CPU figures: take the CPU from another run")
	fs.IntVar(&o.accounts, "accounts", 4, fmt.Sprintf("simulated accounts in the relay's pool (the relay opens at most %d lanes per account: give at least sessions/%d)", relayLanesPerAccount, relayLanesPerAccount))
	transports := fs.String("transport", "http,ws", "transports to measure: http, ws, or both comma-separated")
	targets := fs.String("targets", "direct,pipe,relay", "targets to measure, comma-separated: direct, pipe, relay (the CPU over direct and the ratios need all three)")
	fs.BoolVar(&o.clientDeflate, "client-deflate", true, "WebSocket clients offer permessage-deflate with context takeover, as Codex does by default")
	fs.BoolVar(&o.prewarm, "prewarm", false, "WebSocket sessions send a prewarm response.create (generate:false) as soon as they connect and chain the first turn to it, as Codex does; with -burst, before the burst")
	compressions := fs.String("compression", string(relay.CompressionPooled), "how the relay answers the WebSocket clients' permessage-deflate offer (CODEX_RELAY_WS_COMPRESSION): pooled, takeover or off; several comma-separated run the relay target once with each, side by side")
	upstreamCompression := fs.String("upstream-compression", string(relay.CompressionPooled), "what the relay's upstream WebSockets offer (CODEX_RELAY_UPSTREAM_WS_COMPRESSION): pooled, takeover or off")
	fs.StringVar(&o.simCompression, "sim-compression", "pooled", "how the simulated upstream answers a deflate offer (the clients' on direct and pipe, the relay's): pooled, takeover or off")
	fs.DurationVar(&o.turnTimeout, "turn-timeout", 30*time.Second, "deadline of one turn")
	fs.StringVar(&o.databaseURL, "database-url", "", "an empty database to run the relay on, e.g. a throwaway postgres://... (default: SQLite in a temp folder); a database holding accounts is refused")
	fs.DurationVar(&o.soak, "soak", 0, fmt.Sprintf("instead of the phases, soak the relay this long (e.g. 10m): -conversations sessions (default %d) over both transports, one after another in each slot, with faults on both sides, then check that nothing was lost (every turn ended, every request logged with the upstream's usage, resources back, rows intact, no wrong penalty); exits non-zero on a violation", soakSessions))
	fs.Float64Var(&o.faultRate, "fault-rate", 0.05, "with -soak: the share of upstream response requests the sim meets with a fault (usage limits, 5xx, 401, cut, stalled and failed streams), and a quarter of the upstream WebSockets reach an age limit")
	fs.Float64Var(&o.clientFaultRate, "client-fault-rate", 0.04, "with -soak: the share of client turns read slowly or hung up on mid-answer")
	fs.IntVar(&o.cacheThreads, "cache-threads", 0, "with -soak: bound the relay's continuity cache to this many threads and its owner index to 20 ids a thread (default: the relay's own, 10,000 threads and 200,000 ids), so a short run fills them and its memory check sees the plateau behind them")
	fs.BoolVar(&o.clientHangups, "client-hangups", true, "with -soak: half the client faults are hang-ups mid-answer (false: every one is a slow reader)")
	hostileFlags(fs, &o.hostile)
	asJSON := fs.Bool("json", false, "print the report as JSON, with every figure")
	logLevel := fs.String("log-level", "error", "relay log level: debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file; samples carry the label component=client, sim, pipe or relay (go tool pprof -tagfocus component=relay)")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index alloc_space)")
	mutexProfile := fs.String("mutexprofile", "", "write a mutex contention profile of the whole run to this file")
	blockProfile := fs.String("blockprofile", "", "write a blocking profile of the whole run to this file")
	tracePath := fs.String("trace", "", "write an execution trace of the whole run to this file: where goroutines waited for the network, a system call or a CPU, which the block profile does not show (go tool trace -pprof=net, sync, syscall or sched FILE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if o.soak > 0 {
		o.soakDefaults(given)
	}
	if *paced {
		if !given["words"] {
			o.words = pacedWords
		}
		if !given["deltas"] {
			o.deltas = pacedDeltas
		}
		if !given["pace"] {
			o.pace = pacedGap
		}
	}
	var err error
	if o.transports, err = benchList("-transport", *transports, "http", "ws"); err != nil {
		return err
	}
	if o.targets, err = benchList("-targets", *targets, targetDirect, targetPipe, targetRelay); err != nil {
		return err
	}
	modes, err := benchList("-compression", *compressions, string(relay.CompressionPooled), string(relay.CompressionTakeover), string(relay.CompressionOff))
	if err != nil {
		return err
	}
	for _, m := range modes {
		o.compressions = append(o.compressions, relay.CompressionMode(m))
	}
	if _, err := benchList("-upstream-compression", *upstreamCompression, string(relay.CompressionPooled), string(relay.CompressionTakeover), string(relay.CompressionOff)); err != nil {
		return err
	}
	o.upstreamCompression = relay.CompressionMode(*upstreamCompression)
	if _, err := benchList("-sim-compression", o.simCompression, "pooled", "takeover", "off"); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	log, err := newLogger(c.stderr, "text", *logLevel)
	if err != nil {
		return err
	}
	if o.hostile.on {
		return runHostile(ctx, c, fs, o, log, *asJSON)
	}
	if o.idleProfile != "" && o.idle == 0 {
		return errors.New("bench: -idleprofile needs -idle")
	}
	if o.busyProfile != "" && o.idle > 0 {
		return errors.New("bench: -busyprofile is for the turn workload or -soak, not -idle")
	}
	stopProfiles, err := startProfiles(*cpuProfile, *memProfile, *mutexProfile, *blockProfile, *tracePath, o.idleProfile != "" || o.busyProfile != "")
	if err != nil {
		return err
	}
	if o.soak > 0 {
		rep, err := soak(ctx, c, o, log)
		if perr := stopProfiles(); err == nil {
			err = perr
		}
		if err != nil {
			return err
		}
		if err := writeReport(c, *asJSON, rep, printSoak); err != nil {
			return err
		}
		if len(rep.Violations) > 0 {
			return errSoakViolations
		}
		return nil
	}
	rep, err := bench(ctx, c, o, log)
	if perr := stopProfiles(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	return writeReport(c, *asJSON, rep, printBench)
}

// writeReport prints a report as indented JSON, or as text.
func writeReport[R any](c cli, asJSON bool, rep R, text func(io.Writer, R)) error {
	if asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	text(c.stdout, rep)
	return nil
}

// benchList parses a comma-separated list of allowed values, keeping
// their canonical order.
func benchList(flag, list string, allowed ...string) ([]string, error) {
	var got []string
	for v := range strings.SplitSeq(list, ",") {
		v = strings.TrimSpace(v)
		if !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("bench: %s: %q is not one of %s", flag, v, strings.Join(allowed, ", "))
		}
		got = append(got, v)
	}
	return slices.DeleteFunc(slices.Clone(allowed), func(v string) bool { return !slices.Contains(got, v) }), nil
}

func (o benchOptions) validate() error {
	for name, v := range map[string]int{"-conversations": o.conversations, "-turns": o.turns, "-words": o.words, "-accounts": o.accounts} {
		if v < 1 || v > 10000 {
			return fmt.Errorf("bench: %s must be between 1 and 10000, not %d", name, v)
		}
	}
	if o.deltas < 0 || o.deltas > 100000 {
		return fmt.Errorf("bench: -deltas must be between 0 and 100000, not %d", o.deltas)
	}
	if o.idle < 0 || o.idle > 100000 {
		return fmt.Errorf("bench: -idle must be between 0 and 100000, not %d", o.idle)
	}
	if o.pace < 0 || o.pace > 10*time.Second {
		return fmt.Errorf("bench: -pace must be between 0 and 10s, not %s", o.pace)
	}
	if o.ramp < 0 || o.idleHold < 0 {
		return errors.New("bench: -ramp and -idle-hold must not be negative")
	}
	if o.burst && o.ramp > 0 {
		return errors.New("bench: -burst starts every session at once; -ramp spreads them: give one")
	}
	if o.turnTimeout <= 0 {
		return errors.New("bench: -turn-timeout must be positive")
	}
	if o.soak < 0 || !(o.faultRate >= 0 && o.faultRate <= 1) || !(o.clientFaultRate >= 0 && o.clientFaultRate <= 1) {
		return errors.New("bench: -soak must not be negative, -fault-rate and -client-fault-rate must be between 0 and 1")
	}
	if o.cacheThreads < 0 || o.cacheThreads > 0 && o.soak == 0 {
		return errors.New("bench: -cache-threads goes with -soak, and must not be negative")
	}
	if o.soak > 0 && o.idle > 0 {
		return errors.New("bench: -soak and -idle are two modes: give one")
	}
	if sessions := o.sessions(); slices.Contains(o.targets, targetRelay) && sessions > o.accounts*relayLanesPerAccount {
		return fmt.Errorf("bench: %d sessions need at least %d accounts: the relay opens at most %d upstream lanes per account (-accounts)",
			sessions, (sessions+relayLanesPerAccount-1)/relayLanesPerAccount, relayLanesPerAccount)
	}
	return nil
}

// compressionsOf is the compression settings target runs with over
// transport: the relay's WebSocket phases one each, every other phase one
// ("": the setting does not apply).
func (o benchOptions) compressionsOf(target, transport string) []relay.CompressionMode {
	if target == targetRelay && transport != "http" {
		return o.compressions
	}
	return []relay.CompressionMode{""}
}

// soakDefaults sets the soak's workload where its flags were not given.
func (o *benchOptions) soakDefaults(given map[string]bool) {
	if !given["conversations"] {
		o.conversations = soakSessions
	}
	if !given["accounts"] {
		o.accounts = soakAccounts(o.conversations)
	}
	if !given["words"] {
		o.words = soakWords
	}
	if !given["deltas"] {
		o.deltas = soakDeltas
	}
	if !given["pace"] {
		o.pace = soakPace
	}
	if !given["turn-timeout"] {
		o.turnTimeout = soakTurnDeadline
	}
}

// sessions is how many sessions one phase holds at once.
func (o benchOptions) sessions() int {
	if o.idle > 0 {
		return o.idle
	}
	return o.conversations
}

// startProfiles starts the profiles asked for and returns what writes
// them at the end of the run.
func startProfiles(cpuPath, memPath, mutexPath, blockPath, tracePath string, heap bool) (stop func() error, err error) {
	var cpuFile, traceFile *os.File
	if cpuPath != "" {
		if cpuFile, err = os.Create(cpuPath); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		if err := pprof.StartCPUProfile(cpuFile); err != nil {
			cpuFile.Close()
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	if tracePath != "" {
		if traceFile, err = os.Create(tracePath); err == nil {
			err = trace.Start(traceFile)
		}
		if err != nil {
			if cpuFile != nil {
				pprof.StopCPUProfile()
				cpuFile.Close()
			}
			if traceFile != nil {
				traceFile.Close()
			}
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	if memPath != "" || heap {
		runtime.MemProfileRate = 4096
	}
	if mutexPath != "" {
		runtime.SetMutexProfileFraction(5)
	}
	if blockPath != "" {
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	}
	write := func(path, profile string) error {
		if path == "" {
			return nil
		}
		return writeProfile(path, profile, 0)
	}
	return func() error {
		var errs []error
		if cpuFile != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpuFile.Close())
		}
		if traceFile != nil {
			trace.Stop()
			errs = append(errs, traceFile.Close())
		}
		errs = append(errs, write(memPath, "allocs"), write(mutexPath, "mutex"), write(blockPath, "block"))
		runtime.SetMutexProfileFraction(0)
		runtime.SetBlockProfileRate(0)
		return errors.Join(errs...)
	}, nil
}

// benchEnv is what every phase of one run shares: the sim, the relay in
// front of it, and their credentials. Static after startBenchEnv.
type benchEnv struct {
	o        benchOptions
	log      *slog.Logger
	upstream *sim.Server
	accounts []sim.Account
	store    *store.Store
	secret   []byte
	key      string // the relay's client key
	keyID    string
	database string // the relay's store: sqlite or postgres
	// closeRelayIdle closes the idle HTTP connections of the relay last
	// started (to the sim and the token endpoint).
	closeRelayIdle func()
}

// bench runs the workload (or the idle mode) against every target, on
// every transport, and compares them.
func bench(ctx context.Context, c cli, o benchOptions, log *slog.Logger) (benchReport, error) {
	rep := benchReport{Conversations: o.conversations, Turns: o.turns, Words: o.words, Deltas: o.deltas,
		PaceMs: ms(o.pace), RampMs: ms(o.ramp), Burst: o.burst, IdleSessions: o.idle, Accounts: o.accounts, ClientDeflate: o.clientDeflate,
		UpstreamCompression: string(o.upstreamCompression), SimCompression: o.simCompression, Compressions: o.compressions, Prewarm: o.prewarm,
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), CPUModel: cpuModel(),
		Method: benchMethod}
	if o.idle > 0 {
		rep.IdleHoldMs = ms(o.idleHold)
	}
	rep.Goroutines.Before = runtime.NumGoroutine()

	// Everything started is stopped in reverse order: at the end, before
	// goroutines are counted, or on an early return.
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		stops = nil
	}
	defer stopAll()

	env, stop, err := startBenchEnv(ctx, c, o, log)
	stops = append(stops, stop)
	if err != nil {
		return rep, err
	}
	rep.Database = env.database

	if o.idle > 0 {
		for _, target := range o.targets {
			for _, comp := range o.compressionsOf(target, "ws") {
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				row, err := env.idlePhase(ctx, target, comp)
				if err != nil {
					return rep, err
				}
				rep.Idle = append(rep.Idle, row)
			}
		}
		rep.IdleTables = idleTables(rep.Idle)
	} else {
		for _, transport := range o.transports {
			var rows []benchRow
			for _, target := range o.targets {
				for _, comp := range o.compressionsOf(target, transport) {
					if err := ctx.Err(); err != nil {
						return rep, err
					}
					row, err := env.phase(ctx, target, comp, transport)
					if err != nil {
						return rep, err
					}
					rows = append(rows, row)
				}
			}
			rep.Rows = append(rep.Rows, rows...)
			rep.Tables = append(rep.Tables, compareTables(transport, rows)...)
		}
	}
	rep.Compression = compressionTable(append(slices.Clone(rep.Tables), rep.IdleTables...))

	stopAll()
	// Goroutines end asynchronously after their connections close: give
	// them a moment, then count.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > rep.Goroutines.Before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	rep.Goroutines.After = runtime.NumGoroutine()
	return rep, nil
}

// startBenchEnv starts the sim (under its profiler label) and opens the
// relay's store with the sim's accounts and a client key; each relay phase
// starts a relay on it (startRelay). stop ends what was started, also
// after an error.
func startBenchEnv(ctx context.Context, c cli, o benchOptions, log *slog.Logger) (*benchEnv, func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	env := &benchEnv{o: o, log: log}

	dir, err := os.MkdirTemp("", "codex-relay-bench-*")
	if err != nil {
		return nil, stop, fmt.Errorf("bench: %w", err)
	}
	stops = append(stops, func() { os.RemoveAll(dir) })

	for i := range o.accounts {
		id := fmt.Sprintf("bench-%d", i+1)
		org := "org-bench"
		if o.soak > 0 {
			// Two organisations: a thread that a fault moves may land where
			// its ciphertext cannot be read.
			org = fmt.Sprintf("org-%c", 'a'+i%2)
		}
		env.accounts = append(env.accounts, sim.Account{ID: id, AccessToken: "at-" + id, RefreshToken: "rt-" + id, Organization: org})
	}
	// The sim keeps one record per request and per WebSocket handshake
	// (the bench counts the events it sent from them): enough for a phase,
	// which clears them.
	maxRecords := 4*o.sessions()*(o.turns+1) + 1000
	pprof.Do(ctx, pprof.Labels("component", "sim"), func(context.Context) {
		var stopSim func()
		env.upstream, stopSim, err = startSim(sim.Config{Accounts: env.accounts, MaxRecords: maxRecords, WSCompression: o.simCompression,
			Logger: log.With("component", "sim")}, "127.0.0.1:0", log)
		if err == nil {
			stops = append(stops, stopSim)
		}
	})
	if err != nil {
		return nil, stop, fmt.Errorf("bench: %w", err)
	}

	dbURL := cmp.Or(o.databaseURL, "sqlite:"+filepath.Join(dir, "bench.db"))
	st, secret, err := openStoreWithKey(ctx, c, dbFlags{databaseURL: dbURL}, log, false)
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, func() { st.Close() })
	if existing, err := st.Accounts(ctx); err != nil {
		return nil, stop, err
	} else if len(existing) > 0 {
		return nil, stop, fmt.Errorf("bench: the database at %s holds accounts: give an empty one (the bench adds its own)", st.Location())
	}
	env.database = string(st.Dialect())
	for _, a := range env.accounts {
		if _, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: a.ID, BaseURL: env.upstream.CodexBaseURL(),
			ChatGPTAccountID: a.ID, Organization: a.Organization}, store.Credentials{AccessToken: a.AccessToken, RefreshToken: a.RefreshToken}); err != nil {
			return nil, stop, err
		}
	}
	key, secretKey, err := st.CreateClientKey(ctx, store.ClientKey{Name: "bench"})
	if err != nil {
		return nil, stop, err
	}
	env.key, env.keyID = secretKey, key.ID
	env.store, env.secret = st, secret
	return env, stop, nil
}

// startRelay starts a relay on the bench's store, as serve runs it (its
// own address and hop key, so it keeps thread leases, and its housekeeping
// and heartbeat running) under the relay profiler label, answering
// clients' deflate offers with compression. stop ends it and its sessions.
func (e *benchEnv) startRelay(ctx context.Context, compression relay.CompressionMode) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench: listen: %w", err)
	}
	url = "http://" + ln.Addr().String()
	pprof.Do(ctx, pprof.Labels("component", "relay"), func(context.Context) {
		up := relay.NewUpstreamWith(relay.UpstreamOptions{Compression: relay.Compression{Mode: e.o.upstreamCompression}})
		e.closeRelayIdle = up.HTTP.CloseIdleConnections
		cfg := relay.Config{Store: e.store, Logger: e.log.With("component", "relay"),
			ClientCompression: relay.Compression{Mode: compression},
			Upstream:          up,
			Replica:           relay.ReplicaConfig{Address: url, HopKey: derivedKey(e.secret, hopKeyPurpose)}}
		closeTokens := func() {}
		if e.o.soak > 0 {
			// The soak's 401s are answered by refreshing at the sim (which
			// rotates the refresh token), its stalls end at a short idle
			// deadline, and idle lanes close soon after the sessions.
			tokens := oauth.NewRefresher(oauth.RefresherConfig{Store: e.store, HTTPClient: up.HTTP, ClientFor: up.Client,
				TokenURL: e.upstream.TokenURL(), Logger: e.log.With("component", "tokens")})
			closeTokens = tokens.Close
			cfg.Tokens = tokens
			cfg.StreamIdleTimeout = soakStallDeadline
			cfg.Bridge = bridge.PoolConfig{IdleTimeout: soakLaneIdle, SweepEvery: soakLaneIdle / 4}
			if n := e.o.cacheThreads; n > 0 {
				cfg.Continuity = continuity.New(continuity.Options{MaxEntries: n})
				cfg.OwnerIDs = 20 * n
			}
		}
		rl := relay.New(cfg)
		runCtx, stopRun := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { defer close(ran); rl.Run(runCtx) }()
		hs := relayHTTPServer(rl, e.log)
		served := make(chan error, 1)
		go func() { served <- serveHTTP(hs, ln) }()
		stop = func() {
			stopRun()
			<-ran
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
			rl.Close() // WebSocket sessions are hijacked: Shutdown does not end them
			<-served
			closeTokens()
		}
	})
	return url, stop, nil
}

// target returns where a phase's sessions go. The pipe is started here
// and stopped by the returned func, which also reports the bytes it
// copied.
func (e *benchEnv) target(ctx context.Context, name string, compression relay.CompressionMode) (benchTarget, func() int64, error) {
	simHeader := func(conv int) http.Header {
		a := e.accounts[conv%len(e.accounts)]
		return http.Header{"Authorization": {"Bearer " + a.AccessToken}, "Chatgpt-Account-Id": {a.ID}}
	}
	switch name {
	case targetDirect:
		return benchTarget{name: name, base: e.upstream.CodexBaseURL(), header: simHeader}, func() int64 { return 0 }, nil
	case targetPipe:
		var p *bytePipe
		var err error
		pprof.Do(ctx, pprof.Labels("component", "pipe"), func(context.Context) {
			p, err = startBytePipe(strings.TrimPrefix(e.upstream.URL, "http://"))
		})
		if err != nil {
			return benchTarget{}, nil, fmt.Errorf("bench: %w", err)
		}
		return benchTarget{name: name, base: "http://" + p.Addr() + "/backend-api/codex", header: simHeader}, p.Close, nil
	default:
		url, stop, err := e.startRelay(ctx, compression)
		if err != nil {
			return benchTarget{}, nil, err
		}
		return benchTarget{name: name, base: url + "/backend-api/codex", header: func(int) http.Header {
			return http.Header{"Authorization": {"Bearer " + e.key}}
		}}, func() int64 { stop(); return 0 }, nil
	}
}

// simEvents is how many events the sim sent in answers to response
// requests since its records were last cleared.
func (e *benchEnv) simEvents() int64 {
	var n int64
	for _, r := range e.upstream.Records(sim.RecordFilter{Route: sim.RouteResponses}) {
		if r.Kind != sim.RecordHandshake {
			n += int64(r.Events)
		}
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
