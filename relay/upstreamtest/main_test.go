package upstreamtest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package when a goroutine of the sim, of net/http or of
// coder/websocket outlives the tests: every goroutine must have an owner
// that ends it.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := checkLeaks(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakMarkers are stack fragments of goroutines that must not survive.
var leakMarkers = []string{
	"github.com/codexrelay/codex-relay/",
	"github.com/coder/websocket",
	"net/http.(*conn).serve",
	"net/http.(*persistConn)",
	"net/http/httptest.(*Server)",
	"os/exec.(*Cmd)",
}

// checkLeaks waits up to timeout for goroutines carrying a leak marker to
// end, then reports the ones left.
func checkLeaks(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		leaked := leakedGoroutines()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goroutine leak: %d goroutines left:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "leakedGoroutines") {
			continue // this goroutine
		}
		for _, m := range leakMarkers {
			if strings.Contains(g, m) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
