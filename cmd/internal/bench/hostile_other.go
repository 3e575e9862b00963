//go:build !unix

package bench

// setReceiveBuffer is a no-op here: the slow readers keep the system's
// receive buffer.
func setReceiveBuffer(fd uintptr, bytes int) {}
