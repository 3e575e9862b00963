package bench

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"sync/atomic"
	"time"
)

// profilePaths are the files the whole run's profiles go to ("": not
// written): -cpuprofile, -memprofile, -mutexprofile, -blockprofile and
// -trace.
type profilePaths struct {
	cpu, mem, mutex, block, trace string
}

// startProfiles starts the profiles asked for and returns what writes
// them at the end of the run; heap samples allocations finely for the
// heap profiles taken during it (-idleprofile, -busyprofile).
func startProfiles(p profilePaths, heap bool) (stop func() error, err error) {
	cpuPath, memPath, mutexPath, blockPath, tracePath := p.cpu, p.mem, p.mutex, p.block, p.trace
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

// writeHeapProfile writes the memory in use now (as of the last
// collection) to path.
func writeHeapProfile(path string) error { return writeProfile(path, "heap", 0) }

// writeGoroutines writes every goroutine's stack to path, as a panic
// prints them: where each session waits, and (with the binary's frame
// sizes) how deep its stack is.
func writeGoroutines(path string) error { return writeProfile(path, "goroutine", 2) }

// writeProfile writes the runtime profile name to path (debug as
// pprof.Profile.WriteTo takes it).
func writeProfile(path, name string, debug int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, debug); err != nil {
		return fmt.Errorf("bench: %s profile: %w", name, err)
	}
	return f.Close()
}

// busyMoment is when -busyprofile takes its profiles of a phase: once
// every session has read output (its first response.output_text.delta),
// as its client sees it. Every session has started then, and is streaming
// unless it already ended (with a -ramp longer than a session lasts, the
// first ones have). Safe for concurrent use.
type busyMoment struct {
	sessions int
	waiting  atomic.Int64  // sessions yet to read output
	running  atomic.Int64  // sessions whose workload has not ended
	reached  chan struct{} // closed when waiting reaches zero
}

func newBusyMoment(sessions int) *busyMoment {
	b := &busyMoment{sessions: sessions, reached: make(chan struct{})}
	b.waiting.Store(int64(sessions))
	b.running.Store(int64(sessions))
	return b
}

// streamed notes a session's first output; once per session.
func (b *busyMoment) streamed() {
	if b.waiting.Add(-1) == 0 {
		close(b.reached)
	}
}

// ended notes the end of a session's workload; once per session.
func (b *busyMoment) ended() { b.running.Add(-1) }

// profile waits for the moment, at most limit, then writes every
// goroutine's stack to path.goroutines (first: where the sessions wait as
// they stream) and the heap in use after a collection to path. It fails
// when the phase (named phase) ended before the moment (ended closed), when
// the moment did not come within limit, and when every session had ended
// by the time the profiles were written: they are of the phase at work,
// or there are none.
func (b *busyMoment) profile(phase, path string, limit time.Duration, ended <-chan struct{}) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-b.reached:
	case <-ended:
		select {
		case <-b.reached: // both at once: the moment came first
		default:
			return fmt.Errorf("bench: -busyprofile: the %s phase ended before every session had read output (%d of %d had)",
				phase, b.sessions-int(b.waiting.Load()), b.sessions)
		}
	case <-t.C:
		return fmt.Errorf("bench: -busyprofile: the %s phase did not have every session read output within %s (%d of %d had)",
			phase, limit, b.sessions-int(b.waiting.Load()), b.sessions)
	}
	if err := writeGoroutines(path + ".goroutines"); err != nil {
		return err
	}
	runtime.GC() // the profile's in-use figures are the last collection's
	if err := writeHeapProfile(path); err != nil {
		return err
	}
	if b.running.Load() == 0 {
		return fmt.Errorf("bench: -busyprofile: the %s phase ended before its profiles were written: every session had read output, and ended before they were (give the phase a longer workload: -turns, -words, -deltas or -pace)", phase)
	}
	return nil
}
