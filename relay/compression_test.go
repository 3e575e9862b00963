package relay

import (
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCompressionSettings(t *testing.T) {
	for _, tc := range []struct {
		in        string
		mode      CompressionMode
		ws        websocket.CompressionMode
		threshold int
		text      string
	}{
		{"", CompressionPooled, websocket.CompressionNoContextTakeover, DefaultCompressionThreshold, "pooled (from 512 B)"},
		{"pooled", CompressionPooled, websocket.CompressionNoContextTakeover, DefaultCompressionThreshold, "pooled (from 512 B)"},
		{"takeover", CompressionTakeover, websocket.CompressionContextTakeover, DefaultCompressionThreshold, "takeover (from 512 B)"},
		{"off", CompressionOff, websocket.CompressionDisabled, DefaultCompressionThreshold, "off"},
	} {
		m, err := ParseCompressionMode(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.mode, m)
		c := Compression{Mode: m}
		assert.Equal(t, tc.ws, c.websocketMode(), tc.in)
		assert.Equal(t, tc.threshold, c.threshold())
		assert.Equal(t, tc.text, c.String())
	}
	// The zero value is the default, pooled, and a threshold given is kept.
	assert.Equal(t, websocket.CompressionNoContextTakeover, Compression{}.websocketMode())
	assert.Equal(t, "pooled (from 2048 B)", Compression{Threshold: 2048}.String())
	for _, bad := range []string{"Pooled", "on", "deflate", " off"} {
		_, err := ParseCompressionMode(bad)
		assert.Error(t, err, bad)
	}
}
