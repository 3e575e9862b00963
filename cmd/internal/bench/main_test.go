package bench

import (
	"context"
	"flag"
	"log/slog"
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
	"github.com/codexrelay/codex-relay/internal/logbuf"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// runCommand runs the bench with args as codex-relay bench does (Run), on
// a flag set of its own, and returns what it printed: the report on
// stdout, and on stderr the flags' usage and errors and the relay's logs.
func runCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut logbuf.Buffer
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(&errOut)
	err = Run(context.Background(), fs, args, &out, func(level string) (*slog.Logger, error) {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, err
		}
		return slog.New(slog.NewTextHandler(&errOut, &slog.HandlerOptions{Level: lvl})), nil
	})
	return out.String(), errOut.String(), err
}
