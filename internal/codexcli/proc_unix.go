//go:build unix

package codexcli

import (
	"os/exec"
	"syscall"
)

// configureProcess starts Codex in its own process group, so a timeout
// kills the node wrapper and the native binary it starts, not just the
// wrapper.
func configureProcess(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}

// reapProcessGroup kills whatever is left of the run's process group (a
// command Codex started and did not wait for), so nothing outlives the test.
func reapProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH when all are gone
	}
}
