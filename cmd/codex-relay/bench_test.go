package main

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// codex-relay bench hands its arguments to the harness (cmd/internal/bench,
// whose own tests run it): its -help names the command and its purpose,
// lists the harness's flags, and ends with the note every command's does;
// a bad flag fails the command.
func TestBenchCommandRunsTheHarness(t *testing.T) {
	t.Parallel()
	_, errOut, err := runCLI(t, cliEnv{}, "bench", "-help")
	require.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, errOut, "Usage: codex-relay bench [flags]")
	assert.Contains(t, errOut, "Measure what the relay adds, against the physical limit.")
	for _, f := range []string{"-conversations", "-transport", "-soak", "-hostile", "-stopped-readers", "-busyprofile", "-database-url", "-config FILE"} {
		assert.Regexp(t, `(?m)^  `+f+`\b`, errOut)
	}
	_, _, err = runCLI(t, cliEnv{}, "bench", "-conversations", "0")
	assert.ErrorContains(t, err, "-conversations must be between 1 and 10000")
}
