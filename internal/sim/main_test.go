package sim

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
)

// TestMain fails the package when a goroutine of the sim, of net/http or of
// coder/websocket outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }
