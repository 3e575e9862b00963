package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Logs are text on a terminal and JSON otherwise (auto), or as asked.
func TestNewLoggerFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format string
		json   bool
	}{{"auto", true}, {"json", true}, {"text", false}} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, tc.format, "info")
		require.NoError(t, err)
		log.Info("hello", "k", "v")
		var m map[string]any
		assert.Equal(t, tc.json, json.Unmarshal(buf.Bytes(), &m) == nil, "format %s: %q", tc.format, buf.String())
		if !tc.json {
			assert.Contains(t, buf.String(), "msg=hello")
		}
	}
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "warn")
	require.NoError(t, err)
	log.Info("quiet")
	assert.Empty(t, buf.String(), "below the level")
	_, err = newLogger(&buf, "json", "loud")
	assert.Error(t, err)
}
