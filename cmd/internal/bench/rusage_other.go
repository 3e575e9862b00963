//go:build !unix

package bench

import "time"

// processCPU is unknown here: the bench reports no CPU figures.
func processCPU() (user, sys time.Duration, ok bool) { return 0, 0, false }
