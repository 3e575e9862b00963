package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// A short soak: sessions over both transports with every kind of upstream
// fault mixed in, slow readers and clients that hang up mid-answer, and
// every one of the soak's checks passing: each turn ended properly, each
// request logged with the upstream's usage (a response completed as its
// client hung up counts too), resources back, rows intact, penalties
// explained. (Not parallel: it counts the process's goroutines and
// sockets.)
func TestBenchSoak(t *testing.T) {
	heap := filepath.Join(t.TempDir(), "heap")
	out, errOut, err := runCommand(t, "-soak", "12s", "-conversations", "40", "-accounts", "6",
		"-fault-rate", "0.4", "-client-fault-rate", "0.15", "-prewarm", "-busyprofile", heap, "-json")
	var rep soakReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "%s\n%s", out, errOut)
	require.NoError(t, err, "violations: %q", rep.Violations)
	assert.Empty(t, rep.Violations)

	assert.Positive(t, rep.Turns[soakCompleted])
	assert.Positive(t, rep.Turns[soakFailed], "faults after output end turns with a terminal event")
	assert.Positive(t, rep.Turns[soakVanished], "clients hung up mid-answer")
	assert.Positive(t, rep.SlowTurns)
	assert.Zero(t, rep.Turns[soakHung]+rep.Turns[soakBroken])
	for _, kind := range []string{"usage_limit", "server_error", "overloaded", "unauthorized", "cut_stream", "stall", "websocket_max_age"} {
		assert.Positive(t, rep.Faults[kind], "the sim fired %s", kind)
	}
	assert.Positive(t, rep.Attempts["ciphertext"], "threads moved across organisations met ciphertext their new account could not read")
	assert.Positive(t, rep.Recoveries["failover"])
	assert.Positive(t, rep.Refreshes, "401s were answered by refreshing, rotating the refresh token")
	require.NotEmpty(t, rep.Penalties)
	for _, p := range rep.Penalties {
		assert.NotEmpty(t, p.Cause, "%+v", p)
	}
	assert.Equal(t, rep.Requests, rep.LoggedRows)
	assert.Equal(t, rep.UpstreamUsage.minus(rep.Undelivered), rep.LoggedUsage, "every completion the sim delivered is logged")
	assert.Positive(t, rep.LoggedUsage.Output)
	assert.Positive(t, rep.BindingsChecked)
	assert.LessOrEqual(t, rep.Goroutines[1], rep.Goroutines[0])
	assert.LessOrEqual(t, rep.OpenSockets[1], rep.OpenSockets[0])
	assert.NotEmpty(t, rep.Memory)
	for _, name := range []string{heap + "-mid", heap + "-end"} {
		fi, err := os.Stat(name)
		if assert.NoError(t, err, "-busyprofile writes two heap profiles") {
			assert.Positive(t, fi.Size())
		}
	}
}

// A penalty is explained only by a fault of its own account, of a kind
// that sets its status, fired before it.
func TestSoakPenaltyCause(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	fired := []firedFault{
		{Account: "bench-1", Fault: sim.FaultServerError, Time: at.Add(-time.Second)},
		{Account: "bench-2", Fault: sim.FaultUsageLimit, Time: at.Add(-time.Second)},
		{Account: "bench-1", Fault: sim.FaultUsageLimit, Time: at.Add(5 * time.Second)},
		{Account: "bench-3", Fault: sim.FaultUnauthorized, Time: at},
	}
	for _, tc := range []struct {
		label, status, want string
	}{
		{"bench-2", "rate_limited", "usage_limit"},
		{"bench-1", "rate_limited", ""}, // a 5xx sets no status; its usage limit came after
		{"bench-3", "reauth_required", "unauthorized"},
		{"bench-3", "rate_limited", ""},
		{"bench-4", "rate_limited", ""}, // another account's fault
	} {
		got := penaltyCause(soakPenalty{Status: tc.status, At: at}, tc.label, fired)
		assert.Equal(t, tc.want, got, "%s %s", tc.label, tc.status)
	}
}

// The live heap is flat when the last fifth's peak stays within 25% (and
// 16 MiB) of the middle fifth's; growth past that is a violation.
func TestSoakMemoryCheck(t *testing.T) {
	samples := func(heap func(i int) int64) []soakMemSample {
		var s []soakMemSample
		for i := range 50 {
			s = append(s, soakMemSample{Second: float64(i), LiveHeap: heap(i)})
		}
		return s
	}
	flat := &soakRun{}
	flat.checkMemory(samples(func(i int) int64 { return 100<<20 + int64(i%3)<<20 }))
	assert.Empty(t, flat.violations)
	growing := &soakRun{}
	growing.checkMemory(samples(func(i int) int64 { return int64(100+4*i) << 20 }))
	require.Len(t, growing.violations, 1)
	assert.Contains(t, growing.violations[0], "live heap grew")
}

// A kind of violation that fires on every session must not hide the
// others: each kind lists its first examples, and all are counted.
func TestSoakViolationsAreCountedByKindPastTheirExamples(t *testing.T) {
	r := &soakRun{}
	for i := range soakExamples + 5 {
		r.violate("binding", "session %d", i)
	}
	r.violate("usage", "session x: the log settled less")
	list, byKind := r.takeViolations()
	assert.Equal(t, map[string]int{"binding": soakExamples + 5, "usage": 1}, byKind)
	require.Len(t, list, soakExamples+1)
	assert.Equal(t, "usage: session x: the log settled less", list[soakExamples])

	var out strings.Builder
	printSoak(&out, soakReport{Violations: list, ViolationsByKind: byKind})
	assert.Contains(t, out.String(), "checks: 26 violations")
	assert.Contains(t, out.String(), "binding 25, usage 1")
}

func TestSoakRowsText(t *testing.T) {
	at := time.Date(2026, 12, 2, 17, 4, 5, 6e6, time.UTC)
	got := rowsText([]store.RequestRecord{
		{StartedAt: at, Status: 200, InputTokens: 265, CachedTokens: 35, OutputTokens: 76},
		{StartedAt: at.Add(time.Second), Status: 499, ErrorCode: "cancelled"},
		{StartedAt: at.Add(2 * time.Second), Status: 200, Recovery: "failover", InputTokens: 501, OutputTokens: 76},
	})
	assert.Equal(t, "[17:04:05.006 200 265/35/76; 17:04:06.006 499 cancelled 0/0/0; 17:04:07.006 200 (failover) 501/0/76]", got)
}
