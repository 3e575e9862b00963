package web

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
)

// TestMain fails the package when a live stream, a relay session or any
// other goroutine started by a test outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }
