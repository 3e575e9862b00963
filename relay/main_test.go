package relay

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// TestMain fails the package when a lane reader, a session or any other
// goroutine of the relay outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }

// testStore is a fresh SQLite store, for tests of a Server that reach
// nothing of it (a Server needs one).
func testStore(t testing.TB) *store.Store {
	return storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
}
