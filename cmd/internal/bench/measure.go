package bench

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"
)

// memUse is the process's memory at one moment.
type memUse struct {
	// Heap is the Go heap in use: live and not yet collected objects and
	// the unused space of their spans (runtime.MemStats.HeapInuse).
	Heap int64
	// Stacks is goroutine stack memory (MemStats.StackInuse).
	Stacks int64
	// RSS is the resident set size (/proc/self/statm; 0 where unknown).
	RSS int64
	// Goroutines is runtime.NumGoroutine.
	Goroutines int
}

var memMetricNames = []string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/stacks:bytes",
}

// readMemUse reads the process's memory without stopping the world
// (runtime/metrics, not ReadMemStats), so it can be sampled under load.
func readMemUse() memUse {
	s := make([]metrics.Sample, len(memMetricNames))
	for i, n := range memMetricNames {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(s[i].Value.Uint64())
	}
	return memUse{Heap: v(0) + v(1), Stacks: v(2), RSS: readRSS(), Goroutines: runtime.NumGoroutine()}
}

// settledMemUse collects garbage twice (the second empties what the
// first moved to sync.Pools' victim caches: pooled flate writers are not
// memory a session holds), returns freed memory to the system (so RSS
// drops with it) and reads what is left: the memory the process holds on
// to.
func settledMemUse() memUse {
	runtime.GC()
	debug.FreeOSMemory() // a full collection first
	return readMemUse()
}

func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// memWatch samples the process's memory every few milliseconds and keeps
// the peak of each figure.
type memWatch struct {
	stop chan struct{}
	done chan struct{}
	peak memUse // owned by the sampling goroutine until done is closed
}

// watchMemory starts sampling every period until Stop.
func watchMemory(period time.Duration) *memWatch {
	w := &memWatch{stop: make(chan struct{}), done: make(chan struct{}), peak: readMemUse()}
	go func() {
		defer close(w.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				w.sample()
				return
			case <-t.C:
				w.sample()
			}
		}
	}()
	return w
}

func (w *memWatch) sample() {
	m := readMemUse()
	w.peak.Heap = max(w.peak.Heap, m.Heap)
	w.peak.Stacks = max(w.peak.Stacks, m.Stacks)
	w.peak.RSS = max(w.peak.RSS, m.RSS)
	w.peak.Goroutines = max(w.peak.Goroutines, m.Goroutines)
}

// Stop ends the sampling and returns the peaks.
func (w *memWatch) Stop() memUse {
	close(w.stop)
	<-w.done
	return w.peak
}

// cpuClock measures the process's CPU time over a span.
type cpuClock struct {
	user, sys time.Duration
	ok        bool
}

func startCPUClock() cpuClock {
	u, s, ok := processCPU()
	return cpuClock{user: u, sys: s, ok: ok}
}

// elapsed returns the user and system time since c started.
func (c cpuClock) elapsed() (user, sys time.Duration, ok bool) {
	u, s, ok := processCPU()
	if !ok || !c.ok {
		return 0, 0, false
	}
	return u - c.user, s - c.sys, true
}

// percentiles are nearest-rank percentiles in milliseconds.
type percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// percentilesOf returns nearest-rank percentiles of ds in milliseconds;
// zero for none.
func percentilesOf(ds []time.Duration) percentiles {
	if len(ds) == 0 {
		return percentiles{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	at := func(p float64) float64 {
		i := max(int(math.Ceil(p*float64(len(ds))))-1, 0)
		return ms(ds[i])
	}
	return percentiles{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: at(1)}
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
