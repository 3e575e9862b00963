package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/klauspost/compress/zstd"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay"
)

// hostileOptions is the -hostile mode's workload: hostile clients beside
// the bench's well-behaved sessions, against the relay alone.
type hostileOptions struct {
	on          bool
	slowReaders int           // sessions reading a long answer slowly
	stopped     int           // sessions that ask for a very long answer and read nothing
	halfOpen    int           // connections that send part of a request, or nothing after the handshake
	readEvery   time.Duration // a slow reader's pace: one event (message) each
	// The slow readers' answer: long enough that the relay's writes to a
	// reader that stopped block (the reader's socket buffer is 4 KiB).
	answerWords, answerEvents int
	answerGap                 time.Duration
	// The relay's limits in this run (relay.Config), and the HTTP
	// server's header timeout (0: serve's).
	maxBody       int64
	bodyTimeout   time.Duration
	writeTimeout  time.Duration
	headerTimeout time.Duration
	// maxMessage is the WebSocket message the limit probes send at and
	// over the limit (relay.MaxMessageBytes; tests lower the probes only,
	// never the relay's limit).
	maxMessage int64
	// stoppedCap is how long after its request a stopped reader waits for
	// the relay to let it go (hostileStoppedCap).
	stoppedCap time.Duration
}

// hostileFlags registers the -hostile mode's flags on fs.
func hostileFlags(fs *flag.FlagSet, h *hostileOptions) {
	fs.BoolVar(&h.on, "hostile", false, "instead of the comparison, measure the relay under hostile clients: the well-behaved sessions (-conversations, default 50, half HTTP and half WebSocket, -paced unless -words/-deltas/-pace) run quiet, then again beside -slow-readers and -half-open hostile connections and probes of every limit; exits non-zero when a bound fails")
	fs.IntVar(&h.slowReaders, "slow-readers", 1000, "with -hostile: sessions that ask for a long paced answer and read one event every -slow-read-every (half HTTP, half WebSocket)")
	fs.IntVar(&h.stopped, "stopped-readers", 20, "with -hostile: sessions that ask for an answer of about 6 MB, more than the kernel buffers between them and the relay hold, and never read (half HTTP, half WebSocket): the relay's client write timeout must end them")
	fs.IntVar(&h.halfOpen, "half-open", 1000, "with -hostile: connections that send half a request's headers (slowloris), finish a WebSocket handshake and then go silent (half of those after one turn), or trickle a body")
	fs.DurationVar(&h.readEvery, "slow-read-every", time.Second, "with -hostile: how often a slow reader reads one event")
	fs.Int64Var(&h.maxBody, "max-body-bytes", 8<<20, "with -hostile: the relay's request body limit in this run (serve's is 64 MiB; lower here so the probes at the limit stay cheap)")
	fs.DurationVar(&h.bodyTimeout, "body-read-timeout", 10*time.Second, "with -hostile: the relay's request body deadline in this run (serve's is 2m)")
	fs.DurationVar(&h.writeTimeout, "client-write-timeout", 15*time.Second, "with -hostile: the relay's client write timeout in this run (serve's: 15s)")
}

// Defaults of the hostile mode that the flags do not carry.
const (
	hostileConversations = 50
	hostileAnswerWords   = 1000
	hostileAnswerEvents  = 1000
	hostileAnswerGap     = 10 * time.Millisecond
	// A stopped reader's answer: about 6 MB of events, past the 4 MiB send
	// buffer the kernel grows a loopback socket to.
	hostileStoppedWords  = 40000
	hostileStoppedEvents = 40000
	hostileReadBuffer    = 4 << 10 // a slow reader's socket receive buffer
	// hostileStoppedCap bounds the wait for the relay to let a stopped
	// reader go. Its writes block only once its answer filled the kernel's
	// buffers, which took the relay 9 to 31 s on two shared cores
	// (docs/RELIABILITY.md), depending on the load beside it; then the
	// write timeout runs. The check that the relay closed it within the
	// timeout of its writes blocking is the tight one (check); this cap
	// only ends the wait, with room for a machine several times slower.
	hostileStoppedCap = 3 * time.Minute
	// hostileDrain bounds the read of what the kernel's buffers still hold
	// of a stopped reader's answer once the relay let it go (a few MiB).
	hostileDrain   = 30 * time.Second
	hostileOpeners = 64 // hostile connections opened at once
	// hostileMargin is how long past a relay deadline the bench waits to see
	// its effect.
	hostileMargin = 10 * time.Second
)

// The per-connection memory the bound allows (the whole process: the
// hostile client, the relay's side, and a slow reader's upstream lane with
// the sim's side of it), and the probes' fixed term. Justified in
// docs/RELIABILITY.md from the measured per-connection figures.
const (
	boundPerSlowReader = 512 << 10
	boundPerStopped    = 16 << 20
	boundPerHalfOpen   = 64 << 10
	// boundLimitCopies is how many copies of the largest message a limit
	// probe has in this process at once, garbage included: the client's,
	// the relay's read buffer as it grows (io.ReadAll doubles it), the body
	// without its type member, what the parse keeps, and the collector's
	// headroom (GOGC 100) over them; measured about 10.
	boundLimitCopies = 12
)

// runHostile runs the -hostile mode and prints its report; the error says
// which checks failed.
func runHostile(ctx context.Context, c cli, fs *flag.FlagSet, o benchOptions, log *slog.Logger, asJSON bool) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["conversations"] {
		o.conversations = hostileConversations
	}
	if !given["words"] && !given["deltas"] && !given["pace"] {
		o.words, o.deltas, o.pace = pacedWords, pacedDeltas, pacedGap
	}
	h := &o.hostile
	h.answerWords, h.answerEvents, h.answerGap, h.maxMessage, h.stoppedCap = hostileAnswerWords, hostileAnswerEvents, hostileAnswerGap, relay.MaxMessageBytes, hostileStoppedCap
	if !given["accounts"] {
		o.accounts = hostileAccounts(o.conversations, h.slowReaders+h.stopped)
	}
	if err := h.validate(o); err != nil {
		return err
	}
	rep, err := hostileBench(ctx, c, o, log)
	if err != nil {
		return err
	}
	if err := writeReport(c, asJSON, rep, printHostile); err != nil {
		return err
	}
	if failed := rep.failed(); len(failed) > 0 {
		return fmt.Errorf("bench: hostile: %d checks failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// hostileAccounts is the pool the hostile mode gives the relay by default:
// every slow reader really streams, and holds its turn's upstream lane while
// it does (a turn needs an upstream stream, however slowly its client
// reads), so the pool has a lane for each of them and every well-behaved
// session, and one account more. The idle lanes of the sessions that go
// silent after a turn are not counted: the pool must evict them.
func hostileAccounts(sessions, slow int) int {
	return (sessions+slow+relayLanesPerAccount-1)/relayLanesPerAccount + 1
}

func (h hostileOptions) validate(o benchOptions) error {
	if h.slowReaders < 0 || h.slowReaders > 10000 || h.halfOpen < 0 || h.halfOpen > 10000 || h.stopped < 0 || h.stopped > 200 {
		return errors.New("bench: -slow-readers and -half-open must be between 0 and 10000, -stopped-readers between 0 and 200")
	}
	if o.conversations < 2 {
		return errors.New("bench: -hostile needs at least 2 -conversations (half HTTP, half WebSocket)")
	}
	if h.readEvery <= 0 || h.bodyTimeout <= 0 || h.writeTimeout <= 0 {
		return errors.New("bench: -slow-read-every, -body-read-timeout and -client-write-timeout must be positive")
	}
	if h.stopped > 0 && h.writeTimeout+hostileMargin >= h.stoppedCap {
		return fmt.Errorf("bench: -client-write-timeout must be under %s, so the stopped readers can be let go within the wait for them", h.stoppedCap-hostileMargin)
	}
	if h.maxBody < 1<<10 || h.maxBody > 256<<20 {
		return fmt.Errorf("bench: -max-body-bytes must be between 1 KiB and 256 MiB, not %d", h.maxBody)
	}
	// Every hostile connection is two descriptors in this process (client
	// and relay), a slow reader's lane two more (relay and sim).
	need := 4*(h.slowReaders+h.stopped+o.conversations) + 2*h.halfOpen + 256
	if limit := openFileLimit(); limit > 0 && need > limit {
		return fmt.Errorf("bench: -hostile needs about %d open files, the limit is %d (ulimit -n)", need, limit)
	}
	return nil
}

// hostileReport is what -hostile prints.
type hostileReport struct {
	Sessions    int     `json:"sessions"` // well-behaved, half on each transport
	Turns       int     `json:"turns_per_session"`
	Words       int     `json:"words_per_answer"`
	Deltas      int     `json:"deltas_per_answer"`
	PaceMs      float64 `json:"pace_ms"`
	Accounts    int     `json:"accounts"`
	SlowReaders int     `json:"slow_readers"`
	Stopped     int     `json:"stopped_readers"`
	HalfOpen    int     `json:"half_open"`
	Limits      struct {
		MaxBodyBytes         int64   `json:"max_body_bytes"`
		MaxMessageBytes      int64   `json:"max_message_bytes"`
		MaxHeaderBytes       int     `json:"max_header_bytes"`
		ReadHeaderTimeoutMs  float64 `json:"read_header_timeout_ms"`
		BodyReadTimeoutMs    float64 `json:"body_read_timeout_ms"`
		ClientWriteTimeoutMs float64 `json:"client_write_timeout_ms"`
		LanesPerAccount      int     `json:"lanes_per_account"`
	} `json:"limits"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model,omitempty"`
	GoVersion  string `json:"go_version"`
	FDLimit    int    `json:"fd_limit"`

	// Quiet is the well-behaved sessions alone; Hostile the same sessions
	// beside the hostile clients. Ratio is hostile over quiet.
	Quiet   hostileRun `json:"quiet"`
	Hostile hostileRun `json:"hostile"`
	Ratio   struct {
		P50 float64 `json:"first_token_p50"`
		P99 float64 `json:"first_token_p99"`
	} `json:"ratio"`
	// Clients are the hostile connections by kind, Probes the limit probes.
	Clients []hostileGroup `json:"clients"`
	// LetGo is how the relay let the stopped readers go, by transport.
	LetGo  []hostileLetGo `json:"stopped_let_go"`
	Probes []hostileProbe `json:"probes"`
	// StalledAttempts is how many attempts the relay recorded with class
	// client_stalled; PenalisedAccounts the accounts not active afterwards.
	StalledAttempts   int      `json:"stalled_attempts"`
	PenalisedAccounts []string `json:"penalised_accounts"`
	Memory            struct {
		// RSS when the hostile phase starts (settled), its peak over that,
		// and the growth once every hostile client was in place.
		StartRSS   int64 `json:"start_rss_bytes"`
		PeakRSS    int64 `json:"peak_rss_bytes"`
		InPlaceRSS int64 `json:"in_place_rss_bytes"`
		// PerConnection is InPlaceRSS over the hostile connections.
		PerConnection float64 `json:"rss_bytes_per_hostile_connection"`
		Bound         int64   `json:"bound_bytes"`
		// KernelTCP is the peak growth of the kernel's TCP buffers
		// (machine-wide), outside RSS: where a slow reader's backlog waits.
		KernelTCP int64  `json:"kernel_tcp_bytes"`
		Formula   string `json:"bound_formula"`
	} `json:"memory"`
	// Goroutines and open descriptors: at the hostile phase's start, at
	// its peak, and once the hostile clients were gone.
	Goroutines hostileLevel   `json:"goroutines"`
	FDs        hostileLevel   `json:"open_sockets"`
	Checks     []hostileCheck `json:"checks"`
	Seconds    float64        `json:"seconds"`
}

// hostileRun is one run of the well-behaved sessions.
type hostileRun struct {
	Turns      int         `json:"turns"`
	Errors     int         `json:"errors"`
	FirstError string      `json:"first_error,omitempty"`
	FirstToken percentiles `json:"first_token_ms"`
	Turn       percentiles `json:"turn_ms"`
	PeakRSS    int64       `json:"peak_rss_bytes"` // over the run's settled start
	Seconds    float64     `json:"seconds"`
}

// hostileGroup is one kind of hostile connection: how many behaved as the
// relay's limits say they must be answered.
type hostileGroup struct {
	Kind       string `json:"kind"`
	Expect     string `json:"expect"`
	Count      int    `json:"count"`
	AsExpected int    `json:"as_expected"`
	FirstOther string `json:"first_other,omitempty"` // the first answer that was not
}

// hostileLetGo is how the relay let one kind of stopped reader go: when
// its writes to them blocked (their answers filled the kernel's buffers),
// how much those buffers took, and when it closed the connections.
type hostileLetGo struct {
	Kind   string `json:"kind"`
	Closed int    `json:"closed"` // connections the relay closed within the cap
	// Unblocked counts closes with no write of the relay's blocked: the
	// relay let the reader go for another reason than its write timeout.
	Unblocked    int         `json:"closed_unblocked"`
	BlockedAfter percentiles `json:"writes_blocked_after_ms"` // from the request
	Blocked      percentiles `json:"blocked_before_close_ms"` // from the writes blocking to the close
	ClosedAfter  percentiles `json:"closed_after_ms"`         // from the request
	WrittenP50   int64       `json:"written_p50_bytes"`       // what the relay wrote before its writes blocked
	WrittenMax   int64       `json:"written_max_bytes"`
}

// hostileProbe is one request at or over a limit.
type hostileProbe struct {
	Name   string `json:"name"`
	Expect string `json:"expect"`
	Got    string `json:"got"`
	OK     bool   `json:"ok"`
	// Ms is how long the probe took, from its dial to its answer.
	Ms float64 `json:"ms"`
}

type hostileLevel struct {
	Start int `json:"start"`
	Peak  int `json:"peak"`
	End   int `json:"end"`
}

type hostileCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// failed names the checks that failed.
func (r hostileReport) failed() []string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK {
			out = append(out, c.Name+": "+c.Detail)
		}
	}
	return out
}

// hostileEnv is one hostile run's relay and what its clients need. Static
// after hostileBench starts the relay.
type hostileEnv struct {
	*benchEnv
	h      hostileOptions
	relay  *relay.Server
	addr   string // host:port of the relay
	target benchTarget
	// closeIdle closes the relay's idle upstream lanes and connections, so
	// counts compare what clients left behind.
	closeIdle func()
	// conns sees the relay's side of its connections (the stopped
	// readers').
	conns relayConns
}

// hostileBench runs the quiet phase, then the hostile one, and checks them.
func hostileBench(ctx context.Context, c cli, o benchOptions, log *slog.Logger) (hostileReport, error) {
	h := o.hostile
	began := time.Now()
	rep := hostileReport{Sessions: o.conversations, Turns: o.turns, Words: o.words, Deltas: o.deltas, PaceMs: ms(o.pace),
		Accounts: o.accounts, SlowReaders: h.slowReaders, Stopped: h.stopped, HalfOpen: h.halfOpen,
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), CPUModel: cpuModel(), FDLimit: openFileLimit()}
	o.targets, o.transports = []string{targetRelay}, []string{"http", "ws"}
	env, stopEnv, err := startBenchEnv(ctx, c, o, log)
	defer stopEnv()
	if err != nil {
		return rep, err
	}
	he := &hostileEnv{benchEnv: env, h: h}
	hs, stopRelay, err := he.startRelay(ctx)
	if err != nil {
		return rep, err
	}
	defer stopRelay()
	rep.Limits.MaxBodyBytes, rep.Limits.MaxMessageBytes, rep.Limits.MaxHeaderBytes = h.maxBody, relay.MaxMessageBytes, hs.MaxHeaderBytes
	rep.Limits.ReadHeaderTimeoutMs, rep.Limits.BodyReadTimeoutMs, rep.Limits.ClientWriteTimeoutMs = ms(hs.ReadHeaderTimeout), ms(h.bodyTimeout), ms(h.writeTimeout)
	rep.Limits.LanesPerAccount = relayLanesPerAccount

	// Quiet: the well-behaved sessions alone.
	rep.Quiet = he.wellBehaved(ctx)

	// The hostile phase starts from the relay at rest: idle lanes closed,
	// memory settled.
	he.closeIdle()
	rep.Goroutines.Start, rep.FDs.Start = he.settleLevels(ctx, -1, -1)
	start := settledMemUse()
	rep.Memory.StartRSS = start.RSS
	watch := watchMemory(memSamplePeriod)
	tcpStart := kernelTCPMemory()
	levels := watchLevels(ctx, memSamplePeriod)

	hostileCtx, stopHostile := context.WithCancel(ctx)
	defer stopHostile()
	clients := he.startHostileClients(hostileCtx)
	if err := clients.waitInPlace(ctx, 2*time.Minute); err != nil {
		stopHostile()
		clients.wait()
		return rep, err
	}
	if inPlace := readMemUse(); clients.total > 0 {
		rep.Memory.InPlaceRSS = inPlace.RSS - start.RSS
		rep.Memory.PerConnection = float64(rep.Memory.InPlaceRSS) / float64(clients.total)
	}

	// The well-behaved sessions again, and the probes, beside them.
	var probes []hostileProbe
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		probes = he.probes(ctx)
	}()
	rep.Hostile = he.wellBehaved(ctx)
	<-probed
	rep.Probes = probes

	// Let the relay's deadlines act on the clients waiting for them, then
	// let every hostile client go.
	clients.waitSettled(ctx, he.settleDeadline(hs))
	stopHostile()
	clients.wait()
	rep.Clients = clients.groups()
	rep.LetGo = clients.letGoes()
	peak := watch.Stop()
	rep.Memory.PeakRSS = peak.RSS - start.RSS
	var tcpPeak int64
	rep.Goroutines.Peak, rep.FDs.Peak, tcpPeak = levels.stop()
	rep.Memory.KernelTCP = tcpPeak - tcpStart

	he.closeIdle()
	rep.Goroutines.End, rep.FDs.End = he.settleLevels(ctx, rep.Goroutines.Start, rep.FDs.Start)
	rep.StalledAttempts = he.stalledAttempts(ctx, clients.stalled)
	rep.PenalisedAccounts = he.penalised(ctx)

	rep.Ratio.P50 = ratio(rep.Hostile.FirstToken.P50, rep.Quiet.FirstToken.P50)
	rep.Ratio.P99 = ratio(rep.Hostile.FirstToken.P99, rep.Quiet.FirstToken.P99)
	rep.Memory.Bound, rep.Memory.Formula = memoryBound(rep.Quiet.PeakRSS, h.slowReaders, h.stopped, h.halfOpen, h.maxMessage)
	rep.Checks = rep.check(clients.stalled, h.writeTimeout)
	rep.Seconds = time.Since(began).Seconds()
	return rep, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*100) / 100
}

// memoryBound is the peak RSS the hostile phase may add over its start:
// the well-behaved sessions' own peak, a slow reader's and a half-open
// socket's cost each, and the copies of the largest limit probe.
func memoryBound(quietPeak int64, slow, stopped, halfOpen int, maxMessage int64) (int64, string) {
	b := max(quietPeak, 0) + int64(slow)*boundPerSlowReader + int64(stopped)*boundPerStopped + int64(halfOpen)*boundPerHalfOpen + boundLimitCopies*maxMessage
	f := fmt.Sprintf("quiet peak (%s) + slow readers x %s + stopped readers x %s + half-open x %s + %d x max message (%s) = %s",
		mibText(quietPeak), mibText(boundPerSlowReader), mibText(boundPerStopped), mibText(boundPerHalfOpen), boundLimitCopies, mibText(maxMessage), mibText(b))
	return b, f
}

func mibText(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// check turns the figures into the run's verdicts.
func (r hostileReport) check(stalled int, writeTimeout time.Duration) []hostileCheck {
	var out []hostileCheck
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, hostileCheck{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("well-behaved sessions had no errors", r.Quiet.Errors == 0 && r.Hostile.Errors == 0,
		"quiet %d, hostile %d %s", r.Quiet.Errors, r.Hostile.Errors, cmpOr(r.Hostile.FirstError, r.Quiet.FirstError))
	add("first token p50 within 2x of quiet", r.Ratio.P50 <= 2, "%.0f ms vs %.0f ms: %.2fx", r.Hostile.FirstToken.P50, r.Quiet.FirstToken.P50, r.Ratio.P50)
	add("first token p99 within 2x of quiet", r.Ratio.P99 <= 2, "%.0f ms vs %.0f ms: %.2fx", r.Hostile.FirstToken.P99, r.Quiet.FirstToken.P99, r.Ratio.P99)
	for _, g := range r.Clients {
		add(g.Kind, g.AsExpected == g.Count, "%d of %d: %s%s", g.AsExpected, g.Count, g.Expect, other(g.FirstOther))
	}
	for _, l := range r.LetGo {
		// The relay's promise: a client is let go once a write to it has
		// been blocked for the write timeout (the SSE deadline may be up
		// to a second older than the write), give or take the scheduling
		// of a loaded machine.
		bound := writeTimeout + hostileMargin
		add(l.Kind+" let go by the write timeout", l.Unblocked == 0 && l.Closed > 0 && l.Blocked.Max <= ms(bound),
			"%d closed, %d without a blocked write; writes blocked p50 %.1f s, max %.1f s after the request, having taken p50 %s; closed p50 %.1f s, max %.1f s after that (bound: write timeout %s + %s)",
			l.Closed, l.Unblocked, l.BlockedAfter.P50/1000, l.BlockedAfter.Max/1000, mibText(l.WrittenP50), l.Blocked.P50/1000, l.Blocked.Max/1000, writeTimeout, hostileMargin)
	}
	for _, p := range r.Probes {
		add("probe "+p.Name, p.OK, "expected %s, got %s after %.1f s", p.Expect, p.Got, p.Ms/1000)
	}
	add("stalled readers ended as client_stalled", r.StalledAttempts >= stalled, "%d attempts recorded for %d stalled readers", r.StalledAttempts, stalled)
	add("no account penalised", len(r.PenalisedAccounts) == 0, "%v", r.PenalisedAccounts)
	add("peak memory within the bound", r.Memory.PeakRSS <= r.Memory.Bound, "peak RSS +%s; bound %s", mibText(r.Memory.PeakRSS), r.Memory.Formula)
	add("goroutines back to the start", r.Goroutines.End <= r.Goroutines.Start, "start %d, peak %d, end %d", r.Goroutines.Start, r.Goroutines.Peak, r.Goroutines.End)
	add("open sockets back to the start", r.FDs.End <= r.FDs.Start, "start %d, peak %d, end %d", r.FDs.Start, r.FDs.Peak, r.FDs.End)
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func other(s string) string {
	if s == "" {
		return ""
	}
	return "; first other: " + s
}

// startRelay starts the relay for the hostile run, as the bench's
// startRelay does, with this run's limits.
func (e *hostileEnv) startRelay(ctx context.Context) (*http.Server, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("bench: listen: %w", err)
	}
	url := "http://" + ln.Addr().String()
	e.addr = ln.Addr().String()
	up := relay.NewUpstreamWith(relay.UpstreamOptions{Compression: relay.Compression{Mode: e.o.upstreamCompression}})
	e.closeIdle = func() {
		e.relay.Bridge().RetireAll()
		up.HTTP.CloseIdleConnections()
	}
	e.relay = relay.New(relay.Config{Store: e.store, Logger: e.log.With("component", "relay"),
		MaxBodyBytes: e.h.maxBody, BodyReadTimeout: e.h.bodyTimeout, ClientWriteTimeout: e.h.writeTimeout,
		Upstream: up,
		Replica:  relay.ReplicaConfig{Address: url, HopKey: derivedKey(e.secret, hopKeyPurpose)}})
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); e.relay.Run(runCtx) }()
	hs := relayHTTPServer(e.relay, e.log)
	if e.h.headerTimeout > 0 {
		hs.ReadHeaderTimeout = e.h.headerTimeout
	}
	served := make(chan error, 1)
	go func() { served <- serveHTTP(hs, e.conns.listener(ln)) }()
	e.target = benchTarget{name: targetRelay, base: url + "/backend-api/codex", header: func(int) http.Header {
		return http.Header{"Authorization": {"Bearer " + e.key}}
	}}
	return hs, func() {
		stopRun()
		<-ran
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		e.relay.Close()
		<-served
	}, nil
}

// wellBehaved runs the well-behaved sessions, half over HTTP and half over
// WebSocket at once, and measures them.
func (e *hostileEnv) wellBehaved(ctx context.Context) hostileRun {
	var run hostileRun
	base := settledMemUse()
	watch := watchMemory(memSamplePeriod)
	start := time.Now()
	var (
		mu      sync.Mutex
		samples []turnSample
		errs    []error
		wg      sync.WaitGroup
	)
	for i, transport := range []string{"http", "ws"} {
		o := e.o
		o.conversations = e.o.conversations / 2
		if i == 1 {
			o.conversations = e.o.conversations - e.o.conversations/2
		}
		wg.Go(func() {
			var wc wireCounter
			client := benchClient(o.conversations, &wc)
			defer client.CloseIdleConnections()
			s, err := runWorkload(ctx, client, e.target, transport, o)
			mu.Lock()
			defer mu.Unlock()
			samples, errs = append(samples, s...), append(errs, err...)
		})
	}
	wg.Wait()
	run.Seconds = time.Since(start).Seconds()
	run.PeakRSS = watch.Stop().RSS - base.RSS
	run.Turns, run.Errors = len(samples), len(errs)
	if len(errs) > 0 {
		run.FirstError = errs[0].Error()
	}
	var first, total []time.Duration
	for _, s := range samples {
		first, total = append(first, s.firstToken), append(total, s.total)
	}
	run.FirstToken, run.Turn = percentilesOf(first), percentilesOf(total)
	return run
}

// settleLevels waits (at most 20 s) until goroutines and open descriptors
// are down to the given levels (-1: until they stop falling) and returns
// them.
func (e *hostileEnv) settleLevels(ctx context.Context, goroutines, fds int) (int, int) {
	deadline := time.Now().Add(20 * time.Second)
	g, f := runtime.NumGoroutine(), openFDs()
	steady := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		ng, nf := runtime.NumGoroutine(), openFDs()
		if goroutines >= 0 && ng <= goroutines && nf <= fds {
			return ng, nf
		}
		if ng == g && nf == f {
			if steady++; goroutines < 0 && steady >= 10 {
				return ng, nf
			}
		} else {
			steady = 0
		}
		g, f = ng, nf
	}
	return g, f
}

// levelWatch samples goroutines and open descriptors for their peaks.
type levelWatch struct {
	done       chan struct{}
	cancel     context.CancelFunc
	goroutines int // owned by the sampler until done closes
	fds        int
	tcpMem     int64 // the kernel's TCP buffers, machine-wide
}

func watchLevels(ctx context.Context, period time.Duration) *levelWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &levelWatch{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(w.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			w.goroutines, w.fds, w.tcpMem = max(w.goroutines, runtime.NumGoroutine()), max(w.fds, openFDs()), max(w.tcpMem, kernelTCPMemory())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *levelWatch) stop() (goroutines, fds int, tcpMem int64) {
	w.cancel()
	<-w.done
	return w.goroutines, w.fds, w.tcpMem
}

// kernelTCPMemory is the memory the kernel holds in TCP socket buffers,
// machine-wide (/proc/net/sockstat; 0 where unknown): what slow readers
// cost outside the process.
func kernelTCPMemory() int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "TCP:"); ok {
			f := strings.Fields(rest)
			for i := 0; i+1 < len(f); i += 2 {
				if f[i] == "mem" {
					pages, _ := strconv.ParseInt(f[i+1], 10, 64)
					return pages * int64(os.Getpagesize())
				}
			}
		}
	}
	return 0
}

// settleDeadline is how long after the hostile clients are in place the
// bench waits for the relay's deadlines to end the ones they must end.
func (e *hostileEnv) settleDeadline(hs *http.Server) time.Duration {
	return max(hs.ReadHeaderTimeout+hostileMargin, e.h.bodyTimeout+hostileMargin, e.h.stoppedCap+hostileDrain+hostileMargin)
}

// stalledAttempts counts the attempts the relay recorded as client_stalled,
// waiting (at most 10 s) for the records of want of them.
func (e *hostileEnv) stalledAttempts(ctx context.Context, want int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, n, err := e.store.Attempts(ctx, store.AttemptFilter{Class: "client_stalled", Limit: 1})
		if err != nil || n >= want || time.Now().After(deadline) || ctx.Err() != nil {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// penalised lists the accounts the relay took out of service.
func (e *hostileEnv) penalised(ctx context.Context) []string {
	as, err := e.store.Accounts(ctx)
	if err != nil {
		return []string{"accounts: " + err.Error()}
	}
	out := []string{}
	for _, a := range as {
		if a.Status != store.StatusActive {
			out = append(out, a.Label+": "+string(a.Status)+" "+a.StatusReason)
		}
	}
	return out
}

// The kinds of hostile connection.
const (
	kindSlowHTTP    = "slow reader (HTTP)"
	kindSlowWS      = "slow reader (WebSocket)"
	kindStalledHTTP = "stopped reader (HTTP)"
	kindStalledWS   = "stopped reader (WebSocket)"
	kindSlowloris   = "half-open: half a request's headers"
	kindWSSilent    = "half-open: WebSocket silent after the handshake"
	kindWSIdleTurn  = "half-open: WebSocket silent after one turn"
	kindSlowBody    = "half-open: body trickled a byte at a time"
)

var hostileExpect = map[string]string{
	kindSlowHTTP:    "events keep coming at the reader's pace, no failure",
	kindSlowWS:      "events keep coming at the reader's pace, no failure",
	kindStalledHTTP: "the relay closes the connection, the answer cut short (client write timeout)",
	kindStalledWS:   "the relay closes the connection, the answer cut short (client write timeout)",
	kindSlowloris:   "the relay closes the connection (read header timeout)",
	kindWSSilent:    "101, then held (the relay's pings go unanswered)",
	kindWSIdleTurn:  "the turn completes, then held with its idle lane",
	kindSlowBody:    "408 request_timeout (body read timeout)",
}

var hostileKinds = []string{kindSlowHTTP, kindSlowWS, kindStalledHTTP, kindStalledWS, kindSlowloris, kindWSSilent, kindWSIdleTurn, kindSlowBody}

// hostileClients are the hostile connections of one run.
type hostileClients struct {
	total   int
	stalled int // stopped readers
	inPlace sync.WaitGroup
	settled sync.WaitGroup // done by the ones the relay must end, once it did (or the wait ran out)
	done    sync.WaitGroup
	mu      sync.Mutex
	got     map[string]*hostileGroup // guarded by mu
	letGo   map[string][]letGoSample // stopped readers the relay closed, by kind; guarded by mu
}

// letGoSample is one stopped reader the relay closed.
type letGoSample struct {
	sent time.Time // its request
	rc   relayClose
}

func (hc *hostileClients) closedBy(kind string, sent time.Time, rc relayClose) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.letGo[kind] = append(hc.letGo[kind], letGoSample{sent, rc})
}

// letGoes sums up the closes of the stopped readers, by kind.
func (hc *hostileClients) letGoes() []hostileLetGo {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	var out []hostileLetGo
	for _, k := range []string{kindStalledHTTP, kindStalledWS} {
		ss := hc.letGo[k]
		if len(ss) == 0 {
			continue
		}
		l := hostileLetGo{Kind: k, Closed: len(ss)}
		var after, blocked, closed []time.Duration
		var written []int64
		for _, s := range ss {
			closed = append(closed, s.rc.At.Sub(s.sent))
			if s.rc.BlockedAt.IsZero() {
				l.Unblocked++
				continue
			}
			after = append(after, s.rc.BlockedAt.Sub(s.sent))
			blocked = append(blocked, s.rc.blocked())
			written = append(written, s.rc.Written)
		}
		l.BlockedAfter, l.Blocked, l.ClosedAfter = percentilesOf(after), percentilesOf(blocked), percentilesOf(closed)
		if len(written) > 0 {
			slices.Sort(written)
			l.WrittenP50, l.WrittenMax = written[(len(written)-1)/2], written[len(written)-1]
		}
		out = append(out, l)
	}
	return out
}

func (hc *hostileClients) record(kind string, ok bool, got string) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	g := hc.got[kind]
	g.Count++
	if ok {
		g.AsExpected++
	} else if g.FirstOther == "" {
		g.FirstOther = clipText(got, 300)
	}
}

func (hc *hostileClients) groups() []hostileGroup {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	var out []hostileGroup
	for _, k := range hostileKinds {
		if g := hc.got[k]; g.Count > 0 {
			out = append(out, *g)
		}
	}
	return out
}

// waitInPlace waits until every hostile connection is where it holds.
func (hc *hostileClients) waitInPlace(ctx context.Context, limit time.Duration) error {
	if !waitGroupWithin(ctx, &hc.inPlace, limit) {
		return fmt.Errorf("bench: hostile clients not in place within %s", limit)
	}
	return nil
}

func (hc *hostileClients) waitSettled(ctx context.Context, limit time.Duration) {
	waitGroupWithin(ctx, &hc.settled, limit)
}

func (hc *hostileClients) wait() { hc.done.Wait() }

// waitGroupWithin waits for wg, at most limit; it reports whether wg was
// done. The waiting goroutine it starts ends with wg.
func waitGroupWithin(ctx context.Context, wg *sync.WaitGroup, limit time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// startHostileClients opens every hostile connection, a few at a time, each
// in its own goroutine that ends when ctx does (or earlier).
func (e *hostileEnv) startHostileClients(ctx context.Context) *hostileClients {
	h := e.h
	hc := &hostileClients{got: map[string]*hostileGroup{}, letGo: map[string][]letGoSample{}}
	for _, k := range hostileKinds {
		hc.got[k] = &hostileGroup{Kind: k, Expect: hostileExpect[k]}
	}
	var kinds []string
	stalled := h.stopped
	for i := range h.stopped {
		kinds = append(kinds, []string{kindStalledHTTP, kindStalledWS}[i%2])
	}
	for i := range h.slowReaders {
		kinds = append(kinds, []string{kindSlowHTTP, kindSlowWS}[i%2])
	}
	for i := range h.halfOpen {
		kinds = append(kinds, []string{kindSlowloris, kindWSSilent, kindSlowBody, kindWSIdleTurn}[i%4])
	}
	hc.total, hc.stalled = len(kinds), stalled
	hc.inPlace.Add(len(kinds))
	hc.done.Add(len(kinds))
	reader := hostileReaderClient()
	slots := make(chan struct{}, hostileOpeners)
	hc.done.Add(1)
	go func() {
		defer hc.done.Done()
		defer reader.CloseIdleConnections()
		for i, kind := range kinds {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				// Never started: count them in place and done.
				for range kinds[i:] {
					hc.inPlace.Done()
					hc.done.Done()
				}
				return
			}
			settles := kind == kindStalledHTTP || kind == kindStalledWS || kind == kindSlowloris || kind == kindSlowBody
			if settles {
				hc.settled.Add(1)
			}
			go func() {
				defer hc.done.Done()
				c := hostileConn{e: e, hc: hc, kind: kind, session: store.NewID("hostile", time.Now()), client: reader}
				c.placed = sync.OnceFunc(func() { <-slots; hc.inPlace.Done() })
				c.settle = func() {}
				if settles {
					c.settle = sync.OnceFunc(hc.settled.Done)
				}
				defer c.placed()
				defer c.settle()
				ok, got := c.run(ctx)
				hc.record(kind, ok, got)
			}()
		}
	}()
	return hc
}

// hostileReaderClient is the HTTP client of the slow readers: a small
// socket receive buffer, so a relay writing to a reader that stopped
// blocks soon, and no connection reuse.
func hostileReaderClient() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { setReceiveBuffer(fd, hostileReadBuffer) })
	}}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DisableCompression: true, DialContext: d.DialContext}}
}

// hostileConn is one hostile connection.
type hostileConn struct {
	e       *hostileEnv
	hc      *hostileClients
	kind    string
	session string
	client  *http.Client
	placed  func() // called once the connection holds where it should
	settle  func() // called once the relay ended it as it must
}

// run plays the connection's part until ctx ends, and reports whether the
// relay answered it as it must, and what it got.
func (c *hostileConn) run(ctx context.Context) (bool, string) {
	switch c.kind {
	case kindSlowHTTP:
		return c.slowHTTP(ctx)
	case kindSlowWS:
		return c.slowWS(ctx)
	case kindStalledHTTP:
		return c.stoppedHTTP(ctx)
	case kindStalledWS:
		return c.stoppedWS(ctx)
	case kindSlowloris:
		return c.slowloris(ctx)
	case kindWSSilent:
		return c.wsSilent(ctx)
	case kindWSIdleTurn:
		return c.wsIdleTurn(ctx)
	default:
		return c.slowBody(ctx)
	}
}

// longPrompt asks for the slow readers' long answer: paced, or for the
// readers that stop, all at once (the relay's writes to them block at once).
func (c *hostileConn) longPrompt() []any {
	h := c.e.h
	text := fmt.Sprintf("hostile reader [[sim:words %d]] [[sim:events %d]] [[sim:gap %s]]", h.answerWords, h.answerEvents, h.answerGap)
	if c.kind == kindStalledHTTP || c.kind == kindStalledWS {
		text = fmt.Sprintf("hostile stopped reader [[sim:words %d]] [[sim:events %d]]", hostileStoppedWords, hostileStoppedEvents)
	}
	return []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}}
}

func (c *hostileConn) headers() http.Header {
	h := c.e.target.header(0)
	h.Set("Session-Id", c.session)
	h.Set("Thread-Id", c.session)
	h.Set("Originator", "codex-relay-bench-hostile")
	return h
}

// longRequest posts the long answer's request over HTTP; the caller closes
// the answer's body.
func (c *hostileConn) longRequest(ctx context.Context) (*http.Response, error) {
	body, _ := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false, "input": c.longPrompt()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.e.target.base+"/responses", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = c.headers()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return resp, nil
}

// slowHTTP asks for the long answer over HTTP and reads one event every
// readEvery until ctx ends.
func (c *hostileConn) slowHTTP(ctx context.Context) (bool, string) {
	resp, err := c.longRequest(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	events := wire.NewSSEReader(resp.Body, 0, 0)
	return c.readSlowly(ctx, func() ([]byte, error) {
		ev, err := events.Next()
		return ev.Data, err
	}, func() { resp.Body.Close() })
}

// readSlowly reads one event every readEvery until ctx ends; the first one
// places the connection. It fails on a read error or a terminal event
// other than response.completed.
func (c *hostileConn) readSlowly(ctx context.Context, next func() ([]byte, error), abort func()) (bool, string) {
	stop := context.AfterFunc(ctx, abort)
	defer stop()
	t := time.NewTicker(c.e.h.readEvery)
	defer t.Stop()
	for n := 0; ; n++ {
		data, err := next()
		if err != nil {
			if ctx.Err() != nil && n > 0 {
				return true, fmt.Sprintf("%d events read", n)
			}
			return false, fmt.Sprintf("read after %d events: %v", n, err)
		}
		c.placed()
		typ, _ := wire.EventType(data)
		if typ == wire.EventResponseCompleted {
			return true, fmt.Sprintf("completed after %d events", n+1)
		}
		if wire.IsTerminal(typ) || typ == "error" {
			return false, fmt.Sprintf("%s after %d events: %s", typ, n, clipText(string(data), 200))
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return true, fmt.Sprintf("%d events read", n+1)
		}
	}
}

// slowWS is slowHTTP over a WebSocket (no compression offered: a slow
// reader's bytes should be many).
func (c *hostileConn) slowWS(ctx context.Context) (bool, string) {
	conn, err := c.dialWS(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, c.longMessage()); err != nil {
		return false, "write: " + err.Error()
	}
	return c.readSlowly(ctx, func() ([]byte, error) {
		_, data, err := conn.Read(context.Background()) // ended by abort
		return data, err
	}, func() { conn.CloseNow() })
}

func (c *hostileConn) longMessage() []byte {
	msg, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false, "input": c.longPrompt()})
	return msg
}

// stoppedHTTP asks for the stopped readers' answer over HTTP and reads
// none of it: the relay must let it go (letGo).
func (c *hostileConn) stoppedHTTP(ctx context.Context) (bool, string) {
	tctx, watched := c.watchRelay(ctx)
	sent := time.Now()
	resp, err := c.longRequest(tctx)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	return c.letGo(ctx, sent, watched, func() (string, bool) {
		// A chunked answer cut short fails to read; one that ends
		// normally was never stalled on.
		cut := time.AfterFunc(hostileDrain, func() { resp.Body.Close() })
		n, err := io.Copy(io.Discard, resp.Body)
		if !cut.Stop() {
			return fmt.Sprintf("what the connection held (%s read) did not drain within %s", mibText(n), hostileDrain), false
		}
		if err == nil {
			return "the stream ended normally: the relay never stalled on this reader", false
		}
		return fmt.Sprintf("cut short after %s: %v", mibText(n), err), true
	})
}

// stoppedWS is stoppedHTTP over a WebSocket.
func (c *hostileConn) stoppedWS(ctx context.Context) (bool, string) {
	tctx, watched := c.watchRelay(ctx)
	conn, err := c.dialWS(tctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	sent := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, c.longMessage()); err != nil {
		return false, "write: " + err.Error()
	}
	return c.letGo(ctx, sent, watched, func() (string, bool) {
		rctx, cancel := context.WithTimeout(ctx, hostileDrain)
		defer cancel()
		for n := 0; ; n++ {
			_, data, err := conn.Read(rctx)
			if err != nil {
				if rctx.Err() != nil {
					return fmt.Sprintf("what the connection held (%d messages read) did not drain within %s", n, hostileDrain), false
				}
				return fmt.Sprintf("cut short after %d messages: %v", n, err), true
			}
			if typ, _ := wire.EventType(data); typ == wire.EventResponseCompleted {
				return "the answer completed: the relay never stalled on this reader", false
			}
		}
	})
}

// relayWatch is a stopped reader's connection as the relay's side of it
// is watched (relayConns).
type relayWatch struct {
	client string // the connection's local address
	closed <-chan relayClose
}

// watchRelay returns ctx with a trace that registers, with the relay's
// side, the connection the request or handshake made under it gets; the
// channel holds the registration once it got one.
func (c *hostileConn) watchRelay(ctx context.Context) (context.Context, <-chan relayWatch) {
	got := make(chan relayWatch, 1)
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		a := i.Conn.LocalAddr().String()
		select {
		case got <- relayWatch{client: a, closed: c.e.conns.watch(a)}:
		default:
		}
	}}
	return httptrace.WithClientTrace(ctx, trace), got
}

// letGo waits, reading nothing, until the relay closes the connection
// (within stoppedCap of the request), then reads what the kernel's buffers
// still hold of the answer with drain: it must end cut short, never
// complete. The reader cannot see the close without reading (it waits
// behind what the buffers hold), and reading would unblock the relay's
// writes, so the close is seen on the relay's side of the connection.
func (c *hostileConn) letGo(ctx context.Context, sent time.Time, watched <-chan relayWatch, drain func() (string, bool)) (bool, string) {
	var w relayWatch
	select {
	case w = <-watched:
	default:
		return false, "no connection was seen to watch"
	}
	c.placed()
	t := time.NewTimer(time.Until(sent.Add(c.e.h.stoppedCap)))
	defer t.Stop()
	var rc relayClose
	select {
	case rc = <-w.closed:
	case <-t.C:
		c.e.conns.forget(w.client)
		return false, fmt.Sprintf("the relay had not closed the connection %s after the request", c.e.h.stoppedCap)
	case <-ctx.Done():
		c.e.conns.forget(w.client)
		return false, "the run ended before the relay closed the connection"
	}
	c.hc.closedBy(c.kind, sent, rc)
	got, ok := drain()
	c.settle()
	return ok, fmt.Sprintf("closed %.1f s after the request: %s", rc.At.Sub(sent).Seconds(), got)
}

// dialWS opens the connection's WebSocket with a small receive buffer and
// no compression.
func (c *hostileConn) dialWS(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h := c.headers()
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	conn, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(c.e.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPClient: c.client, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("websocket dial: HTTP %d: %w", resp.StatusCode, err)
		}
		return nil, fmt.Errorf("websocket dial: %w", err)
	}
	conn.SetReadLimit(64 << 20)
	return conn, nil
}

// rawConn dials the relay for a hand-written request.
func (c *hostileConn) rawConn(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	return d.DialContext(ctx, "tcp", c.e.addr)
}

// requestHead writes a request line and headers (without the blank line
// that ends them).
func requestHead(method, path, host string, h http.Header) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	return b.String()
}

// slowloris sends half a request's headers and then nothing: the relay
// must close the connection within its read header timeout.
func (c *hostileConn) slowloris(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	head := requestHead(http.MethodPost, "/backend-api/codex/responses", c.e.addr, c.headers()) + "X-Hostile: half-sent"
	if _, err := io.WriteString(conn, head); err != nil {
		return false, "write: " + err.Error()
	}
	c.placed()
	return c.awaitClose(ctx, conn, c.e.h.headerTimeout)
}

// awaitClose waits for the relay to close conn within limit (0: serve's
// read header timeout) and a margin.
func (c *hostileConn) awaitClose(ctx context.Context, conn net.Conn, limit time.Duration) (bool, string) {
	if limit <= 0 {
		limit = relayHTTPServer(nil, c.e.log).ReadHeaderTimeout
	}
	_ = conn.SetReadDeadline(time.Now().Add(limit + hostileMargin))
	got, err := io.ReadAll(io.LimitReader(conn, 64<<10))
	if ctx.Err() != nil {
		return false, "released before the relay closed it"
	}
	c.settle()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, fmt.Sprintf("still open after %s", limit+hostileMargin)
	}
	return true, fmt.Sprintf("closed after %d bytes: %s", len(got), firstLine(got))
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(line)
}

// wsHandshake sends a WebSocket handshake on a raw connection and reads
// the answer's head.
func (c *hostileConn) wsHandshake(conn net.Conn) (*http.Response, error) {
	h := c.headers()
	h.Set("Upgrade", "websocket")
	h.Set("Connection", "Upgrade")
	h.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	h.Set("Sec-WebSocket-Version", "13")
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	if _, err := io.WriteString(conn, requestHead(http.MethodGet, "/backend-api/codex/responses", c.e.addr, h)+"\r\n"); err != nil {
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	_ = conn.SetReadDeadline(time.Time{})
	return resp, err
}

// wsSilent finishes a WebSocket handshake and then neither reads, sends
// nor closes until released.
func (c *hostileConn) wsSilent(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	resp, err := c.wsHandshake(conn)
	if err != nil {
		return false, "handshake: " + err.Error()
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return false, fmt.Sprintf("handshake: HTTP %d", resp.StatusCode)
	}
	c.placed()
	<-ctx.Done()
	return true, "101, held"
}

// wsIdleTurn runs one short turn on a WebSocket, then neither reads, sends
// nor closes until released: its session keeps an idle lane, which the
// pool must hand to others when it runs out.
func (c *hostileConn) wsIdleTurn(ctx context.Context) (bool, string) {
	conn, err := c.dialWS(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.CloseNow()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	msg, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "idle after this [[sim:words 5]]"}}}}})
	if err := conn.Write(tctx, websocket.MessageText, msg); err != nil {
		return false, "write: " + err.Error()
	}
	for {
		_, data, err := conn.Read(tctx)
		if err != nil {
			return false, "read: " + err.Error()
		}
		typ, _ := wire.EventType(data)
		if typ == wire.EventResponseCompleted {
			break
		}
		if wire.IsTerminal(typ) || typ == "error" {
			return false, clipText(string(data), 200)
		}
	}
	c.placed()
	<-ctx.Done()
	return true, "completed, held"
}

// slowBody sends a request's headers and then its body one byte every
// readEvery: the relay must answer 408 within its body read timeout.
func (c *hostileConn) slowBody(ctx context.Context) (bool, string) {
	conn, err := c.rawConn(ctx)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := c.headers()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", "100000")
	if _, err := io.WriteString(conn, requestHead(http.MethodPost, "/backend-api/codex/responses", c.e.addr, h)+"\r\n{"); err != nil {
		return false, "write: " + err.Error()
	}
	c.placed()
	answered := make(chan struct{})
	var got []byte
	var readErr error
	go func() {
		defer close(answered)
		_ = conn.SetReadDeadline(time.Now().Add(c.e.h.bodyTimeout + hostileMargin))
		got, readErr = io.ReadAll(io.LimitReader(conn, 64<<10))
	}()
	t := time.NewTicker(c.e.h.readEvery)
	defer t.Stop()
loop:
	for {
		select {
		case <-answered:
			break loop
		case <-t.C:
			_, _ = io.WriteString(conn, " ") // fails once the relay closed: the reader sees it
		}
	}
	if ctx.Err() != nil {
		return false, "released before the relay answered"
	}
	c.settle()
	if errors.Is(readErr, os.ErrDeadlineExceeded) {
		return false, fmt.Sprintf("no answer within %s", c.e.h.bodyTimeout+hostileMargin)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
	if err != nil {
		return false, fmt.Sprintf("answer: %v (%d bytes)", err, len(got))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusRequestTimeout && jsonErrorCode(b) == "request_timeout" {
		return true, "408 request_timeout"
	}
	return false, fmt.Sprintf("HTTP %d %s", resp.StatusCode, clipText(string(b), 200))
}

// jsonErrorCode is the code (or type) of a JSON error answer.
func jsonErrorCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return cmpOr(e.Error.Code, e.Error.Type)
}

// probe is one request at or over a limit, and the answer it must get.
type probe struct {
	name, expect string
	run          func(ctx context.Context) (got string, ok bool)
}

// probes sends every limit probe, one after another (the largest hold tens
// of MiB each), and reports their answers.
func (e *hostileEnv) probes(ctx context.Context) []hostileProbe {
	var out []hostileProbe
	for _, p := range e.probeList() {
		pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		start := time.Now()
		got, ok := p.run(pctx)
		took := time.Since(start)
		cancel()
		out = append(out, hostileProbe{Name: p.name, Expect: p.expect, Got: clipText(got, 300), OK: ok, Ms: ms(took)})
	}
	return out
}

func (e *hostileEnv) probeList() []probe {
	limit, maxMsg := e.h.maxBody, e.h.maxMessage
	const headerLimit = 1 << 20 // relayHTTPServer's MaxHeaderBytes
	completed := "200 and response.completed"
	tooLarge := "413 request_too_large"
	return []probe{
		{"body at the limit", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, paddedRequest(e.probeSession(), int(limit)), "", http.StatusOK, "")
		}},
		{"body one byte over", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, paddedRequest(e.probeSession(), int(limit)+1), "", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"zstd body inflating to the limit", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, zstdOf(paddedRequest(e.probeSession(), int(limit))), "zstd", http.StatusOK, "")
		}},
		{"zstd bomb (inflates to 16x the limit)", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, zstdOf(paddedRequest(e.probeSession(), int(16*limit))), "zstd", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"gzip bomb (inflates to 16x the limit)", tooLarge, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, nil, gzipOf(paddedRequest(e.probeSession(), int(16*limit))), "gzip", http.StatusRequestEntityTooLarge, "request_too_large")
		}},
		{"headers filling the limit (64 of 16 KiB)", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(64, headerLimit/64-64), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"headers 8 KiB over the limit", "431", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(65, headerLimit/64), paddedRequest(e.probeSession(), 0), "", http.StatusRequestHeaderFieldsTooLarge, "")
		}},
		{"10,000 headers", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(10000, 8), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"one header of 1 MiB less 4 KiB", completed, func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(1, headerLimit-4<<10), paddedRequest(e.probeSession(), 0), "", http.StatusOK, "")
		}},
		{"one header of 2 MiB", "431", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, floodHeaders(1, 2*headerLimit), paddedRequest(e.probeSession(), 0), "", http.StatusRequestHeaderFieldsTooLarge, "")
		}},
		{"Session-Id of 257 bytes", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Session-Id": {strings.Repeat("s", 257)}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"Thread-Id with a tab", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Thread-Id": {"thread\t" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"Thread-Id with a control byte (refused by the HTTP server)", "400", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Thread-Id": {"thread\x01" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "")
		}},
		{"Session-Id of bytes that are not UTF-8", "400 invalid_header", func(ctx context.Context) (string, bool) {
			return e.httpProbe(ctx, http.Header{"Session-Id": {"\xff\xfe" + e.probeSession()}}, paddedRequest("", 0), "", http.StatusBadRequest, "invalid_header")
		}},
		{"WebSocket message at the limit", "response.completed", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)), false, 0)
		}},
		{"WebSocket message one byte over", "close 1009", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)+1), false, websocket.StatusMessageTooBig)
		}},
		{"WebSocket deflate bomb (inflates past the limit)", "close 1009", func(ctx context.Context) (string, bool) {
			return e.wsProbe(ctx, paddedCreate(int(maxMsg)+1), true, websocket.StatusMessageTooBig)
		}},
		{"WebSocket handshake with 2 MiB of headers", "431", func(ctx context.Context) (string, bool) {
			return e.wsHandshakeProbe(ctx, floodHeaders(1, 2*headerLimit), http.StatusRequestHeaderFieldsTooLarge)
		}},
		{"WebSocket handshake with a Session-Id of 257 bytes", "400", func(ctx context.Context) (string, bool) {
			return e.wsHandshakeProbe(ctx, http.Header{"Session-Id": {strings.Repeat("s", 257)}}, http.StatusBadRequest)
		}},
	}
}

func (e *hostileEnv) probeSession() string { return store.NewID("probe", time.Now()) }

// paddedRequest is a short Responses request padded with trailing JSON
// whitespace to exactly size bytes (when size is larger than it).
func paddedRequest(session string, size int) []byte {
	req := map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "probe [[sim:words 3]]"}}}}}
	if session != "" {
		req["prompt_cache_key"] = session
	}
	b, _ := json.Marshal(req)
	return padTo(b, size)
}

// paddedCreate is paddedRequest as a response.create message.
func paddedCreate(size int) []byte {
	b, _ := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "probe [[sim:words 3]]"}}}}})
	return padTo(b, size)
}

func padTo(b []byte, size int) []byte {
	if size <= len(b) {
		return b
	}
	out := make([]byte, size)
	copy(out, b)
	for i := len(b); i < size; i++ {
		out[i] = ' '
	}
	return out
}

func zstdOf(b []byte) []byte {
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

func gzipOf(b []byte) []byte {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

// floodHeaders is n headers of size bytes each (name included).
func floodHeaders(n, size int) http.Header {
	h := http.Header{}
	for i := range n {
		name := "X-Flood-" + strconv.Itoa(i)
		h[name] = []string{strings.Repeat("f", max(size-len(name)-4, 1))}
	}
	return h
}

// httpProbe sends body with extra headers on a connection of its own (hand
// written, so hostile values go as they are) and checks the answer: status,
// and the JSON error's code, or for 200 a stream that completes.
func (e *hostileEnv) httpProbe(ctx context.Context, extra http.Header, body []byte, encoding string, status int, code string) (string, bool) {
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", e.addr)
	if err != nil {
		return err.Error(), false
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := e.target.header(0)
	if extra.Get("Session-Id") == "" && extra.Get("Thread-Id") == "" {
		h.Set("Session-Id", e.probeSession())
	}
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "text/event-stream")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Connection", "close")
	if encoding != "" {
		h.Set("Content-Encoding", encoding)
	}
	// Write while reading: a relay that refuses the headers answers before
	// taking the body.
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		_, _ = io.WriteString(w, requestHead(http.MethodPost, "/backend-api/codex/responses", e.addr, h)+"\r\n")
		_, _ = w.Write(body)
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if floodRefused(err, status) {
			return "the connection closed on the header flood (its 431 lost to the reset): " + err.Error(), true
		}
		return "no answer: " + err.Error(), false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	got := fmt.Sprintf("%d %s", resp.StatusCode, cmpOr(jsonErrorCode(b), clipText(string(b), 120)))
	if resp.StatusCode != status {
		return got, false
	}
	if status == http.StatusOK {
		if err != nil || !bytes.Contains(b, []byte("event: "+wire.EventResponseCompleted)) {
			return fmt.Sprintf("200 without response.completed (%v): %s", err, clipText(string(b), 200)), false
		}
		return "200 and response.completed", true
	}
	if code != "" && jsonErrorCode(b) != code {
		return got, false
	}
	return got, true
}

// wsProbe sends msg on a WebSocket of its own (compressed when deflate) and
// checks the answer: a completed response when want is 0, else the close
// code want.
func (e *hostileEnv) wsProbe(ctx context.Context, msg []byte, deflate bool, want websocket.StatusCode) (string, bool) {
	mode := websocket.CompressionDisabled
	if deflate {
		mode = websocket.CompressionNoContextTakeover
	}
	h := e.target.header(0)
	h.Set("Session-Id", e.probeSession())
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPHeader: h, CompressionMode: mode, CompressionThreshold: 1})
	if err != nil {
		if resp != nil {
			return fmt.Sprintf("dial: HTTP %d", resp.StatusCode), false
		}
		return "dial: " + err.Error(), false
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20)
	// Read while writing: a relay that refuses the message closes the
	// connection before taking all of it.
	type result struct {
		typ string
		err error
	}
	read := make(chan result, 1)
	go func() {
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				read <- result{err: err}
				return
			}
			typ, _ := wire.EventType(data)
			if wire.IsTerminal(typ) || typ == "error" {
				read <- result{typ: typ + " " + clipText(string(data), 200)}
				return
			}
		}
	}()
	werr := conn.Write(ctx, websocket.MessageText, msg)
	msg = nil
	r := <-read
	got := r.typ
	if r.err != nil {
		got = fmt.Sprintf("close %d (%v)", websocket.CloseStatus(r.err), r.err)
		if st := websocket.CloseStatus(r.err); st == -1 && werr != nil {
			got += fmt.Sprintf("; write: %v", werr)
		}
	}
	if want == 0 {
		return got, strings.HasPrefix(got, wire.EventResponseCompleted)
	}
	return got, websocket.CloseStatus(r.err) == want
}

// wsHandshakeProbe sends a WebSocket handshake with extra headers and
// checks its status.
func (e *hostileEnv) wsHandshakeProbe(ctx context.Context, extra http.Header, status int) (string, bool) {
	c := &hostileConn{e: e, session: e.probeSession()}
	conn, err := c.rawConn(ctx)
	if err != nil {
		return err.Error(), false
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	h := c.headers()
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Upgrade", "websocket")
	h.Set("Connection", "Upgrade")
	h.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	h.Set("Sec-WebSocket-Version", "13")
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		_, _ = io.WriteString(w, requestHead(http.MethodGet, "/backend-api/codex/responses", e.addr, h)+"\r\n")
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if floodRefused(err, status) {
			return "the connection closed on the header flood (its 431 lost to the reset): " + err.Error(), true
		}
		return "no answer: " + err.Error(), false
	}
	resp.Body.Close()
	return fmt.Sprintf("HTTP %d", resp.StatusCode), resp.StatusCode == status
}

// floodRefused reports a header flood refused without its answer read:
// the server answers 431 and closes while the flood is still coming, and
// when the client has not read the answer by then (a loaded machine), the
// reset discards it. Refused either way.
func floodRefused(err error, status int) bool {
	return status == http.StatusRequestHeaderFieldsTooLarge &&
		(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
}

// openFDs counts this process's open sockets among its file descriptors
// (-1 where /proc/self/fd is not there): what a connection left behind
// holds. Files are not counted: the store's connection pool opens its
// database file again as it grows under load, and keeps it.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// openFileLimit is the soft limit on open files (/proc/self/limits; 0 where
// unknown). Go raises it to the hard limit at start.
func openFileLimit() int {
	b, err := os.ReadFile("/proc/self/limits")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}

// printHostile prints the hostile report as text.
func printHostile(w io.Writer, r hostileReport) {
	fmt.Fprintf(w, "codex-relay bench -hostile: %d well-behaved sessions (half HTTP, half WebSocket) x %d turns of %d words in %d deltas %.0f ms apart, %d accounts\n",
		r.Sessions, r.Turns, r.Words, r.Deltas, r.PaceMs, r.Accounts)
	fmt.Fprintf(w, "hostile: %d slow readers, %d stopped readers, %d half-open connections; machine: %d CPUs (GOMAXPROCS %d) %s, %s, open files limit %d\n",
		r.SlowReaders, r.Stopped, r.HalfOpen, r.CPUs, r.GOMAXPROCS, r.CPUModel, r.GoVersion, r.FDLimit)
	l := r.Limits
	fmt.Fprintf(w, "relay limits: body %s, WebSocket message %s, headers %s, header timeout %.0f ms, body timeout %.0f ms, client write timeout %.0f ms, %d lanes per account\n\n",
		mibText(l.MaxBodyBytes), mibText(l.MaxMessageBytes), mibText(int64(l.MaxHeaderBytes)), l.ReadHeaderTimeoutMs, l.BodyReadTimeoutMs, l.ClientWriteTimeoutMs, l.LanesPerAccount)
	fmt.Fprintf(w, "%-28s %12s %12s %8s\n", "well-behaved", "quiet", "hostile", "ratio")
	fmt.Fprintf(w, "%-28s %12.0f %12.0f %7.2fx\n", "first token p50 (ms)", r.Quiet.FirstToken.P50, r.Hostile.FirstToken.P50, r.Ratio.P50)
	fmt.Fprintf(w, "%-28s %12.0f %12.0f %7.2fx\n", "first token p99 (ms)", r.Quiet.FirstToken.P99, r.Hostile.FirstToken.P99, r.Ratio.P99)
	fmt.Fprintf(w, "%-28s %12.0f %12.0f\n", "turn p50 (ms)", r.Quiet.Turn.P50, r.Hostile.Turn.P50)
	fmt.Fprintf(w, "%-28s %12d %12d\n", "turns", r.Quiet.Turns, r.Hostile.Turns)
	fmt.Fprintf(w, "%-28s %12d %12d\n", "errors", r.Quiet.Errors, r.Hostile.Errors)
	fmt.Fprintf(w, "%-28s %12s %12s\n\n", "peak RSS over start", mibText(r.Quiet.PeakRSS), mibText(r.Memory.PeakRSS))
	fmt.Fprintf(w, "hostile connections:\n")
	for _, g := range r.Clients {
		fmt.Fprintf(w, "  %-50s %5d/%-5d %s%s\n", g.Kind, g.AsExpected, g.Count, g.Expect, other(g.FirstOther))
	}
	for _, l := range r.LetGo {
		fmt.Fprintf(w, "  %s: writes blocked p50 %.1f s, max %.1f s after the request, having taken p50 %s (max %s); closed p50 %.1f s, max %.1f s after the request\n",
			l.Kind, l.BlockedAfter.P50/1000, l.BlockedAfter.Max/1000, mibText(l.WrittenP50), mibText(l.WrittenMax), l.ClosedAfter.P50/1000, l.ClosedAfter.Max/1000)
	}
	fmt.Fprintf(w, "probes:\n")
	for _, p := range r.Probes {
		mark := "ok  "
		if !p.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-50s expected %s, got %s (%.1f s)\n", mark, p.Name, p.Expect, p.Got, p.Ms/1000)
	}
	m := r.Memory
	fmt.Fprintf(w, "\nmemory: RSS %s at the start; +%s with every hostile connection in place (%.0f KiB each); peak +%s\n",
		mibText(m.StartRSS), mibText(m.InPlaceRSS), m.PerConnection/1024, mibText(m.PeakRSS))
	fmt.Fprintf(w, "bound: %s\nkernel TCP buffers (machine-wide, outside RSS): peak +%s\n", m.Formula, mibText(m.KernelTCP))
	fmt.Fprintf(w, "goroutines: start %d, peak %d, end %d; open sockets: start %d, peak %d, end %d\n",
		r.Goroutines.Start, r.Goroutines.Peak, r.Goroutines.End, r.FDs.Start, r.FDs.Peak, r.FDs.End)
	fmt.Fprintf(w, "client_stalled attempts: %d; penalised accounts: %v; %.0f s\n\nchecks:\n", r.StalledAttempts, r.PenalisedAccounts, r.Seconds)
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %s (%s)\n", mark, c.Name, c.Detail)
	}
}
