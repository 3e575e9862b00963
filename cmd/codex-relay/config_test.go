package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

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

// Shutdown lets open requests finish within the grace time, then cuts them:
// a request that never ends cannot hold the process.
func TestShutdownCutsRequestsAfterTheGraceTime(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	started, cut := make(chan struct{}), make(chan struct{})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // a stream that would never end by itself
		close(cut)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveUntilDone(ctx, hs, ln, 100*time.Millisecond, slog.New(slog.DiscardHandler)) }()
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown waited for a request that never ends")
	}
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the open request was not cut")
	}
}

func TestAdvertiseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr *net.TCPAddr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2455}, "http://127.0.0.1:2455"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 5}, "http://[::1]:5"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 2455}, ""},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 2455}, ""},
		{&net.TCPAddr{Port: 2455}, ""},
	} {
		assert.Equal(t, tc.want, advertiseURL(tc.addr), "%v", tc.addr)
	}
}
