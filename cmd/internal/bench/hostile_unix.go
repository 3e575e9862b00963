//go:build unix

package bench

import "syscall"

// setReceiveBuffer sets a socket's receive buffer before it connects, so
// the window it advertises from the start is that small.
func setReceiveBuffer(fd uintptr, bytes int) {
	_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, bytes)
}
