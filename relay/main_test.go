package relay

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
)

// TestMain fails the package when a lane reader, a session or any other
// goroutine of the relay outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }
