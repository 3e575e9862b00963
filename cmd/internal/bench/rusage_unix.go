//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the user and system CPU time this process has used
// so far (getrusage RUSAGE_SELF): every goroutine's, the runtime's (the
// garbage collector's included) and the kernel's work on its behalf.
func processCPU() (user, sys time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano()), true
}
