package bench

import (
	"context"
	"net/http"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// memSamplePeriod is how often a phase samples the process's memory for
// its peaks.
const memSamplePeriod = 50 * time.Millisecond

// benchRow is one workload against one target over one transport: one
// phase, measured on its own.
type benchRow struct {
	Transport string `json:"transport"` // http or ws
	Target    string `json:"target"`    // direct, pipe or relay
	// Compression is the relay's answer to the clients' deflate offer
	// (relay rows only).
	Compression string `json:"compression,omitempty"`
	Sessions    int    `json:"sessions"`
	Turns       int    `json:"turns"` // completed turns
	Errors      int    `json:"errors"`
	FirstError  string `json:"first_error,omitempty"`

	// Events the clients received, and the sim says it sent in answers to
	// response requests during the phase; their payload bytes (SSE data or
	// WebSocket message, as the client read it).
	Events     int64 `json:"events"`
	SimEvents  int64 `json:"sim_events"`
	EventBytes int64 `json:"event_bytes"`
	// Bytes the clients read and wrote on their connections (headers,
	// framing and compression included), and the bytes the pipe copied
	// both ways (pipe only).
	WireBytesIn  int64 `json:"wire_bytes_in"`
	WireBytesOut int64 `json:"wire_bytes_out"`
	PipeBytes    int64 `json:"pipe_bytes,omitempty"`
	// ClientConns is how many connections the clients opened: one per
	// session when HTTP connections are kept alive across turns.
	ClientConns int64 `json:"client_connections"`

	Seconds float64 `json:"seconds"`
	// CPU time of the whole process over the phase (getrusage), and per
	// event received.
	CPUSeconds     float64 `json:"cpu_seconds"`
	CPUUserSeconds float64 `json:"cpu_user_seconds"`
	CPUSysSeconds  float64 `json:"cpu_sys_seconds"`
	CPUPerEventUs  float64 `json:"cpu_per_event_us"`

	EventsPerSecond float64 `json:"events_per_second"`
	TurnsPerSecond  float64 `json:"turns_per_second"`

	FirstEvent percentiles `json:"first_event_ms"`
	FirstToken percentiles `json:"first_token_ms"` // first response.output_text.delta
	// FirstTurnToken is the first output token of sessions' first turns
	// only (the new threads of -burst).
	FirstTurnToken percentiles `json:"first_turn_first_token_ms"`
	Turn           percentiles `json:"turn_ms"`

	// Allocations in the whole process (clients, sim, target).
	AllocBytes     float64 `json:"alloc_bytes_per_turn"`
	Allocs         float64 `json:"allocs_per_turn"`
	AllocsPerEvent float64 `json:"allocs_per_event"`
	GCCycles       uint32  `json:"gc_cycles"`

	// Peaks of the phase over its start (after a collection): Go heap in
	// use, goroutine stacks, RSS, goroutines.
	PeakHeap       int64 `json:"peak_heap_bytes"`
	PeakStacks     int64 `json:"peak_stack_bytes"`
	PeakRSS        int64 `json:"peak_rss_bytes"`
	PeakGoroutines int   `json:"peak_goroutines"`
}

// phase runs the workload against one target over one transport and
// measures it: memory settled at the start, then CPU, wall time and
// allocations from the first session's start to the last one's end.
func (e *benchEnv) phase(ctx context.Context, targetName string, compression relay.CompressionMode, transport string) (benchRow, error) {
	o := e.o
	row := benchRow{Transport: transport, Target: targetName, Compression: string(compression), Sessions: o.conversations}
	target, stopTarget, err := e.target(ctx, targetName, compression)
	if err != nil {
		return row, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stopTarget()
		}
	}()
	var wc wireCounter
	client := benchClient(o.conversations, &wc)
	defer client.CloseIdleConnections()
	e.upstream.ClearRecords()

	base := settledMemUse()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	watch := watchMemory(memSamplePeriod)
	clock := startCPUClock()
	start := time.Now()

	var busy *busyMoment
	profiled := make(chan error, 1)
	ended := make(chan struct{}) // the workload ended
	if o.busyProfile != "" && targetName == o.targets[len(o.targets)-1] && transport == o.transports[len(o.transports)-1] {
		busy = newBusyMoment(o.conversations)
		go func() { profiled <- busy.profile(targetName, o.busyProfile, o.busyDeadline(), ended) }()
	}
	var samples []turnSample
	var errs []error
	pprof.Do(ctx, pprof.Labels("component", "client"), func(ctx context.Context) {
		samples, errs = runWorkload(ctx, client, target, transport, o, busy)
	})
	close(ended)
	if busy != nil {
		if err := <-profiled; err != nil {
			watch.Stop()
			return row, err
		}
	}

	row.Seconds = time.Since(start).Seconds()
	user, sys, cpuOK := clock.elapsed()
	peak := watch.Stop()
	runtime.ReadMemStats(&after)
	client.CloseIdleConnections()
	row.PipeBytes = stopTarget()
	stopped = true
	row.SimEvents = e.simEvents()

	row.WireBytesIn, row.WireBytesOut, row.ClientConns = wc.in.Load(), wc.out.Load(), wc.dials.Load()
	row.PeakHeap, row.PeakStacks, row.PeakRSS = peak.Heap-base.Heap, peak.Stacks-base.Stacks, peak.RSS-base.RSS
	row.PeakGoroutines = peak.Goroutines - base.Goroutines
	row.GCCycles = after.NumGC - before.NumGC
	row.Turns, row.Errors = len(samples), len(errs)
	if len(errs) > 0 {
		row.FirstError = errs[0].Error()
	}
	var first, firstEvent, firstTurn, total []time.Duration
	for _, s := range samples {
		row.Events += int64(s.events)
		row.EventBytes += int64(s.eventBytes)
		first = append(first, s.firstToken)
		firstEvent = append(firstEvent, s.firstEvent)
		total = append(total, s.total)
		if s.turn == 0 {
			firstTurn = append(firstTurn, s.firstToken)
		}
	}
	row.FirstToken, row.FirstEvent, row.FirstTurnToken, row.Turn =
		percentilesOf(first), percentilesOf(firstEvent), percentilesOf(firstTurn), percentilesOf(total)
	if cpuOK {
		row.CPUUserSeconds, row.CPUSysSeconds = user.Seconds(), sys.Seconds()
		row.CPUSeconds = row.CPUUserSeconds + row.CPUSysSeconds
	}
	if row.Events > 0 {
		row.CPUPerEventUs = row.CPUSeconds / float64(row.Events) * 1e6
		row.AllocsPerEvent = float64(after.Mallocs-before.Mallocs) / float64(row.Events)
		row.EventsPerSecond = float64(row.Events) / row.Seconds
	}
	if row.Turns > 0 {
		row.TurnsPerSecond = float64(row.Turns) / row.Seconds
		row.AllocBytes = float64(after.TotalAlloc-before.TotalAlloc) / float64(row.Turns)
		row.Allocs = float64(after.Mallocs-before.Mallocs) / float64(row.Turns)
	}
	return row, nil
}

// runWorkload runs every session against target: all at once, spread over
// -ramp, or (-burst) connected first and then released together. busy,
// when set, hears of each session's first output and of its end.
func runWorkload(ctx context.Context, client *http.Client, target benchTarget, transport string, o options, busy *busyMoment) ([]turnSample, []error) {
	var (
		mu      sync.Mutex
		samples []turnSample
		errs    []error
		wg      sync.WaitGroup
	)
	n := o.conversations
	// The burst barrier: every session calls ready once (connected, or
	// failed), and the first turns start when all have.
	var connected sync.WaitGroup
	release := make(chan struct{})
	connected.Add(n)
	go func() {
		connected.Wait()
		close(release)
	}()
	for conv := range n {
		ready := sync.OnceFunc(func() {
			connected.Done()
			if o.burst {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
		})
		wg.Go(func() {
			defer ready()
			if o.ramp > 0 && conv > 0 {
				t := time.NewTimer(o.ramp * time.Duration(conv) / time.Duration(n))
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			b := &benchConversation{client: client, target: target, conv: conv, o: o,
				session: store.NewID("bench", time.Now()), ready: ready}
			if busy != nil {
				b.output = busy.streamed
				defer busy.ended()
			}
			var got []turnSample
			err := b.run(ctx, transport, func(s turnSample) { got = append(got, s) })
			mu.Lock()
			defer mu.Unlock()
			samples = append(samples, got...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return samples, errs
}

// benchIdleRow is one target's idle sessions: memory per session once they
// are all open and idle.
type benchIdleRow struct {
	Target      string  `json:"target"`
	Compression string  `json:"compression,omitempty"` // the relay's, as in benchRow
	Sessions    int     `json:"sessions"`              // asked for
	Open        int     `json:"open"`                  // opened, one turn done, held
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	OpenSecond  float64 `json:"open_seconds"` // to open them all, turns included
	Events      int64   `json:"events"`
	SimEvents   int64   `json:"sim_events"`
	// Growth over the start, settled (collected, freed memory returned)
	// with every session open and idle.
	Heap       int64 `json:"heap_bytes"`
	Stacks     int64 `json:"stack_bytes"`
	RSS        int64 `json:"rss_bytes"`
	Goroutines int   `json:"goroutines"`
	// Peaks over the start while the sessions opened.
	PeakHeap int64 `json:"peak_heap_bytes"`
	PeakRSS  int64 `json:"peak_rss_bytes"`
	// Per open session.
	HeapPerSession       float64 `json:"heap_bytes_per_session"`
	StacksPerSession     float64 `json:"stack_bytes_per_session"`
	RSSPerSession        float64 `json:"rss_bytes_per_session"`
	GoroutinesPerSession float64 `json:"goroutines_per_session"`
}

// idleOpeners bounds how many idle sessions open at once.
const idleOpeners = 64

// idlePhase opens -idle WebSocket sessions on one target, runs one turn on
// each, holds them open (each with a reader, as Codex keeps one) and reads
// the memory they hold.
func (e *benchEnv) idlePhase(ctx context.Context, targetName string, compression relay.CompressionMode) (benchIdleRow, error) {
	o := e.o
	row := benchIdleRow{Target: targetName, Compression: string(compression), Sessions: o.idle}
	target, stopTarget, err := e.target(ctx, targetName, compression)
	if err != nil {
		return row, err
	}
	defer stopTarget()
	var wc wireCounter
	client := benchClient(o.idle, &wc)
	defer client.CloseIdleConnections()
	e.upstream.ClearRecords()

	base := settledMemUse()
	watch := watchMemory(memSamplePeriod)
	start := time.Now()

	holdCtx, release := context.WithCancel(ctx)
	defer release()
	var (
		mu      sync.Mutex
		conns   []*websocket.Conn
		errs    []error
		readers sync.WaitGroup
	)
	pprof.Do(ctx, pprof.Labels("component", "client"), func(ctx context.Context) {
		var wg sync.WaitGroup
		slots := make(chan struct{}, idleOpeners)
		for conv := range o.idle {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				b := &benchConversation{client: client, target: target, conv: conv, o: o, session: store.NewID("bench", time.Now())}
				conn, err := b.dial(ctx)
				if err == nil {
					var events int
					err = b.runWebSocket(ctx, conn, 1, func(s turnSample) { events = s.events })
					mu.Lock()
					row.Events += int64(events)
					mu.Unlock()
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					if conn != nil {
						conn.CloseNow()
					}
					return
				}
				conns = append(conns, conn)
				// Keep reading, as a client does: control frames are
				// answered, and the session ends when it is closed.
				readers.Go(func() {
					for {
						if _, _, err := conn.Read(holdCtx); err != nil {
							return
						}
					}
				})
			})
		}
		wg.Wait()
	})
	row.OpenSecond = time.Since(start).Seconds()
	if o.idleHold > 0 {
		t := time.NewTimer(o.idleHold)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	peak := watch.Stop()
	held := settledMemUse()
	if o.idleProfile != "" && targetName == o.targets[len(o.targets)-1] {
		if err := writeHeapProfile(o.idleProfile); err != nil {
			return row, err
		}
	}
	row.Open, row.Errors = len(conns), len(errs)
	if len(errs) > 0 {
		row.FirstError = errs[0].Error()
	}
	row.Heap, row.Stacks, row.RSS = held.Heap-base.Heap, held.Stacks-base.Stacks, held.RSS-base.RSS
	row.Goroutines = held.Goroutines - base.Goroutines
	row.PeakHeap, row.PeakRSS = peak.Heap-base.Heap, peak.RSS-base.RSS
	if row.Open > 0 {
		n := float64(row.Open)
		row.HeapPerSession, row.StacksPerSession = float64(row.Heap)/n, float64(row.Stacks)/n
		row.RSSPerSession, row.GoroutinesPerSession = float64(row.RSS)/n, float64(row.Goroutines)/n
	}

	// Close them all, a few at a time, with a normal closure.
	var wg sync.WaitGroup
	slots := make(chan struct{}, 256)
	for _, c := range conns {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			_ = c.Close(websocket.StatusNormalClosure, "")
		})
	}
	wg.Wait()
	release()
	readers.Wait()
	row.SimEvents = e.simEvents()
	return row, nil
}
