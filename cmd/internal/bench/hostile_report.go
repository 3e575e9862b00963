package bench

import (
	"fmt"
	"io"
	"math"
	"time"
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
