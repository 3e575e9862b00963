// Package bench is codex-relay bench: it measures what the relay adds over
// the simulated upstream against a plain byte-copying proxy, the physical
// limit (the phases of compare, see Purpose), the memory of idle sessions
// (-idle), the relay over a long run with faults on both sides (-soak,
// soak.go) and the relay under hostile clients (-hostile, hostile.go).
// Everything runs in this process on loopback, and the relay is assembled
// as codex-relay serve assembles it (cmd/internal/app): its web front and
// the HTTP server's limits are in every figure.
//
// Run is the command; cmd/codex-relay hands it a flag set and its output.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"time"
)

// Purpose is the bench's description, for its -help.
const Purpose = `Measure what the relay adds, against the physical limit. The same conversations run
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

// Run is codex-relay bench: it registers the bench's flags on fs (whose
// output and usage are the caller's), parses args, runs what they ask for
// (the comparison, -idle, -soak or -hostile) and prints its report on
// stdout. newLogger makes the relay's logger at the -log-level given.
// The error says what failed: a flag, the run, or its checks (a soak's
// violations, a hostile run's failed bounds).
func Run(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer, newLogger func(level string) (*slog.Logger, error)) error {
	cmd, err := parseCommand(fs, args)
	if err != nil {
		return err
	}
	o := cmd.o
	log, err := newLogger(cmd.logLevel)
	if err != nil {
		return err
	}
	if o.hostile.on {
		return runHostile(ctx, stdout, cmd.given, o, log, cmd.asJSON)
	}
	if o.idleProfile != "" && o.idle == 0 {
		return errors.New("bench: -idleprofile needs -idle")
	}
	if o.busyProfile != "" && o.idle > 0 {
		return errors.New("bench: -busyprofile is for the turn workload or -soak, not -idle")
	}
	stopProfiles, err := startProfiles(cmd.profiles, o.idleProfile != "" || o.busyProfile != "")
	if err != nil {
		return err
	}
	if o.soak > 0 {
		rep, err := soak(ctx, o, log)
		if perr := stopProfiles(); err == nil {
			err = perr
		}
		if err != nil {
			return err
		}
		if err := writeReport(stdout, cmd.asJSON, rep, printSoak); err != nil {
			return err
		}
		if len(rep.Violations) > 0 {
			return errSoakViolations
		}
		return nil
	}
	rep, err := compare(ctx, o, log)
	if perr := stopProfiles(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	return writeReport(stdout, cmd.asJSON, rep, printBench)
}

// writeReport prints a report as indented JSON, or as text.
func writeReport[R any](w io.Writer, asJSON bool, rep R, text func(io.Writer, R)) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	text(w, rep)
	return nil
}

// compare runs the workload (or the idle mode) against every target, on
// every transport, and compares them.
func compare(ctx context.Context, o options, log *slog.Logger) (benchReport, error) {
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

	env, stop, err := startEnv(ctx, o, log)
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

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
