package alert

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
)

// TestMain fails the package when a Deliverer's or Watcher's goroutine
// outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }
