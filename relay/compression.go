package relay

import (
	"fmt"

	"github.com/coder/websocket"
)

// Compression is how one side of the relay's WebSockets (the clients', or
// the upstream lanes') negotiates permessage-deflate (RFC 7692).
//
// Codex offers deflate with context takeover. Taken as offered, every
// connection keeps a compressor of its own (about 1.2 MB in
// compress/flate) and a 32 KiB window for reading, for as long as it is
// open: about a megabyte a session, and the compressor's CPU on every
// small delta. Pooled mode negotiates no context takeover in both
// directions (a client must honour it, RFC 7692 section 7.1.1.1), so each
// message stands alone: messages of at least the threshold are compressed
// by a compressor borrowed from a process-wide pool, smaller ones (the
// deltas, a few hundred bytes of JSON) go as they are, and an idle
// connection holds no compression state at all. The large messages (a
// first request of 40 KB and more, a response.completed carrying the
// whole answer) still shrink several times.
type Compression struct {
	Mode CompressionMode
	// Threshold is the smallest message compressed; smaller ones go
	// uncompressed. 0: DefaultCompressionThreshold.
	Threshold int
}

// CompressionMode names a Compression's negotiation.
type CompressionMode string

// The compression modes.
const (
	// CompressionPooled negotiates deflate without context takeover:
	// pooled compressors, no state per connection. The default.
	CompressionPooled CompressionMode = "pooled"
	// CompressionTakeover negotiates deflate with context takeover, as the
	// peer offers it: a compressor and a window kept per connection.
	CompressionTakeover CompressionMode = "takeover"
	// CompressionOff does not negotiate deflate.
	CompressionOff CompressionMode = "off"
)

// DefaultCompressionThreshold is the smallest message compressed unless an
// operator says otherwise: above a delta event, below every request.
const DefaultCompressionThreshold = 512

// ParseCompressionMode reads an operator's setting; "" is the default.
func ParseCompressionMode(s string) (CompressionMode, error) {
	switch m := CompressionMode(s); m {
	case "":
		return CompressionPooled, nil
	case CompressionPooled, CompressionTakeover, CompressionOff:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a compression mode: want pooled, takeover or off", s)
}

// websocketMode is the mode as coder/websocket takes it.
func (c Compression) websocketMode() websocket.CompressionMode {
	switch c.Mode {
	case CompressionTakeover:
		return websocket.CompressionContextTakeover
	case CompressionOff:
		return websocket.CompressionDisabled
	}
	return websocket.CompressionNoContextTakeover
}

// threshold is the smallest message compressed.
func (c Compression) threshold() int {
	if c.Threshold > 0 {
		return c.Threshold
	}
	return DefaultCompressionThreshold
}

// String is the setting as an operator writes it.
func (c Compression) String() string {
	if c.Mode == CompressionOff {
		return string(c.Mode)
	}
	return fmt.Sprintf("%s (from %d B)", c.orDefault().Mode, c.threshold())
}

func (c Compression) orDefault() Compression {
	if c.Mode == "" {
		c.Mode = CompressionPooled
	}
	return c
}
