// Package leakcheck fails a test binary when goroutines of this project, of
// net/http, of coder/websocket or of os/exec outlive its tests: every
// goroutine must have an owner that ends it. Use it from TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Markers are stack fragments of goroutines that must not survive the tests.
var Markers = []string{
	"github.com/codexrelay/codex-relay/",
	"github.com/coder/websocket",
	"net/http.(*conn).serve",
	"net/http.(*persistConn)",
	"net/http/httptest.(*Server)",
	"os/exec.(*Cmd)",
}

// Main runs the tests, then waits up to 5s for marked goroutines to end and
// fails the binary with their stacks if any remain.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := Check(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// Check waits up to timeout for marked goroutines to end, then reports the
// ones left.
func Check(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		leaked := Leaked()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goroutine leak: %d goroutines left:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leaked lists the stacks of live marked goroutines other than the caller's.
func Leaked() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/leakcheck.Leaked") {
			continue
		}
		for _, m := range Markers {
			if strings.Contains(g, m) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
