package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// rollingGrace is serve's default -shutdown-timeout (startProcess passes no
// flags): how long a draining replica may take.
const rollingGrace = 30 * time.Second

// balancer is a round-robin balancer in front of replica processes, as a
// plain one in a deployment is: each request goes to the next backend in
// turn, and a backend that refuses the connection (a dead process) is
// skipped for the next one. Keep-alives are off so a dead backend always
// shows as a refused dial, which is safe to retry: the request never
// reached it. Its backends can be replaced while it serves, as a
// deployment swaps a restarted replica's address in. It counts the Codex requests (POSTs and
// WebSocket sessions on .../responses) open on each backend, so a test
// knows which replica carries a turn; httputil.ReverseProxy passes the
// WebSocket upgrade through and returns when the session ends.
type balancer struct {
	transport *http.Transport // static after construction

	mu       sync.Mutex
	backends []*url.URL // guarded by mu
	next     int        // guarded by mu: the backend the next request tries first
	open     []int      // guarded by mu: Codex requests open on each backend
}

func newBalancer(t *testing.T, bases ...string) (*balancer, *httptest.Server) {
	b := &balancer{transport: &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext},
		backends: make([]*url.URL, len(bases)), open: make([]int, len(bases))}
	for i, base := range bases {
		b.replace(t, i, base)
	}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	return b, srv
}

// replace points backend i at base.
func (b *balancer) replace(t *testing.T, i int, base string) {
	u, err := url.Parse(base)
	require.NoError(t, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends[i] = u
}

// aim makes backend i the first one the next request tries; round robin
// goes on from there.
func (b *balancer) aim(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next = i
}

// openOn is the number of Codex requests open on backend i.
func (b *balancer) openOn(i int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open[i]
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	first := b.next
	b.next = (b.next + 1) % len(b.backends)
	targets := make([]*url.URL, len(b.backends))
	for i := range targets {
		targets[i] = b.backends[(first+i)%len(b.backends)]
	}
	b.mu.Unlock()
	codex := strings.HasSuffix(r.URL.Path, "/responses")
	for i, target := range targets {
		idx := (first + i) % len(targets)
		refused := false
		proxy := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.Body = http.NoBody // a WebSocket upgrade has none
				if len(body) > 0 {
					pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				}
				pr.Out.ContentLength = int64(len(body))
			},
			Transport:     b.transport,
			FlushInterval: -1,
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
					refused = true
					return
				}
				http.Error(w, "backend: "+err.Error(), http.StatusBadGateway)
			},
		}
		b.count(idx, codex, 1)
		proxy.ServeHTTP(w, r)
		b.count(idx, codex, -1)
		if !refused {
			return
		}
	}
	http.Error(w, "no backend is up", http.StatusBadGateway)
}

func (b *balancer) count(i int, codex bool, d int) {
	if !codex {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open[i] += d
}

// A rolling restart: two replica processes on one PostgreSQL behind a
// round-robin balancer, restarted one after the other (SIGTERM, then a
// fresh process on the same environment at a new address) while the real
// Codex CLI is in the middle of a slow turn that goes through the replica
// being stopped, its deltas already reaching Codex; over HTTP and over
// WebSocket. The draining replica lets the turn under way finish before it
// exits 0, so no turn fails: Codex exits 0 with its answer, reports no
// error and no reconnect, stays on its WebSocket, and upstream the turn ran
// once and completed (not cut and run again), every request of the thread
// on its one account; the turn after both restarts carries the thread's
// history.
func TestRollingRestartUnderCodex(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct {
		name string
		ws   bool
	}{{"http", false}, {"websocket", true}} {
		t.Run(tc.name, func(t *testing.T) { rollingRestartUnderCodex(t, bin, tc.ws) })
	}
}

func rollingRestartUnderCodex(t *testing.T, bin string, ws bool) {
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{{ID: "k1", Kind: sim.KindOpenAI, AccessToken: "sk-sim-k1", Organization: "org-k"}}})
	t.Cleanup(upstream.Close)
	env := crashEnv(storetest.PostgresURL(t), upstream)
	procs := []*process{startProcess(t, bin, env), startProcess(t, bin, env)}
	require.Eventually(t, func() bool { return liveReplicas(procs[0].url) == 2 && liveReplicas(procs[1].url) == 2 },
		time.Minute, 50*time.Millisecond, "both replicas registered")
	code, _, raw := request(t, http.MethodPost, procs[0].url+"/api/v1/accounts", crashAdminToken,
		map[string]any{"label": "k1", "kind": "openai", "base_url": upstream.OpenAIBaseURL(), "organization": "org-k", "api_key": "sk-sim-k1"})
	require.Equal(t, http.StatusCreated, code, raw)
	code, key, raw := request(t, http.MethodPost, procs[1].url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	lb, srv := newBalancer(t, procs[0].url, procs[1].url)
	codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/v1", WebSockets: ws, Key: key["key"].(string)})

	checkRun := func(what string, res *codexcli.Result, err error) {
		t.Helper()
		require.NoError(t, err, what)
		codexcli.RequireSuccess(t, res)
		assert.NotEmpty(t, res.FinalMessage, "%s: Codex printed an answer", what)
		assert.Empty(t, res.Errors, "%s: no error and no reconnect", what)
		if ws {
			assert.Empty(t, res.WebSocketFallback(), "%s: Codex stayed on its WebSocket", what)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a Codex run left behind by a failed check ends with the test
	res, err := codex.Exec(ctx, "remember the word teal", codexcli.RunOptions{Timeout: time.Minute})
	checkRun("turn 1", res, err)
	thread := res.ThreadID
	require.NotEmpty(t, thread)

	for i, name := range []string{"A", "B"} {
		since := seqMark(upstream)
		lb.aim(i)
		type outcome struct {
			res *codexcli.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := codex.Resume(ctx, thread, "a slow answer [[sim:events 150]] [[sim:gap 20ms]]", codexcli.RunOptions{Timeout: time.Minute})
			done <- outcome{res, err}
		}()
		require.Eventually(t, func() bool {
			for _, r := range upstream.Requests(sim.RecordFilter{ThreadID: thread, Since: since}) {
				if !r.Done && (r.Generate == nil || *r.Generate) && r.Events >= 10 { // deltas are reaching Codex
					return true
				}
			}
			return false
		}, time.Minute, 10*time.Millisecond, "replica %s: the slow turn is streaming", name)
		require.Positive(t, lb.openOn(i), "replica %s carries the slow turn", name)

		stopping := time.Now()
		require.NoError(t, procs[i].cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-procs[i].done:
			require.NoError(t, err, "replica %s exits 0 once drained", name)
		case <-time.After(rollingGrace + 5*time.Second):
			t.Fatalf("replica %s did not exit within the grace time", name)
		}
		drained := time.Since(stopping)
		procs[i] = startProcess(t, bin, env)
		lb.replace(t, i, procs[i].url)
		t.Logf("replica %s: drained and exited in %v, restarted at %s %v after SIGTERM", name, drained.Round(time.Millisecond),
			procs[i].url, time.Since(stopping).Round(time.Millisecond))

		var o outcome
		select {
		case o = <-done:
		case <-time.After(90 * time.Second):
			t.Fatalf("the Codex turn during replica %s's restart did not end", name)
		}
		checkRun("the turn during replica "+name+"'s restart", o.res, o.err)
		generated := 0
		for _, r := range upstream.Requests(sim.RecordFilter{ThreadID: thread, Since: since}) {
			assert.Equal(t, sim.OutcomeCompleted, r.Outcome, "replica %s's restart: request %d completed upstream, not cut", name, r.Seq)
			if r.Generate == nil || *r.Generate {
				generated++
			}
		}
		assert.Equal(t, 1, generated, "replica %s's restart: the slow turn ran once upstream, not again after a cut", name)
	}

	require.Eventually(t, func() bool { return liveReplicas(procs[0].url) == 2 && liveReplicas(procs[1].url) == 2 },
		time.Minute, 50*time.Millisecond, "the restarted replicas registered, the stopped ones are gone")
	since := seqMark(upstream)
	res, err = codex.Resume(ctx, thread, "what was the word?", codexcli.RunOptions{Timeout: time.Minute})
	checkRun("the turn after both restarts", res, err)

	all := upstream.Requests(sim.RecordFilter{ThreadID: thread})
	var last, before *sim.Record  // the last turn's request; the turn before's
	widest := 0                   // the most input items any earlier request carried
	prewarms := map[string]bool{} // the last turn's prewarm responses
	for _, r := range all {
		assert.Equal(t, "k1", r.Account, "request %d went to the thread's account", r.Seq)
		assert.Equal(t, sim.OutcomeCompleted, r.Outcome, "request %d", r.Seq)
		switch {
		case r.Generate != nil && !*r.Generate: // Codex's WebSocket prewarm
			if r.Seq > since {
				prewarms[r.ResponseID] = true
			}
		case r.Seq <= since:
			before = &r
			widest = max(widest, r.InputCount)
		default:
			last = &r
		}
	}
	require.NotNil(t, before)
	require.NotNil(t, last, "the last turn reached the sim")
	if last.PreviousResponseID == "" || prewarms[last.PreviousResponseID] {
		// Sent whole (after a prewarm, Codex's request over a new
		// WebSocket refers to the prewarm's empty response).
		assert.Greater(t, last.InputCount, widest, "the last turn carried the thread's history")
	} else {
		assert.Equal(t, before.ResponseID, last.PreviousResponseID, "the last turn, a delta, went on from the slow turn's answer")
	}
	t.Logf("the thread: %d requests upstream; the last carried %d input items (previous_response_id %q)",
		len(all), last.InputCount, last.PreviousResponseID)
}
