package bench

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/store"
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
	// probeTimeout bounds each limit probe (hostileProbeTimeout).
	probeTimeout time.Duration
	// stoppedCap is how long after its request a stopped reader waits for
	// the relay's writes to it to block (hostileStoppedCap); from then, the
	// relay has its write timeout and hostileMargin to let it go.
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
	// hostileStoppedCap bounds the wait for the relay's writes to a
	// stopped reader to block. They block only once its answer filled the
	// kernel's buffers, which took the relay 9 to 31 s on two shared cores
	// (docs/RELIABILITY.md), and past 30 s under the race detector with
	// the machine loaded 5 times over, depending on the load beside it;
	// then the write timeout runs, and the wait for the relay's close is
	// the tight one (letGo, check). This cap only ends the first wait, with
	// room for a machine several times slower.
	hostileStoppedCap = 3 * time.Minute
	// hostileProbeTimeout bounds one limit probe: the largest send 64 MiB
	// through the relay to the sim and back, about 2 s on a quiet machine.
	hostileProbeTimeout = time.Minute
	// hostileDrain bounds the read of what the kernel's buffers still hold
	// of a stopped reader's answer once the relay let it go (a few MiB).
	hostileDrain   = 30 * time.Second
	hostileOpeners = 64 // hostile connections opened at once
	// hostileMargin is how long past a relay deadline the bench waits to see
	// its effect.
	hostileMargin = 10 * time.Second
)

// runHostile runs the -hostile mode and prints its report; the error says
// which checks failed.
func runHostile(ctx context.Context, stdout io.Writer, given map[string]bool, o options, log *slog.Logger, asJSON bool) error {
	if !given["conversations"] {
		o.conversations = hostileConversations
	}
	if !given["words"] && !given["deltas"] && !given["pace"] {
		o.words, o.deltas, o.pace = pacedWords, pacedDeltas, pacedGap
	}
	h := &o.hostile
	h.answerWords, h.answerEvents, h.answerGap, h.maxMessage = hostileAnswerWords, hostileAnswerEvents, hostileAnswerGap, relay.MaxMessageBytes
	h.probeTimeout, h.stoppedCap = hostileProbeTimeout, hostileStoppedCap
	if !given["accounts"] {
		o.accounts = hostileAccounts(o.conversations, h.slowReaders+h.stopped)
	}
	if err := h.validate(o); err != nil {
		return err
	}
	rep, err := hostileBench(ctx, o, log)
	if err != nil {
		return err
	}
	if err := writeReport(stdout, asJSON, rep, printHostile); err != nil {
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

func (h hostileOptions) validate(o options) error {
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

// hostileEnv is one hostile run's relay and what its clients need. Static
// after hostileBench starts the relay.
type hostileEnv struct {
	*benchEnv
	h      hostileOptions
	addr   string // host:port of the relay
	target benchTarget
	// conns sees the relay's side of its connections (the stopped
	// readers').
	conns relayConns
}

// closeIdle closes the relay's idle upstream lanes and connections, so
// counts compare what clients left behind.
func (e *hostileEnv) closeIdle() {
	e.relay.Server().Bridge().RetireAll()
	e.relay.CloseIdleConnections()
}

// hostileBench runs the quiet phase, then the hostile one, and checks them.
func hostileBench(ctx context.Context, o options, log *slog.Logger) (hostileReport, error) {
	h := o.hostile
	began := time.Now()
	rep := hostileReport{Sessions: o.conversations, Turns: o.turns, Words: o.words, Deltas: o.deltas, PaceMs: ms(o.pace),
		Accounts: o.accounts, SlowReaders: h.slowReaders, Stopped: h.stopped, HalfOpen: h.halfOpen,
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), CPUModel: cpuModel(), FDLimit: openFileLimit()}
	o.targets, o.transports = []string{targetRelay}, []string{"http", "ws"}
	env, stopEnv, err := startEnv(ctx, o, log)
	defer stopEnv()
	if err != nil {
		return rep, err
	}
	he := &hostileEnv{benchEnv: env, h: h}
	stopRelay, err := he.startRelay(ctx)
	if err != nil {
		return rep, err
	}
	defer stopRelay()
	rep.Limits.MaxBodyBytes, rep.Limits.MaxMessageBytes, rep.Limits.MaxHeaderBytes = h.maxBody, relay.MaxMessageBytes, app.MaxHeaderBytes
	rep.Limits.ReadHeaderTimeoutMs, rep.Limits.BodyReadTimeoutMs, rep.Limits.ClientWriteTimeoutMs = ms(h.readHeaderTimeout()), ms(h.bodyTimeout), ms(h.writeTimeout)
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
		watch.Stop()
		levels.stop()
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
	clients.waitSettled(ctx, he.settleDeadline())
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

// startRelay starts the relay for the hostile run as the bench's
// startRelay does, with this run's limits, its listener watched (conns).
func (e *hostileEnv) startRelay(ctx context.Context) (stop func(), err error) {
	opts := e.relayOptions(relay.CompressionPooled)
	opts.MaxBodyBytes, opts.BodyReadTimeout, opts.ClientWriteTimeout, opts.ReadHeaderTimeout = e.h.maxBody, e.h.bodyTimeout, e.h.writeTimeout, e.h.headerTimeout
	url, stop, err := e.serveRelay(ctx, e.conns.listener, opts)
	if err != nil {
		return nil, err
	}
	e.addr = strings.TrimPrefix(url, "http://")
	e.target = benchTarget{name: targetRelay, base: url + "/backend-api/codex", header: func(int) http.Header {
		return http.Header{"Authorization": {"Bearer " + e.key}}
	}}
	return stop, nil
}

// readHeaderTimeout is the relay's header deadline in this run: serve's
// unless lowered.
func (h hostileOptions) readHeaderTimeout() time.Duration {
	return cmp.Or(h.headerTimeout, app.ReadHeaderTimeout)
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
			s, err := runWorkload(ctx, client, e.target, transport, o, nil)
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
func (e *hostileEnv) settleDeadline() time.Duration {
	return max(e.h.readHeaderTimeout()+hostileMargin, e.h.bodyTimeout+hostileMargin, e.h.stoppedCap+e.h.writeTimeout+hostileMargin+hostileDrain+hostileMargin)
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
