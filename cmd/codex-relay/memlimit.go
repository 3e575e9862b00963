package main

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// The cgroup files that hold a container's memory limit: v2's, then v1's.
const (
	cgroupV2MemoryMax = "/sys/fs/cgroup/memory.max"
	cgroupV1MemoryMax = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
)

// cgroupV1Unlimited is the smallest value cgroup v1 writes for "no limit"
// (the largest page-aligned int64, 9223372036854771712, and above).
const cgroupV1Unlimited = 1 << 62

// softMemoryLimit is the Go runtime's soft memory limit for serve, in
// bytes: nine tenths of the container's memory limit, so that the
// collector works harder as the heap nears what the kernel allows rather
// than the container being killed with every stream it carries (a Go
// heap grows to twice its live size between collections by default, and
// one request at the 64 MiB body limit needs several times that size for
// a moment). It is 0 when GOMEMLIMIT is set (the operator's, which the
// runtime already applies) or when no limit can be read. Pure but for
// read.
func softMemoryLimit(getenv func(string) string, read func(string) ([]byte, error)) int64 {
	if strings.TrimSpace(getenv("GOMEMLIMIT")) != "" {
		return 0
	}
	for _, path := range []string{cgroupV2MemoryMax, cgroupV1MemoryMax} {
		b, err := read(path)
		if err != nil {
			continue
		}
		text := strings.TrimSpace(string(b))
		if text == "max" { // v2: no limit
			return 0
		}
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil || n <= 0 || n >= cgroupV1Unlimited {
			return 0
		}
		return n - n/10
	}
	return 0
}

// applyMemoryLimit sets the runtime's soft memory limit from the
// container's (softMemoryLimit), and says so.
func applyMemoryLimit(c cli, log *slog.Logger) {
	if soft := softMemoryLimit(c.getenv, os.ReadFile); soft > 0 {
		debug.SetMemoryLimit(soft)
		log.Info("Go memory limit set to nine tenths of the container's (set GOMEMLIMIT to choose another)", "soft_limit_bytes", soft)
	}
}
