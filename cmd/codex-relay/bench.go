package main

import (
	"context"
	"log/slog"

	"github.com/codexrelay/codex-relay/cmd/internal/bench"
)

// runBench is codex-relay bench: the harness (cmd/internal/bench) on a flag
// set of this command's, its report on stdout and the relay's logs, as
// text, on stderr.
func runBench(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "bench", bench.Purpose)
	return bench.Run(ctx, fs, args, c.stdout, func(level string) (*slog.Logger, error) {
		return newLogger(c.stderr, "text", level)
	})
}
