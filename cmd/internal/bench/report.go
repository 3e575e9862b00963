package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/codexrelay/codex-relay/relay"
)

// benchReport is what bench prints (as tables, or as JSON with -json).
type benchReport struct {
	// The workload.
	Conversations int     `json:"conversations"`
	Turns         int     `json:"turns_per_conversation"`
	Words         int     `json:"words_per_answer"`
	Deltas        int     `json:"deltas_per_answer"` // 0: the sim's default
	PaceMs        float64 `json:"pace_ms"`           // between events; 0: unpaced
	RampMs        float64 `json:"ramp_ms"`
	Burst         bool    `json:"burst"`
	IdleSessions  int     `json:"idle_sessions,omitempty"`
	IdleHoldMs    float64 `json:"idle_hold_ms,omitempty"`
	Accounts      int     `json:"accounts"`
	ClientDeflate bool    `json:"client_deflate"`
	Prewarm       bool    `json:"prewarm"`
	// UpstreamCompression is what the relay's upstream lanes offered,
	// SimCompression how the sim answered (the relay's rows carry the
	// client side's).
	Compressions        []relay.CompressionMode `json:"compressions"`
	UpstreamCompression string                  `json:"upstream_compression"`
	SimCompression      string                  `json:"sim_compression"`
	// The machine.
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model,omitempty"`
	GoVersion  string `json:"go_version"`
	Database   string `json:"database"` // sqlite or postgres

	// Rows are the phases of the turn workload, Tables their comparison
	// per transport (and relay compression); Idle and IdleTables the same
	// for -idle. Compression puts the relay's phases side by side.
	Rows        []benchRow         `json:"rows,omitempty"`
	Tables      []benchTable       `json:"tables,omitempty"`
	Idle        []benchIdleRow     `json:"idle,omitempty"`
	IdleTables  []benchTable       `json:"idle_tables,omitempty"`
	Compression []benchCompression `json:"compression,omitempty"`
	Method      []string           `json:"method"`
	Goroutines  benchGoroutine     `json:"goroutines"`
}

// benchGoroutine counts goroutines before the bench started its servers
// and after it stopped them: equal when nothing was left behind.
type benchGoroutine struct {
	Before int `json:"before"`
	After  int `json:"after"`
}

// benchMethod says how the figures are taken; the report carries it.
var benchMethod = []string{
	"Each target runs in its own phase, one after another, in this one process, which also runs the clients and the simulated upstream.",
	"CPU: user+system time of the whole process (getrusage RUSAGE_SELF) from a phase's first session start to its last session end, divided by the events the clients received. \"Over direct\" subtracts the direct phase's figure (the same clients and sim with nothing between them); nothing else is subtracted.",
	"Events: every SSE event or WebSocket message a client read; the sim's count (its records of response requests) is shown beside it.",
	"First event and first output token: from writing the request to reading the first event, and the first response.output_text.delta; turn: to reading response.completed.",
	"Memory: Go heap in use (objects and their spans' free space, runtime/metrics), goroutine stacks, and RSS (/proc/self/statm), sampled every 50 ms; \"peak\" is the highest sample over the phase's start, read after two collections (the second empties sync.Pools) and returning freed memory to the system. Idle: read the same way once every session is open and idle.",
	"The pipe copies with io.Copy between two TCP connections, which on Linux splices in the kernel: its bytes never enter the process.",
}

// benchTable compares the targets on one transport (or idle), as rows of
// the performance issue's table.
type benchTable struct {
	Title string `json:"title"`
	// Transport is http, ws or idle; Compression the relay phase's
	// compression setting ("" where it does not apply).
	Transport   string      `json:"transport"`
	Compression string      `json:"compression,omitempty"`
	Lines       []benchLine `json:"lines"`
}

// line returns the table's line for measure (zero when it has none).
func (t benchTable) line(measure string) benchLine {
	for _, l := range t.Lines {
		if l.Measure == measure {
			return l
		}
	}
	return benchLine{}
}

// benchLine is one measure for each target (nil: the target did not run
// or the figure does not apply) and relay against pipe.
type benchLine struct {
	Measure string   `json:"measure"`
	Unit    string   `json:"unit"`
	Direct  *float64 `json:"direct"`
	Pipe    *float64 `json:"pipe"`
	Relay   *float64 `json:"relay"`
	// RelayVsPipe is relay/pipe when Compare is "ratio" and relay−pipe
	// when it is "difference".
	RelayVsPipe *float64 `json:"relay_vs_pipe"`
	Compare     string   `json:"compare,omitempty"`
}

// line builds a line from a figure of each target's row.
func line[R any](measure, unit, compare string, rows map[string]*R, fig func(*R) (float64, bool)) benchLine {
	l := benchLine{Measure: measure, Unit: unit, Compare: compare}
	get := func(target string) *float64 {
		r := rows[target]
		if r == nil {
			return nil
		}
		v, ok := fig(r)
		if !ok {
			return nil
		}
		return ptr(v)
	}
	l.Direct, l.Pipe, l.Relay = get(targetDirect), get(targetPipe), get(targetRelay)
	if l.Pipe != nil && l.Relay != nil {
		switch compare {
		case "ratio":
			if *l.Pipe > 0 {
				l.RelayVsPipe = ptr(*l.Relay / *l.Pipe)
			}
		case "difference":
			l.RelayVsPipe = ptr(*l.Relay - *l.Pipe)
		}
	}
	return l
}

func always(v float64) (float64, bool) { return v, true }

const kib, mib = 1024.0, 1024.0 * 1024.0

// compareTables lays a transport's phases out as the tables: one
// for each relay phase (one a compression setting), beside the same
// direct and pipe phases.
func compareTables(transport string, rows []benchRow) []benchTable {
	others, relays := splitRelayRows(rows, func(r benchRow) string { return r.Target })
	if len(relays) == 0 {
		return []benchTable{compareTable(transport, rows)}
	}
	var tables []benchTable
	for _, r := range relays {
		t := compareTable(transport, append(slices.Clone(others), r))
		t.Compression = r.Compression
		if len(relays) > 1 {
			t.Title += ", relay compression " + r.Compression
		}
		tables = append(tables, t)
	}
	return tables
}

// splitRelayRows separates the relay's rows from the others'.
func splitRelayRows[R any](rows []R, target func(R) string) (others, relays []R) {
	for _, r := range rows {
		if target(r) == targetRelay {
			relays = append(relays, r)
		} else {
			others = append(others, r)
		}
	}
	return others, relays
}

// benchCompression is one relay phase's figures that change with its
// compression setting, beside the pipe's.
type benchCompression struct {
	Transport   string `json:"transport"` // http, ws or idle
	Compression string `json:"compression"`
	// Turn workloads: CPU per event over direct and relay/pipe; the
	// clients' wire bytes per turn (in+out); peak RSS over direct per
	// session; first output token p50/p99 and its difference to the pipe.
	CPUPerEventUs     *float64 `json:"cpu_per_event_over_direct_us,omitempty"`
	CPUVsPipe         *float64 `json:"cpu_relay_vs_pipe,omitempty"`
	WireKiBPerTurn    *float64 `json:"wire_kib_per_turn,omitempty"`
	PeakRSSPerSession *float64 `json:"peak_rss_over_direct_per_session_kib,omitempty"`
	FirstTokenP50     *float64 `json:"first_token_p50_ms,omitempty"`
	FirstTokenP99     *float64 `json:"first_token_p99_ms,omitempty"`
	FirstTokenP50Pipe *float64 `json:"first_token_p50_vs_pipe_ms,omitempty"`
	FirstTokenP99Pipe *float64 `json:"first_token_p99_vs_pipe_ms,omitempty"`
	// Idle sessions: RSS and heap+stacks per session over direct.
	IdleRSSPerSession  *float64 `json:"idle_rss_over_direct_per_session_kib,omitempty"`
	IdleHeapPerSession *float64 `json:"idle_heap_stacks_over_direct_per_session_kib,omitempty"`
}

// compressionTable gathers the relay phases' compression figures from
// their comparison tables.
func compressionTable(tables []benchTable) []benchCompression {
	var out []benchCompression
	for _, t := range tables {
		if t.Compression == "" {
			continue
		}
		c := benchCompression{Transport: t.Transport, Compression: t.Compression}
		if t.Transport == "idle" {
			c.IdleRSSPerSession = t.line("RSS per session, over direct").Relay
			c.IdleHeapPerSession = t.line("heap+stacks per session, over direct").Relay
		} else {
			cpu, p50, p99 := t.line("CPU per forwarded event, over direct"), t.line("first output token p50"), t.line("first output token p99")
			c.CPUPerEventUs, c.CPUVsPipe = cpu.Relay, cpu.RelayVsPipe
			c.WireKiBPerTurn = t.line("client wire bytes per turn, in+out").Relay
			c.PeakRSSPerSession = t.line("peak RSS over direct, per session").Relay
			c.FirstTokenP50, c.FirstTokenP99, c.FirstTokenP50Pipe, c.FirstTokenP99Pipe = p50.Relay, p99.Relay, p50.RelayVsPipe, p99.RelayVsPipe
		}
		out = append(out, c)
	}
	return out
}

// compareTable lays a transport's phases out as the table.
func compareTable(transport string, rows []benchRow) benchTable {
	by := map[string]*benchRow{}
	for i := range rows {
		by[rows[i].Target] = &rows[i]
	}
	direct := by[targetDirect]
	overDirect := func(f func(*benchRow) float64) func(*benchRow) (float64, bool) {
		return func(r *benchRow) (float64, bool) {
			if direct == nil || r.Target == targetDirect {
				return 0, false
			}
			return f(r) - f(direct), true
		}
	}
	perSession := func(v int64, r *benchRow) float64 { return float64(v) / float64(max(r.Sessions, 1)) }
	cpuPerEvent := func(r *benchRow) float64 { return r.CPUPerEventUs }
	peakRSS := func(r *benchRow) float64 { return float64(r.PeakRSS) }
	peakHeap := func(r *benchRow) float64 { return float64(r.PeakHeap + r.PeakStacks) }
	var sessions int
	if len(rows) > 0 {
		sessions = rows[0].Sessions
	}
	title := map[string]string{"http": "HTTP/SSE", "ws": "WebSocket"}[transport]
	return benchTable{Title: fmt.Sprintf("%s, %d sessions", title, sessions), Transport: transport, Lines: []benchLine{
		line("turns completed", "", "", by, func(r *benchRow) (float64, bool) { return always(float64(r.Turns)) }),
		line("turns failed", "", "", by, func(r *benchRow) (float64, bool) { return always(float64(r.Errors)) }),
		line("events received by the clients", "", "", by, func(r *benchRow) (float64, bool) { return always(float64(r.Events)) }),
		line("events the sim sent", "", "", by, func(r *benchRow) (float64, bool) { return always(float64(r.SimEvents)) }),
		line("CPU per event, whole process", "µs", "ratio", by, func(r *benchRow) (float64, bool) { return always(r.CPUPerEventUs) }),
		line("CPU per forwarded event, over direct", "µs", "ratio", by, overDirect(cpuPerEvent)),
		line("CPU in use", "cores", "ratio", by, func(r *benchRow) (float64, bool) { return r.CPUSeconds / r.Seconds, r.Seconds > 0 }),
		line("events forwarded per second", "events/s", "ratio", by, func(r *benchRow) (float64, bool) { return always(r.EventsPerSecond) }),
		line("first event p50", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstEvent.P50) }),
		line("first event p99", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstEvent.P99) }),
		line("first output token p50", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstToken.P50) }),
		line("first output token p99", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstToken.P99) }),
		line("first turn's first output token p50", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstTurnToken.P50) }),
		line("first turn's first output token p99", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.FirstTurnToken.P99) }),
		line("turn p50", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.Turn.P50) }),
		line("turn p99", "ms", "difference", by, func(r *benchRow) (float64, bool) { return always(r.Turn.P99) }),
		line("peak RSS over start", "MiB", "ratio", by, func(r *benchRow) (float64, bool) { return always(float64(r.PeakRSS) / mib) }),
		line("peak RSS over direct", "MiB", "ratio", by, overDirect(func(r *benchRow) float64 { return peakRSS(r) / mib })),
		line("peak heap+stacks over start", "MiB", "ratio", by, func(r *benchRow) (float64, bool) { return always(peakHeap(r) / mib) }),
		line("peak heap+stacks over direct, per session", "KiB", "ratio", by, overDirect(func(r *benchRow) float64 { return peakHeap(r) / float64(max(r.Sessions, 1)) / kib })),
		line("peak RSS over direct, per session", "KiB", "ratio", by, overDirect(func(r *benchRow) float64 { return peakRSS(r) / float64(max(r.Sessions, 1)) / kib })),
		line("peak goroutines over start, per session", "", "ratio", by, func(r *benchRow) (float64, bool) { return always(perSession(int64(r.PeakGoroutines), r)) }),
		line("allocations per event, whole process", "", "ratio", by, func(r *benchRow) (float64, bool) { return always(r.AllocsPerEvent) }),
		line("allocated per turn, whole process", "KiB", "ratio", by, func(r *benchRow) (float64, bool) { return always(r.AllocBytes / kib) }),
		line("client connections opened", "", "", by, func(r *benchRow) (float64, bool) { return always(float64(r.ClientConns)) }),
		line("client wire bytes per turn, in+out", "KiB", "ratio", by, func(r *benchRow) (float64, bool) {
			return float64(r.WireBytesIn+r.WireBytesOut) / float64(r.Turns) / kib, r.Turns > 0
		}),
		line("event payload bytes per event", "B", "ratio", by, func(r *benchRow) (float64, bool) {
			return float64(r.EventBytes) / float64(r.Events), r.Events > 0
		}),
	}}
}

// idleTables lays the idle phases out, one table a relay phase.
func idleTables(rows []benchIdleRow) []benchTable {
	others, relays := splitRelayRows(rows, func(r benchIdleRow) string { return r.Target })
	if len(relays) == 0 {
		if t := idleTable(rows); t != nil {
			return []benchTable{*t}
		}
		return nil
	}
	var tables []benchTable
	for _, r := range relays {
		t := idleTable(append(slices.Clone(others), r))
		t.Compression = r.Compression
		if len(relays) > 1 {
			t.Title += ", relay compression " + r.Compression
		}
		tables = append(tables, *t)
	}
	return tables
}

// idleTable lays the idle phases out: memory per idle session.
func idleTable(rows []benchIdleRow) *benchTable {
	if len(rows) == 0 {
		return nil
	}
	by := map[string]*benchIdleRow{}
	for i := range rows {
		by[rows[i].Target] = &rows[i]
	}
	direct := by[targetDirect]
	overDirect := func(f func(*benchIdleRow) float64) func(*benchIdleRow) (float64, bool) {
		return func(r *benchIdleRow) (float64, bool) {
			if direct == nil || r.Target == targetDirect || r.Open == 0 {
				return 0, false
			}
			return f(r) - f(direct), true
		}
	}
	perOpen := func(v float64, r *benchIdleRow) (float64, bool) { return v / float64(r.Open), r.Open > 0 }
	return &benchTable{Title: fmt.Sprintf("idle WebSocket sessions, %d on each target", rows[0].Sessions), Transport: "idle", Lines: []benchLine{
		line("sessions open", "", "", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.Open)) }),
		line("sessions failed", "", "", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.Errors)) }),
		line("events received by the clients", "", "", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.Events)) }),
		line("events the sim sent", "", "", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.SimEvents)) }),
		line("heap in use per session", "KiB", "ratio", by, func(r *benchIdleRow) (float64, bool) { return perOpen(float64(r.Heap)/kib, r) }),
		line("goroutine stacks per session", "KiB", "ratio", by, func(r *benchIdleRow) (float64, bool) { return perOpen(float64(r.Stacks)/kib, r) }),
		line("RSS per session", "KiB", "ratio", by, func(r *benchIdleRow) (float64, bool) { return perOpen(float64(r.RSS)/kib, r) }),
		line("goroutines per session", "", "ratio", by, func(r *benchIdleRow) (float64, bool) { return perOpen(float64(r.Goroutines), r) }),
		line("heap+stacks per session, over direct", "KiB", "ratio", by, overDirect(func(r *benchIdleRow) float64 { return (r.HeapPerSession + r.StacksPerSession) / kib })),
		line("RSS per session, over direct", "KiB", "ratio", by, overDirect(func(r *benchIdleRow) float64 { return r.RSSPerSession / kib })),
		line("RSS, all sessions", "MiB", "ratio", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.RSS) / mib) }),
		line("peak RSS while opening", "MiB", "ratio", by, func(r *benchIdleRow) (float64, bool) { return always(float64(r.PeakRSS) / mib) }),
		line("time to open all (one turn each)", "s", "ratio", by, func(r *benchIdleRow) (float64, bool) { return always(r.OpenSecond) }),
	}}
}

func printBench(w io.Writer, r benchReport) {
	fmt.Fprintf(w, "%d CPUs (GOMAXPROCS %d) %s, %s, relay on %s\n", r.CPUs, r.GOMAXPROCS, r.CPUModel, r.GoVersion, r.Database)
	deflate := "offer no compression"
	if r.ClientDeflate {
		deflate = "offer permessage-deflate with context takeover"
	}
	deflate += fmt.Sprintf("; the relay answers %v, its upstream lanes offer %s, the sim answers %s", r.Compressions, r.UpstreamCompression, r.SimCompression)
	if r.Prewarm {
		deflate += "; each session prewarms (generate:false) as it connects"
	}
	if r.IdleSessions > 0 {
		fmt.Fprintf(w, "%d idle WebSocket sessions per target (one turn of %d words each, then held open %.0f ms), %d accounts; clients %s\n",
			r.IdleSessions, r.Words, r.IdleHoldMs, r.Accounts, deflate)
	} else {
		pace := "unpaced"
		if r.PaceMs > 0 {
			pace = fmt.Sprintf("events %.0f ms apart", r.PaceMs)
		}
		deltas := "the sim's default deltas"
		if r.Deltas > 0 {
			deltas = fmt.Sprintf("%d deltas", r.Deltas)
		}
		start := "all started at once"
		switch {
		case r.Burst:
			start = "connected first, then every first turn at the same instant (burst)"
		case r.RampMs > 0:
			start = fmt.Sprintf("started over %.0f ms", r.RampMs)
		}
		fmt.Fprintf(w, "%d sessions x %d turns, %d words in %s per answer, %s, %s, %d accounts; WebSocket clients %s\n",
			r.Conversations, r.Turns, r.Words, deltas, pace, start, r.Accounts, deflate)
	}
	for _, t := range r.Tables {
		fmt.Fprintln(w)
		printTable(w, t)
	}
	for _, t := range r.IdleTables {
		fmt.Fprintln(w)
		printTable(w, t)
	}
	if len(r.Compression) > 0 {
		fmt.Fprintln(w)
		printCompression(w, r)
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		if row.FirstError != "" {
			fmt.Fprintf(w, "%s %s: %d turns failed, the first: %s\n", row.Transport, row.Target, row.Errors, row.FirstError)
		}
	}
	for _, row := range r.Idle {
		if row.FirstError != "" {
			fmt.Fprintf(w, "idle %s: %d sessions failed, the first: %s\n", row.Target, row.Errors, row.FirstError)
		}
	}
	for _, m := range r.Method {
		fmt.Fprintf(w, "- %s\n", m)
	}
	leak := ""
	if r.Goroutines.After > r.Goroutines.Before {
		leak = "  (some did not end)"
	}
	fmt.Fprintf(w, "goroutines: %d before, %d after%s\n", r.Goroutines.Before, r.Goroutines.After, leak)
}

// printCompression prints the relay's phases side by side.
func printCompression(w io.Writer, r benchReport) {
	fmt.Fprintf(w, "relay by client-side compression (upstream lanes offer %s, the sim answers %s)\n", r.UpstreamCompression, r.SimCompression)
	fmt.Fprintf(w, "%-10s %-9s %14s %8s %12s %16s %22s %18s\n", "transport", "setting", "CPU/event µs", "vs pipe", "wire KiB/turn", "peak RSS KiB/ses", "first token p50/p99 ms", "vs pipe p50/p99")
	for _, c := range r.Compression {
		if c.Transport == "idle" {
			fmt.Fprintf(w, "%-10s %-9s idle: RSS %s KiB a session, heap+stacks %s KiB (over direct)\n", c.Transport, c.Compression,
				cell(c.IdleRSSPerSession, "KiB"), cell(c.IdleHeapPerSession, "KiB"))
			continue
		}
		vs := ""
		if c.CPUVsPipe != nil {
			vs = fmt.Sprintf("%.2fx", *c.CPUVsPipe)
		}
		fmt.Fprintf(w, "%-10s %-9s %14s %8s %12s %16s %22s %18s\n", c.Transport, c.Compression, cell(c.CPUPerEventUs, "µs"), vs,
			cell(c.WireKiBPerTurn, "KiB"), cell(c.PeakRSSPerSession, "KiB"),
			cell(c.FirstTokenP50, "ms")+" / "+cell(c.FirstTokenP99, "ms"), cell(c.FirstTokenP50Pipe, "ms")+" / "+cell(c.FirstTokenP99Pipe, "ms"))
	}
}

func printTable(w io.Writer, t benchTable) {
	fmt.Fprintf(w, "%s\n%-48s %12s %12s %12s %14s\n", t.Title, "measure", "direct", "pipe", "relay", "relay vs pipe")
	for _, l := range t.Lines {
		measure := l.Measure
		if l.Unit != "" {
			measure += " (" + l.Unit + ")"
		}
		fmt.Fprintf(w, "%-48s %12s %12s %12s %14s\n", measure, cell(l.Direct, l.Unit), cell(l.Pipe, l.Unit), cell(l.Relay, l.Unit), versus(l))
	}
}

func cell(v *float64, unit string) string {
	if v == nil {
		return "-"
	}
	switch unit {
	case "µs", "KiB", "MiB", "B":
		return fmt.Sprintf("%.1f", *v)
	case "events/s":
		return fmt.Sprintf("%.0f", *v)
	case "ms", "cores", "s":
		return fmt.Sprintf("%.2f", *v)
	case "":
		if *v == float64(int64(*v)) {
			return fmt.Sprintf("%.0f", *v)
		}
		return fmt.Sprintf("%.2f", *v)
	}
	return fmt.Sprintf("%g", *v)
}

func versus(l benchLine) string {
	if l.RelayVsPipe == nil {
		return ""
	}
	if l.Compare == "ratio" {
		return fmt.Sprintf("%.2fx", *l.RelayVsPipe)
	}
	return strings.TrimSuffix(fmt.Sprintf("%+.2f %s", *l.RelayVsPipe, l.Unit), " ")
}

func ptr[T any](v T) *T { return &v }

// clipText cuts s to n runes, marking the cut.
func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
