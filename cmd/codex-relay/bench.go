package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/relay/sim"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

const benchPurpose = `Measure what the relay adds. The same conversations run first straight against the
simulated upstream, then through the relay (on SQLite in a temp folder), over HTTP/SSE
and over WebSocket, the way Codex sends them (HTTP resends the whole history; WebSocket
chains with previous_response_id). Reports time to first token and per-turn latency
percentiles, throughput, the relay's added allocations per turn, and whether every
goroutine ended. Everything runs in this process on loopback: nothing leaves the machine.`

// benchOptions is one bench run's workload.
type benchOptions struct {
	conversations int
	turns         int
	words         int
	accounts      int
	transports    []string
	turnTimeout   time.Duration
	databaseURL   string // "" for a SQLite file in a temp folder
}

// benchReport is what bench prints (as a table, or as JSON with -json).
type benchReport struct {
	Conversations int            `json:"conversations"`
	Turns         int            `json:"turns_per_conversation"`
	Words         int            `json:"words_per_answer"`
	Accounts      int            `json:"accounts"`
	CPUs          int            `json:"cpus"`
	Database      string         `json:"database"` // sqlite or postgres
	GoVersion     string         `json:"go_version"`
	Rows          []benchRow     `json:"rows"`
	Overhead      []benchAdded   `json:"overhead"`
	Goroutines    benchGoroutine `json:"goroutines"`
}

// benchRow is one workload against one target over one transport.
type benchRow struct {
	Transport  string      `json:"transport"` // http or ws
	Target     string      `json:"target"`    // direct or relay
	Turns      int         `json:"turns"`     // completed turns
	Errors     int         `json:"errors"`
	FirstError string      `json:"first_error,omitempty"`
	FirstToken percentiles `json:"first_token_ms"`
	Turn       percentiles `json:"turn_ms"`
	PerSecond  float64     `json:"turns_per_second"`
	// Allocations in the whole process (client, relay and sim) per turn.
	AllocBytes float64 `json:"alloc_bytes_per_turn"`
	Allocs     float64 `json:"allocs_per_turn"`
}

// benchAdded is what the relay adds over going direct, per transport.
type benchAdded struct {
	Transport    string  `json:"transport"`
	FirstTokenMs float64 `json:"first_token_p50_ms"`
	TurnMs       float64 `json:"turn_p50_ms"`
	AllocBytes   float64 `json:"alloc_bytes_per_turn"`
	Allocs       float64 `json:"allocs_per_turn"`
}

// benchGoroutine counts goroutines before the bench started its servers
// and after it stopped them: equal when nothing was left behind.
type benchGoroutine struct {
	Before int `json:"before"`
	After  int `json:"after"`
}

type percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func runBench(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "bench", benchPurpose)
	var o benchOptions
	fs.IntVar(&o.conversations, "conversations", 32, "conversations run at once")
	fs.IntVar(&o.turns, "turns", 5, "turns in every conversation")
	fs.IntVar(&o.words, "words", 40, "words in every answer (streamed as one delta each)")
	fs.IntVar(&o.accounts, "accounts", 4, "simulated accounts in the relay's pool")
	transports := fs.String("transport", "http,ws", "transports to measure: http, ws, or both comma-separated")
	fs.DurationVar(&o.turnTimeout, "turn-timeout", 30*time.Second, "deadline of one turn")
	fs.StringVar(&o.databaseURL, "database-url", "", "an empty database to run the relay on, e.g. a throwaway postgres://... (default: SQLite in a temp folder); a database holding accounts is refused")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	logLevel := fs.String("log-level", "error", "relay log level: debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof reads it)")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	for name, v := range map[string]int{"-conversations": o.conversations, "-turns": o.turns, "-words": o.words, "-accounts": o.accounts} {
		if v < 1 || v > 10000 {
			return fmt.Errorf("bench: %s must be between 1 and 10000, not %d", name, v)
		}
	}
	if o.turnTimeout <= 0 {
		return errors.New("bench: -turn-timeout must be positive")
	}
	for t := range strings.SplitSeq(*transports, ",") {
		switch t = strings.TrimSpace(t); t {
		case "http", "ws":
			if !slices.Contains(o.transports, t) {
				o.transports = append(o.transports, t)
			}
		default:
			return fmt.Errorf("bench: -transport: %q is not http or ws", t)
		}
	}
	log, err := newLogger(c.stderr, "text", *logLevel)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 4096
	}
	rep, err := bench(ctx, c, o, log)
	if err != nil {
		return err
	}
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printBench(c.stdout, rep)
	return nil
}

// bench runs the workload direct and through the relay, on every transport.
func bench(ctx context.Context, c cli, o benchOptions, log *slog.Logger) (benchReport, error) {
	rep := benchReport{Conversations: o.conversations, Turns: o.turns, Words: o.words, Accounts: o.accounts,
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
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

	dir, err := os.MkdirTemp("", "codex-relay-bench-*")
	if err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	stops = append(stops, func() { os.RemoveAll(dir) })

	var simAccounts []sim.Account
	for i := range o.accounts {
		id := fmt.Sprintf("bench-%d", i+1)
		simAccounts = append(simAccounts, sim.Account{ID: id, AccessToken: "at-" + id, RefreshToken: "rt-" + id, Organization: "org-bench"})
	}
	upstream, stopSim, err := startSim(sim.Config{Accounts: simAccounts, MaxRecords: 100, Logger: log.With("component", "sim")}, "127.0.0.1:0", log)
	if err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	stops = append(stops, stopSim)

	dbURL := cmp.Or(o.databaseURL, "sqlite:"+filepath.Join(dir, "bench.db"))
	st, secret, err := openStoreWithKey(ctx, c, dbFlags{databaseURL: dbURL}, log, false)
	if err != nil {
		return rep, err
	}
	stops = append(stops, func() { st.Close() })
	if existing, err := st.Accounts(ctx); err != nil {
		return rep, err
	} else if len(existing) > 0 {
		return rep, fmt.Errorf("bench: the database at %s holds accounts: give an empty one (the bench adds its own)", st.Location())
	}
	rep.Database = string(st.Dialect())
	for _, a := range simAccounts {
		if _, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: a.ID, BaseURL: upstream.CodexBaseURL(),
			ChatGPTAccountID: a.ID, Organization: a.Organization}, store.Credentials{AccessToken: a.AccessToken, RefreshToken: a.RefreshToken}); err != nil {
			return rep, err
		}
	}
	_, key, err := st.CreateClientKey(ctx, store.ClientKey{Name: "bench"})
	if err != nil {
		return rep, err
	}
	// The relay as serve runs it: its own address and hop key (so it keeps
	// thread leases), and its housekeeping and heartbeat running.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, fmt.Errorf("bench: listen: %w", err)
	}
	rl := relay.New(relay.Config{Store: st, Logger: log.With("component", "relay"),
		Replica: relay.ReplicaConfig{Address: "http://" + ln.Addr().String(), HopKey: derivedKey(secret, hopKeyPurpose)}})
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); rl.Run(runCtx) }()
	hs := &http.Server{Handler: rl, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	stops = append(stops, func() {
		stopRun()
		<-ran
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		rl.Close() // WebSocket sessions are hijacked: Shutdown does not end them
		<-served
	})

	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: o.conversations + 8}}
	stops = append(stops, client.CloseIdleConnections)
	direct := benchTarget{name: "direct", base: upstream.CodexBaseURL(), header: func(conv int) http.Header {
		a := simAccounts[conv%len(simAccounts)]
		return http.Header{"Authorization": {"Bearer " + a.AccessToken}, "Chatgpt-Account-Id": {a.ID}}
	}}
	viaRelay := benchTarget{name: "relay", base: "http://" + ln.Addr().String() + "/backend-api/codex", header: func(int) http.Header {
		return http.Header{"Authorization": {"Bearer " + key}}
	}}
	for _, transport := range o.transports {
		var rows [2]benchRow
		for i, target := range []benchTarget{direct, viaRelay} {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			rows[i] = runWorkload(ctx, client, target, transport, o)
			rep.Rows = append(rep.Rows, rows[i])
		}
		rep.Overhead = append(rep.Overhead, benchAdded{Transport: transport,
			FirstTokenMs: rows[1].FirstToken.P50 - rows[0].FirstToken.P50, TurnMs: rows[1].Turn.P50 - rows[0].Turn.P50,
			AllocBytes: rows[1].AllocBytes - rows[0].AllocBytes, Allocs: rows[1].Allocs - rows[0].Allocs})
	}

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

// benchTarget is where a workload goes: the sim itself, or the relay.
type benchTarget struct {
	name   string
	base   string                     // .../backend-api/codex
	header func(conv int) http.Header // credentials for conversation conv
}

// turnSample is one completed turn's timings.
type turnSample struct{ firstToken, total time.Duration }

// runWorkload runs every conversation at once against target and measures.
func runWorkload(ctx context.Context, client *http.Client, target benchTarget, transport string, o benchOptions) benchRow {
	row := benchRow{Transport: transport, Target: target.name}
	var (
		mu      sync.Mutex
		samples []turnSample
		errs    []error
		wg      sync.WaitGroup
	)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for conv := range o.conversations {
		wg.Go(func() {
			conv := &benchConversation{client: client, target: target, conv: conv, o: o, session: store.NewID("bench", time.Now())}
			var got []turnSample
			err := conv.run(ctx, transport, func(s turnSample) { got = append(got, s) })
			mu.Lock()
			defer mu.Unlock()
			samples = append(samples, got...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)

	row.Turns, row.Errors = len(samples), len(errs)
	if len(errs) > 0 {
		row.FirstError = errs[0].Error()
	}
	if row.Turns == 0 {
		return row
	}
	first := make([]time.Duration, len(samples))
	total := make([]time.Duration, len(samples))
	for i, s := range samples {
		first[i], total[i] = s.firstToken, s.total
	}
	row.FirstToken, row.Turn = percentilesOf(first), percentilesOf(total)
	row.PerSecond = float64(row.Turns) / elapsed.Seconds()
	row.AllocBytes = float64(after.TotalAlloc-before.TotalAlloc) / float64(row.Turns)
	row.Allocs = float64(after.Mallocs-before.Mallocs) / float64(row.Turns)
	return row
}

// percentilesOf returns nearest-rank percentiles of ds in milliseconds.
func percentilesOf(ds []time.Duration) percentiles {
	slices.Sort(ds)
	at := func(p float64) float64 {
		i := max(int(math.Ceil(p*float64(len(ds))))-1, 0)
		return float64(ds[i]) / float64(time.Millisecond)
	}
	return percentiles{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: at(1)}
}

// benchConversation is one conversation of a workload: a session whose
// root thread sends turns one after another, as Codex does.
type benchConversation struct {
	client  *http.Client
	target  benchTarget
	conv    int
	o       benchOptions
	session string
}

func (b *benchConversation) headers() http.Header {
	h := b.target.header(b.conv)
	h.Set("Session-Id", b.session)
	h.Set("Thread-Id", b.session)
	h.Set("Originator", "codex-relay-bench")
	return h
}

func (b *benchConversation) prompt(turn int) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text",
		"text": fmt.Sprintf("bench turn %d [[sim:words %d]]", turn+1, b.o.words)}}}
}

func (b *benchConversation) run(ctx context.Context, transport string, sample func(turnSample)) error {
	if transport == "ws" {
		return b.runWebSocket(ctx, sample)
	}
	return b.runHTTP(ctx, sample)
}

// runHTTP resends the whole history every turn, as Codex does over HTTP.
func (b *benchConversation) runHTTP(ctx context.Context, sample func(turnSample)) error {
	var history []any
	for turn := range b.o.turns {
		history = append(history, b.prompt(turn))
		body, err := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false,
			"prompt_cache_key": b.session, "input": history})
		if err != nil {
			return err
		}
		s, output, err := b.httpTurn(ctx, body)
		if err != nil {
			return fmt.Errorf("%s http turn %d: %w", b.target.name, turn+1, err)
		}
		sample(s)
		history = append(history, output...)
	}
	return nil
}

func (b *benchConversation) httpTurn(ctx context.Context, body []byte) (turnSample, []any, error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.target.base+"/responses", bytes.NewReader(body))
	if err != nil {
		return turnSample{}, nil, err
	}
	req.Header = b.headers()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return turnSample{}, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return turnSample{}, nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var s turnSample
	events := wire.NewSSEReader(resp.Body, 0, 0)
	for {
		ev, err := events.Next()
		if err != nil {
			return turnSample{}, nil, fmt.Errorf("stream ended before response.completed: %w", err)
		}
		done, output, err := b.event(ev.Data, start, &s)
		if done || err != nil {
			return s, output, err
		}
	}
}

// runWebSocket keeps one connection and chains turns with
// previous_response_id, sending only the new input, as Codex does.
func (b *benchConversation) runWebSocket(ctx context.Context, sample func(turnSample)) error {
	dctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	h := b.headers()
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	conn, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(b.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPClient: b.client, HTTPHeader: h})
	cancel()
	if err != nil {
		if resp != nil {
			return fmt.Errorf("%s websocket dial: HTTP %d: %w", b.target.name, resp.StatusCode, err)
		}
		return fmt.Errorf("%s websocket dial: %w", b.target.name, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20)
	previous := ""
	for turn := range b.o.turns {
		msg := map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
			"prompt_cache_key": b.session, "input": []any{b.prompt(turn)}}
		if previous != "" {
			msg["previous_response_id"] = previous
		}
		s, id, err := b.wsTurn(ctx, conn, msg)
		if err != nil {
			return fmt.Errorf("%s websocket turn %d: %w", b.target.name, turn+1, err)
		}
		sample(s)
		previous = id
	}
	return conn.Close(websocket.StatusNormalClosure, "")
}

func (b *benchConversation) wsTurn(ctx context.Context, conn *websocket.Conn, msg map[string]any) (turnSample, string, error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	data, err := json.Marshal(msg)
	if err != nil {
		return turnSample{}, "", err
	}
	start := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
		return turnSample{}, "", err
	}
	var s turnSample
	for {
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return turnSample{}, "", err
		}
		done, _, err := b.event(frame, start, &s)
		if err != nil {
			return turnSample{}, "", err
		}
		if done {
			var ev struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			if err := json.Unmarshal(frame, &ev); err != nil || ev.Response.ID == "" {
				return turnSample{}, "", fmt.Errorf("response.completed without a response id")
			}
			return s, ev.Response.ID, nil
		}
	}
}

// event reads one event of a turn that started at start: the first text
// delta sets the time to first token; response.completed ends the turn
// with its output items; any other terminal event is an error.
func (b *benchConversation) event(data []byte, start time.Time, s *turnSample) (done bool, output []any, err error) {
	typ, _ := wire.EventType(data)
	switch {
	case typ == "response.output_text.delta" && s.firstToken == 0:
		s.firstToken = time.Since(start)
	case typ == "response.completed":
		s.total = time.Since(start)
		if s.firstToken == 0 {
			return true, nil, errors.New("response.completed before any text")
		}
		var ev struct {
			Response struct {
				Output []any `json:"output"`
			} `json:"response"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return true, nil, fmt.Errorf("response.completed: %w", err)
		}
		return true, ev.Response.Output, nil
	case wire.IsTerminal(typ) || typ == "error":
		return true, nil, fmt.Errorf("%s: %s", typ, clipText(string(data), 300))
	}
	return false, nil, nil
}

func printBench(w io.Writer, r benchReport) {
	fmt.Fprintf(w, "%d conversations x %d turns, %d words per answer, %d accounts, %s, %d CPUs, %s\n\n",
		r.Conversations, r.Turns, r.Words, r.Accounts, r.Database, r.CPUs, r.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\ttarget\tturns\terrors\tfirst token p50/p95/p99 ms\tturn p50/p95/p99 ms\tturns/s\tKiB/turn\tallocs/turn\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f / %.2f / %.2f\t%.2f / %.2f / %.2f\t%.0f\t%.1f\t%.0f\t\n", row.Transport, row.Target, row.Turns, row.Errors,
			row.FirstToken.P50, row.FirstToken.P95, row.FirstToken.P99, row.Turn.P50, row.Turn.P95, row.Turn.P99,
			row.PerSecond, row.AllocBytes/1024, row.Allocs)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, a := range r.Overhead {
		fmt.Fprintf(w, "relay adds over %s: %+.2f ms to the first token and %+.2f ms to a turn (p50), %+.1f KiB and %+.0f allocations per turn\n",
			a.Transport, a.FirstTokenMs, a.TurnMs, a.AllocBytes/1024, a.Allocs)
	}
	for _, row := range r.Rows {
		if row.FirstError != "" {
			fmt.Fprintf(w, "%s %s: first error: %s\n", row.Transport, row.Target, row.FirstError)
		}
	}
	leak := ""
	if r.Goroutines.After > r.Goroutines.Before {
		leak = "  (some did not end)"
	}
	fmt.Fprintf(w, "goroutines: %d before, %d after%s\n", r.Goroutines.Before, r.Goroutines.After, leak)
}
