package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
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

// Shutdown lets a request that ends within the grace time finish with its
// whole answer, and cuts one still open when the grace time is over, not
// before: a request that never ends cannot hold the process, and a stream
// about to end is not lost to a restart.
func TestShutdownCutsRequestsAfterTheGraceTime(t *testing.T) {
	t.Parallel()
	const grace = time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var open sync.WaitGroup // both requests are in their handlers
	open.Add(2)
	shuttingDown := make(chan struct{})
	cutAt := make(chan time.Time, 1)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first half;")
		w.(http.Flusher).Flush()
		open.Done()
		switch r.URL.Path {
		case "/ends-soon":
			// It ends after the shutdown began (Shutdown runs the
			// RegisterOnShutdown hooks; Close does not), well within the
			// grace time.
			select {
			case <-shuttingDown:
			case <-r.Context().Done():
				return // cut
			}
			select {
			case <-time.After(grace / 20):
			case <-r.Context().Done():
				return // cut
			}
			fmt.Fprint(w, "second half")
		case "/never-ends":
			<-r.Context().Done()
			cutAt <- time.Now()
		}
	})}
	hs.RegisterOnShutdown(func() { close(shuttingDown) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serveUntilDone(ctx, hs, ln, grace, slog.New(slog.DiscardHandler), nil) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	type answer struct {
		body string
		err  error
	}
	get := func(path string) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			resp, err := client.Get("http://" + ln.Addr().String() + path)
			if err != nil {
				out <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			out <- answer{string(b), err}
		}()
		return out
	}
	endsSoon, neverEnds := get("/ends-soon"), get("/never-ends")
	open.Wait()
	shutdownAt := time.Now()
	cancel()

	select {
	case a := <-endsSoon:
		assert.NoError(t, a.err, "a request that ends within the grace time is not cut")
		assert.Equal(t, "first half;second half", a.body, "its whole answer reaches the client")
	case <-time.After(10 * time.Second):
		t.Fatal("the request that ends within the grace time never answered")
	}
	select {
	case at := <-cutAt:
		assert.GreaterOrEqual(t, at.Sub(shutdownAt), grace, "the open request was cut before the grace time was over")
	case <-time.After(10 * time.Second):
		t.Fatal("the open request was not cut")
	}
	select {
	case a := <-neverEnds:
		assert.Error(t, a.err, "the client of a cut request sees its answer broken off")
		assert.Equal(t, "first half;", a.body)
	case <-time.After(10 * time.Second):
		t.Fatal("the client of the cut request is still waiting")
	}
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown waited for a request that never ends")
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
