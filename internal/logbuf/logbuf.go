// Package logbuf is a buffer tests collect output in (logs, a command's
// stdout and stderr) while other goroutines are still writing to it.
package logbuf

import (
	"bytes"
	"log/slog"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers and readers. The
// zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Logger logs to the buffer as text, from debug level up.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
