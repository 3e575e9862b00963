//go:build !unix

package codexcli

import "os/exec"

// configureProcess leaves the process as os/exec starts it: without process
// groups, a timeout kills the wrapper only.
func configureProcess(*exec.Cmd) {}

// reapProcessGroup has nothing to do without process groups.
func reapProcessGroup(*exec.Cmd) {}
