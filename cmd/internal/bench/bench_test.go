package bench

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/store"
)

// benchJSON runs bench with args and -json and decodes its report.
func benchJSON(t *testing.T, args ...string) benchReport {
	t.Helper()
	out, errOut, err := runCommand(t, append(args[:len(args):len(args)], "-json")...)
	require.NoError(t, err, errOut)
	var rep benchReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	return rep
}

// tableLine finds a measure in a report's table.
func tableLine(t *testing.T, tab benchTable, measure string) benchLine {
	t.Helper()
	for _, l := range tab.Lines {
		if l.Measure == measure {
			return l
		}
	}
	require.Failf(t, "no such line", "%q in %q", measure, tab.Title)
	return benchLine{}
}

// bench runs real conversations against the three targets on both
// transports, each in its own phase, counts every event the sim sent,
// and compares relay with pipe; nothing is left running afterwards.
// (Not parallel: it counts the process's goroutines and CPU time.)
func TestBenchMeasuresThreeTargetsOnBothTransports(t *testing.T) {
	rep := benchJSON(t, "-conversations", "3", "-turns", "3", "-words", "5", "-accounts", "2")
	require.Len(t, rep.Rows, 6)
	seen := map[string]bool{}
	for _, row := range rep.Rows {
		seen[row.Transport+"/"+row.Target] = true
		assert.Equal(t, 3, row.Sessions)
		assert.Equal(t, 9, row.Turns, "%+v", row)
		assert.Zero(t, row.Errors, row.FirstError)
		if row.Transport == "ws" {
			assert.Equal(t, int64(3), row.ClientConns, "one connection a session")
		} else {
			assert.Less(t, row.ClientConns, int64(9), "%s: HTTP connections are kept alive across turns", row.Target)
		}
		assert.Positive(t, row.Events, "%s %s", row.Transport, row.Target)
		assert.Equal(t, row.SimEvents, row.Events, "%s %s: every event the sim sent reached the client, and no other", row.Transport, row.Target)
		assert.Positive(t, row.FirstEvent.P50)
		assert.LessOrEqual(t, row.FirstEvent.P50, row.FirstToken.P50, "the first event comes no later than the first token")
		assert.LessOrEqual(t, row.FirstToken.P50, row.Turn.P50, "the first token comes before the turn ends")
		assert.Positive(t, row.FirstTurnToken.P50)
		assert.LessOrEqual(t, row.Turn.P50, row.Turn.Max)
		assert.Positive(t, row.Seconds)
		assert.Positive(t, row.CPUSeconds, "getrusage measured the phase")
		assert.InDelta(t, row.CPUSeconds/float64(row.Events)*1e6, row.CPUPerEventUs, 1e-6)
		assert.Positive(t, row.EventsPerSecond)
		assert.Positive(t, row.AllocsPerEvent)
		assert.Positive(t, row.WireBytesIn)
		assert.Positive(t, row.WireBytesOut)
		if row.Target == targetPipe {
			// The pipe copied exactly what crossed the clients' connections.
			assert.Equal(t, row.WireBytesIn+row.WireBytesOut, row.PipeBytes, row.Transport)
		} else {
			assert.Zero(t, row.PipeBytes)
		}
	}
	assert.Len(t, seen, 6)
	require.Len(t, rep.Tables, 2)
	assert.Equal(t, "HTTP/SSE, 3 sessions", rep.Tables[0].Title)
	assert.Equal(t, "WebSocket, 3 sessions", rep.Tables[1].Title)
	for i, tab := range rep.Tables {
		rows := rep.Rows[3*i : 3*i+3]
		cpu := tableLine(t, tab, "CPU per event, whole process")
		require.NotNil(t, cpu.RelayVsPipe)
		assert.InDelta(t, rows[2].CPUPerEventUs/rows[1].CPUPerEventUs, *cpu.RelayVsPipe, 1e-9, "relay/pipe")
		own := tableLine(t, tab, "CPU per forwarded event, over direct")
		assert.Nil(t, own.Direct)
		require.NotNil(t, own.Relay)
		assert.InDelta(t, rows[2].CPUPerEventUs-rows[0].CPUPerEventUs, *own.Relay, 1e-9)
		token := tableLine(t, tab, "first output token p99")
		require.NotNil(t, token.RelayVsPipe)
		assert.Equal(t, "difference", token.Compare)
		assert.InDelta(t, rows[2].FirstToken.P99-rows[1].FirstToken.P99, *token.RelayVsPipe, 1e-9, "added time: relay minus pipe")
		mem := tableLine(t, tab, "peak heap+stacks over direct, per session")
		assert.NotNil(t, mem.Pipe)
		assert.NotNil(t, mem.Relay)
	}
	assert.NotEmpty(t, rep.Method)
	assert.True(t, rep.ClientDeflate, "clients offer deflate by default, as Codex")
	assert.LessOrEqual(t, rep.Goroutines.After, rep.Goroutines.Before, "every goroutine the bench started ended")
}

// Token pace and a burst: every session connects, then all first turns
// start together, each answer in the deltas asked for, 1 ms apart.
func TestBenchPacedBurst(t *testing.T) {
	rep := benchJSON(t, "-transport", "ws", "-conversations", "3", "-turns", "2", "-words", "20", "-deltas", "10",
		"-pace", "1ms", "-burst", "-accounts", "1")
	require.Len(t, rep.Rows, 3)
	assert.True(t, rep.Burst)
	assert.Equal(t, 1.0, rep.PaceMs)
	for _, row := range rep.Rows {
		assert.Equal(t, 6, row.Turns, row.FirstError)
		// 10 deltas and 10 other events: the turn state, created, two
		// items added and done, a content part added and done, the text
		// done and completed (the rate limits are not counted: see
		// answerEvents).
		assert.Equal(t, int64(6*20), row.Events, row.Target)
		assert.Equal(t, row.SimEvents, row.Events, row.Target)
	}
}

// The workload reaches the sim as its directives: words, deltas and the
// gap between events.
func TestBenchPromptCarriesTheShape(t *testing.T) {
	t.Parallel()
	text := func(o options) string {
		b := &benchConversation{o: o}
		return b.prompt(0)["content"].([]any)[0].(map[string]any)["text"].(string)
	}
	assert.Equal(t, "bench turn 1 [[sim:words 1270]] [[sim:events 199]] [[sim:gap 20ms]]",
		text(options{words: pacedWords, deltas: pacedDeltas, pace: pacedGap}))
	assert.Equal(t, "bench turn 1 [[sim:words 40]]", text(options{words: 40}), "unpaced, the sim's deltas")
}

// -paced stands for the token pace unless a flag says otherwise;
// -ramp spreads the starts. (Short: one word-paced turn over HTTP.)
func TestBenchPacedPresetAndRamp(t *testing.T) {
	rep := benchJSON(t, "-transport", "http", "-targets", "pipe,relay", "-conversations", "2", "-turns", "1",
		"-paced", "-words", "30", "-pace", "0s", "-ramp", "20ms", "-accounts", "1")
	assert.Equal(t, 30, rep.Words, "given")
	assert.Equal(t, pacedDeltas, rep.Deltas, "from -paced")
	assert.Zero(t, rep.PaceMs, "given")
	assert.Equal(t, 20.0, rep.RampMs)
	require.Len(t, rep.Rows, 2)
	for _, row := range rep.Rows {
		assert.Equal(t, 2, row.Turns, row.FirstError)
		assert.Equal(t, row.SimEvents, row.Events, row.Target)
		if row.Target == targetPipe {
			assert.Equal(t, int64(2*(pacedDeltas+9)), row.Events, "208 events a response over HTTP")
		}
	}
	// Without direct there is nothing to subtract.
	assert.Nil(t, tableLine(t, rep.Tables[0], "CPU per forwarded event, over direct").Relay)
}

// -idle opens sessions on every target, holds them open (a reader each)
// while memory is read, then closes them all.
func TestBenchIdleSessions(t *testing.T) {
	heap := filepath.Join(t.TempDir(), "heap")
	rep := benchJSON(t, "-idle", "4", "-idle-hold", "0s", "-words", "5", "-accounts", "1", "-idleprofile", heap)
	assert.Empty(t, rep.Rows, "the idle mode runs instead of the turn workload")
	require.Len(t, rep.Idle, 3)
	for i, row := range rep.Idle {
		assert.Equal(t, []string{targetDirect, targetPipe, targetRelay}[i], row.Target)
		assert.Equal(t, 4, row.Open, row.FirstError)
		assert.Zero(t, row.Errors)
		assert.Positive(t, row.Events)
		assert.Equal(t, row.SimEvents, row.Events, row.Target)
		assert.GreaterOrEqual(t, row.Goroutines, row.Open, "%s: every session was still open when memory was read", row.Target)
		assert.InDelta(t, float64(row.Heap)/4, row.HeapPerSession, 1e-9)
	}
	require.Len(t, rep.IdleTables, 1)
	assert.NotNil(t, tableLine(t, rep.IdleTables[0], "heap in use per session").RelayVsPipe)
	assert.LessOrEqual(t, rep.Goroutines.After, rep.Goroutines.Before, "every session closed")
	fi, err := os.Stat(heap)
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), "the heap profile was written while the relay's sessions were held")
}

// -compression runs the relay once with each setting, beside the same
// pipe phase: a table each, and the settings side by side. Turned off, the
// relay sends every message as it is, so the clients' wire bytes grow.
func TestBenchCompressionSideBySide(t *testing.T) {
	rep := benchJSON(t, "-transport", "ws", "-targets", "pipe,relay", "-conversations", "2", "-turns", "2",
		"-words", "400", "-accounts", "1", "-compression", "off,takeover,pooled", "-upstream-compression", "takeover", "-sim-compression", "takeover")
	assert.Equal(t, "takeover", rep.UpstreamCompression)
	assert.Equal(t, "takeover", rep.SimCompression)
	require.Len(t, rep.Rows, 4)
	var got []string
	for _, row := range rep.Rows {
		assert.Equal(t, 4, row.Turns, row.FirstError)
		assert.Equal(t, row.SimEvents, row.Events, row.Target)
		got = append(got, row.Target+"/"+row.Compression)
	}
	assert.Equal(t, []string{"pipe/", "relay/pooled", "relay/takeover", "relay/off"}, got, "in the canonical order")
	require.Len(t, rep.Tables, 3)
	for i, c := range []string{"pooled", "takeover", "off"} {
		assert.Equal(t, "WebSocket, 2 sessions, relay compression "+c, rep.Tables[i].Title)
	}
	require.Len(t, rep.Compression, 3)
	wire := map[string]float64{}
	for _, c := range rep.Compression {
		assert.Equal(t, "ws", c.Transport)
		require.NotNil(t, c.WireKiBPerTurn)
		require.NotNil(t, c.FirstTokenP50Pipe, "beside the pipe")
		wire[c.Compression] = *c.WireKiBPerTurn
	}
	assert.Greater(t, wire["off"], wire["pooled"], "pooled compresses the large messages")
	assert.Greater(t, wire["pooled"], wire["takeover"], "takeover compresses the deltas too")

	idle := benchJSON(t, "-idle", "2", "-idle-hold", "0s", "-words", "5", "-accounts", "1", "-targets", "direct,relay", "-compression", "pooled,off")
	require.Len(t, idle.Idle, 3)
	require.Len(t, idle.IdleTables, 2)
	require.Len(t, idle.Compression, 2)
	assert.Equal(t, "idle", idle.Compression[0].Transport)
	assert.NotNil(t, idle.Compression[0].IdleRSSPerSession)

	_, _, err := runCommand(t, "-compression", "zstd")
	assert.ErrorContains(t, err, `-compression: "zstd" is not one of pooled, takeover, off`)
}

// -prewarm sends Codex's generate:false request first on every WebSocket
// session and chains the first turn to it: every target serves it, and the
// prewarm's events count on both sides (the relay adds its own turn-state
// event to the prewarm's answer).
func TestBenchPrewarm(t *testing.T) {
	rep := benchJSON(t, "-transport", "ws", "-conversations", "2", "-turns", "2", "-words", "10", "-accounts", "1", "-prewarm", "-burst")
	assert.True(t, rep.Prewarm)
	require.Len(t, rep.Rows, 3)
	for _, row := range rep.Rows {
		assert.Equal(t, 4, row.Turns, row.FirstError)
		if row.Target == targetRelay {
			assert.Equal(t, row.SimEvents+2, row.Events, "one turn-state event a session from the relay")
		} else {
			assert.Equal(t, row.SimEvents, row.Events, row.Target)
		}
	}
}

// -busyprofile writes the heap and the goroutines while the relay's
// sessions are mid-turn (once every session read output: an event, so a
// loaded machine takes them as late as it must); a phase too short for
// that is an error, not a profile of something else.
func TestBenchBusyProfile(t *testing.T) {
	t.Parallel()
	heap := filepath.Join(t.TempDir(), "busy")
	base := []string{"-targets", "relay", "-transport", "ws", "-conversations", "2", "-turns", "1", "-accounts", "1", "-busyprofile", heap}
	_, errOut, err := runCommand(t, append(base, "-deltas", "15", "-pace", "100ms")...)
	require.NoError(t, err, errOut)
	fi, err := os.Stat(heap)
	require.NoError(t, err)
	assert.Positive(t, fi.Size())
	stacks, err := os.ReadFile(heap + ".goroutines")
	require.NoError(t, err)
	assert.Contains(t, string(stacks), "relay.(*Server).pump(", "taken while the sessions streamed")

	_, _, err = runCommand(t, append(base, "-words", "3")...)
	assert.ErrorContains(t, err, "phase ended before its profiles were written")
	_, _, err = runCommand(t, "-idle", "2", "-busyprofile", heap)
	assert.ErrorContains(t, err, "-busyprofile is for the turn workload or -soak")
}

// The text report is the table; -help documents the flags; the
// profiles asked for are written.
func TestBenchTableHelpAndProfiles(t *testing.T) {
	dir := t.TempDir()
	prof := func(name string) string { return filepath.Join(dir, name) }
	out, errOut, err := runCommand(t, "-conversations", "1", "-turns", "1", "-words", "3", "-transport", "ws",
		"-cpuprofile", prof("cpu"), "-memprofile", prof("mem"), "-mutexprofile", prof("mutex"), "-blockprofile", prof("block"), "-trace", prof("trace"))
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "WebSocket, 1 sessions")
	assert.Regexp(t, `measure +direct +pipe +relay +relay vs pipe`, out)
	assert.Regexp(t, `CPU per forwarded event, over direct \(µs\) +- +\S+ +\S+`, out)
	assert.Regexp(t, `CPU per event, whole process \(µs\) +\S+ +\S+ +\S+ +\S+x`, out)
	assert.Regexp(t, `first output token p50 \(ms\) +\S+ +\S+ +\S+ +[+-]\S+ ms`, out)
	assert.Contains(t, out, "getrusage")
	assert.NotContains(t, out, "HTTP/SSE")
	assert.NotContains(t, out, "failed, the first")
	for _, name := range []string{"cpu", "mem", "mutex", "block", "trace"} {
		fi, err := os.Stat(prof(name))
		if assert.NoError(t, err, name) {
			assert.Positive(t, fi.Size(), name)
		}
	}

	_, errOut, err = runCommand(t, "-help")
	require.ErrorIs(t, err, flag.ErrHelp)
	for _, f := range []string{"-conversations", "-turns", "-words", "-deltas", "-pace", "-paced", "-ramp", "-burst", "-idle", "-idle-hold", "-idleprofile", "-busyprofile",
		"-accounts", "-transport", "-targets", "-client-deflate", "-json", "-cpuprofile", "-memprofile", "-mutexprofile", "-blockprofile", "-trace", "-database-url"} {
		assert.Regexp(t, `(?m)^  `+f+`\b`, errOut)
	}
}

// The pipe copies bytes to the upstream it was given: pointed at a dead
// port, no turn gets through, on either transport.
func TestBenchPipeFailsWithADeadUpstream(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			p, err := startBytePipe(deadUpstreamAddr(t))
			require.NoError(t, err)
			defer p.Close()
			var wc wireCounter
			client := benchClient(2, &wc)
			defer client.CloseIdleConnections()
			target := benchTarget{name: targetPipe, base: "http://" + p.Addr() + "/backend-api/codex",
				header: func(int) http.Header { return http.Header{"Authorization": {"Bearer at-x"}} }}
			o := options{conversations: 2, turns: 1, words: 3, turnTimeout: 5 * time.Second, clientDeflate: true}
			samples, errs := runWorkload(context.Background(), client, target, transport, o, nil)
			assert.Empty(t, samples)
			assert.Len(t, errs, 2)
			assert.Positive(t, p.dialFailed.Load())
		})
	}
}

// In front of a live upstream the pipe carries both directions unchanged
// and counts them.
func TestBenchPipeCopiesBothWays(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("echo:"), b...))
	}))
	defer up.Close()
	p, err := startBytePipe(up.Listener.Addr().String())
	require.NoError(t, err)
	var wc wireCounter
	client := benchClient(1, &wc)
	resp, err := client.Post("http://"+p.Addr()+"/", "text/plain", strings.NewReader("hello"))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "echo:hello", string(body))
	client.CloseIdleConnections()
	assert.Equal(t, wc.in.Load()+wc.out.Load(), p.Close())
}

// WebSocket clients offer permessage-deflate with context takeover as
// Codex does, unless -client-deflate=false.
func TestBenchClientOffersDeflateAsCodex(t *testing.T) {
	t.Parallel()
	offered := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offered <- r.Header.Get("Sec-WebSocket-Extensions")
		http.Error(w, "no", http.StatusTeapot)
	}))
	defer srv.Close()
	for _, deflate := range []bool{true, false} {
		b := &benchConversation{client: srv.Client(), conv: 0, session: "s",
			target: benchTarget{name: "t", base: srv.URL, header: func(int) http.Header { return http.Header{} }},
			o:      options{clientDeflate: deflate, turnTimeout: 5 * time.Second}}
		_, err := b.dial(context.Background())
		require.Error(t, err)
		ext := <-offered
		if deflate {
			assert.Contains(t, ext, "permessage-deflate")
			assert.NotContains(t, ext, "no_context_takeover", "context takeover is kept")
		} else {
			assert.Empty(t, ext)
		}
	}
}

func TestBenchRefusesBadOptions(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"no conversations":         {"-conversations", "0"},
		"negative turns":           {"-turns", "-1"},
		"too many words":           {"-words", "100000"},
		"unknown transport":        {"-transport", "grpc"},
		"unknown target":           {"-targets", "direct,nginx"},
		"no timeout":               {"-turn-timeout", "0s"},
		"negative deltas":          {"-deltas", "-1"},
		"negative pace":            {"-pace", "-1ms"},
		"negative idle":            {"-idle", "-1"},
		"burst and ramp":           {"-burst", "-ramp", "1s"},
		"more sessions than lanes": {"-conversations", "65", "-accounts", "1"},
		"more idle than lanes":     {"-idle", "129", "-accounts", "2"},
		"an argument":              {"extra"},
		"cache bound without soak": {"-cache-threads", "100"},
		"negative cache bound":     {"-soak", "1s", "-cache-threads", "-1"},
	} {
		_, _, err := runCommand(t, args...)
		assert.Error(t, err, name)
	}
	// Without the relay, its lane cap does not apply.
	assert.NoError(t, options{conversations: 65, turns: 1, words: 1, accounts: 1, targets: []string{targetPipe},
		turnTimeout: time.Second}.validate())
}

// bench adds accounts of its own: a database that holds accounts (an
// operator's) is refused, untouched.
func TestBenchRefusesADatabaseWithAccounts(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "in-use.db")
	loc, err := store.ParseLocation(db)
	require.NoError(t, err)
	st, err := app.OpenStore(context.Background(), loc, []byte("an-operator's-secret-key"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = st.CreateAccount(context.Background(), store.Account{Kind: store.KindOpenAI, Label: "production"}, store.Credentials{APIKey: "sk-real"})
	require.NoError(t, err)
	require.NoError(t, st.Close())

	_, _, err = runCommand(t, "-database-url", db, "-conversations", "1", "-turns", "1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "holds accounts")
}

// deadUpstreamAddr is a loopback address nothing listens on.
func deadUpstreamAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// The busy moment comes when every session has read output, not after a
// set time: the profiles are written then, while a session still runs;
// the phase ending first, the moment not coming within its deadline, and
// every session gone by the time the profiles are written are errors.
func TestBusyMomentWaitsForEverySessionsOutput(t *testing.T) {
	// Not parallel: writing a heap profile reads runtime.MemProfileRate,
	// which a parallel bench run with -busyprofile sets (a data race).
	path := filepath.Join(t.TempDir(), "busy")
	never := make(chan struct{})

	b := newBusyMoment(2)
	done := make(chan error, 1)
	go func() { done <- b.profile("relay", path, time.Minute, never) }()
	b.streamed()
	select {
	case err := <-done:
		t.Fatalf("profiled with one of two sessions streaming: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	b.streamed()
	require.NoError(t, <-done)
	for _, name := range []string{path, path + ".goroutines"} {
		fi, err := os.Stat(name)
		require.NoError(t, err)
		assert.Positive(t, fi.Size(), name)
	}

	ended := make(chan struct{})
	close(ended)
	b = newBusyMoment(2)
	b.streamed()
	assert.ErrorContains(t, b.profile("relay", path, time.Minute, ended), "the relay phase ended before every session had read output (1 of 2 had)")

	b = newBusyMoment(2)
	assert.ErrorContains(t, b.profile("relay", path, 10*time.Millisecond, never), "did not have every session read output within 10ms (0 of 2 had)")

	b = newBusyMoment(1)
	b.streamed()
	b.ended()
	assert.ErrorContains(t, b.profile("relay", path, time.Minute, never), "the relay phase ended before its profiles were written")
}
