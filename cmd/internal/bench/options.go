package bench

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/relay"
)

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

// options is one bench run's workload.
type options struct {
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
	// soak > 0 runs the soak (soak.go) for that long instead of the
	// phases, with faultRate of the upstream requests and clientFaultRate
	// of the client turns meeting a fault.
	soak            time.Duration
	faultRate       float64
	clientFaultRate float64
	clientHangups   bool
	// cacheThreads bounds the relay's continuity cache (and its owner
	// index, 20 ids a thread) in a soak; 0: the relay's defaults.
	cacheThreads int
	// hostile runs the hostile clients mode (hostile.go) instead.
	hostile hostileOptions
}

// command is what the flags ask for: the workload, how the report is
// printed, the relay's log level and the profiles written.
type command struct {
	o        options
	asJSON   bool
	logLevel string
	profiles profilePaths
	// given names the flags the command line set (the modes' defaults
	// apply to the others).
	given map[string]bool
}

// parseCommand registers the bench's flags on fs, parses args with them
// and checks the workload they describe.
func parseCommand(fs *flag.FlagSet, args []string) (command, error) {
	var cmd command
	o := &cmd.o
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
	fs.StringVar(&o.busyProfile, "busyprofile", "", "write a heap profile (memory in use, after a collection) to this file while the last target's sessions are mid-turn: in the last transport's phase, once every session has read its first output (go tool pprof -sample_index inuse_space); a phase whose sessions all ended before the profiles were written is an error; every goroutine's stack goes beside it, in FILE.goroutines; with -soak: FILE-mid and FILE-end, at two fifths and at the end of the run (go tool pprof -diff_base FILE-mid FILE-end: what the live heap grew by). The collection and the writing count in that phase's CPU figures: take the CPU from another run")
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
	fs.BoolVar(&cmd.asJSON, "json", false, "print the report as JSON, with every figure")
	fs.StringVar(&cmd.logLevel, "log-level", "error", "relay log level: debug, info, warn or error")
	fs.StringVar(&cmd.profiles.cpu, "cpuprofile", "", "write a CPU profile of the whole run to this file; samples carry the label component=client, sim, pipe or relay (go tool pprof -tagfocus component=relay)")
	fs.StringVar(&cmd.profiles.mem, "memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index alloc_space)")
	fs.StringVar(&cmd.profiles.mutex, "mutexprofile", "", "write a mutex contention profile of the whole run to this file")
	fs.StringVar(&cmd.profiles.block, "blockprofile", "", "write a blocking profile of the whole run to this file")
	fs.StringVar(&cmd.profiles.trace, "trace", "", "write an execution trace of the whole run to this file: where goroutines waited for the network, a system call or a CPU, which the block profile does not show (go tool trace -pprof=net, sync, syscall or sched FILE)")
	if err := fs.Parse(args); err != nil {
		return cmd, err
	}
	if fs.NArg() > 0 {
		return cmd, fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	cmd.given = given
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
		return cmd, err
	}
	if o.targets, err = benchList("-targets", *targets, targetDirect, targetPipe, targetRelay); err != nil {
		return cmd, err
	}
	modes, err := benchList("-compression", *compressions, string(relay.CompressionPooled), string(relay.CompressionTakeover), string(relay.CompressionOff))
	if err != nil {
		return cmd, err
	}
	for _, m := range modes {
		o.compressions = append(o.compressions, relay.CompressionMode(m))
	}
	if _, err := benchList("-upstream-compression", *upstreamCompression, string(relay.CompressionPooled), string(relay.CompressionTakeover), string(relay.CompressionOff)); err != nil {
		return cmd, err
	}
	o.upstreamCompression = relay.CompressionMode(*upstreamCompression)
	if _, err := benchList("-sim-compression", o.simCompression, "pooled", "takeover", "off"); err != nil {
		return cmd, err
	}
	if err := o.validate(); err != nil {
		return cmd, err
	}
	return cmd, nil
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

func (o options) validate() error {
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
func (o options) compressionsOf(target, transport string) []relay.CompressionMode {
	if target == targetRelay && transport != "http" {
		return o.compressions
	}
	return []relay.CompressionMode{""}
}

// soakDefaults sets the soak's workload where its flags were not given.
func (o *options) soakDefaults(given map[string]bool) {
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

// busyDeadline bounds -busyprofile's wait for every session of its phase
// to read output: each has the ramp to start, and a turn's deadline each
// to connect, prewarm and read its first output; this is past all of
// them (a session that passes one fails, and the phase ends without it).
func (o options) busyDeadline() time.Duration { return o.ramp + 4*o.turnTimeout }

// sessions is how many sessions one phase holds at once.
func (o options) sessions() int {
	if o.idle > 0 {
		return o.idle
	}
	return o.conversations
}
