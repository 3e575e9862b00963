package relay_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// replica is one relay process of several sharing a PostgreSQL database.
type replica struct {
	relay  *relay.Server
	srv    *httptest.Server
	served *atomic.Int64 // requests that reached this replica
	stop   func()
}

func startReplica(t *testing.T, dbURL, name string) *replica {
	return startReplicaWith(t, dbURL, name, replicaOptions{})
}

// replicaOptions vary a test replica.
type replicaOptions struct {
	// elsewhere: every request seems to come from another host (not
	// loopback), as on a replica of its own.
	elsewhere bool
	// heartbeat is how often it renews its row; default 2s. A replica
	// counts as gone after three heartbeats missed: on a busy machine a
	// shorter one lapsed mid-test, and another replica took over threads
	// the test had placed.
	heartbeat time.Duration
	// onRequest, if set, sees each request reaching the replica before it
	// does (it may read the body if it puts an equal one back).
	onRequest func(*http.Request)
	// logs, if set, records what the replica logs, besides the test's log.
	logs *logLines
	// alerts, if set, runs the replica's alert loops.
	alerts *alert.Options
}

// logLines records log lines (slog's text form), one per record.
type logLines struct {
	mu    sync.Mutex
	lines []string // guarded by mu
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// containing returns the lines that contain every one of subs.
func (l *logLines) containing(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, sub := range subs {
			if !strings.Contains(line, sub) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// startReplicaWith is startReplica as o varies it.
func startReplicaWith(t *testing.T, dbURL, name string, o replicaOptions) *replica {
	t.Helper()
	if o.heartbeat == 0 {
		o.heartbeat = 2 * time.Second
	}
	elsewhere := o.elsewhere
	st := storetest.Open(t, dbURL, store.Options{})
	var rl *relay.Server
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if elsewhere {
			r.RemoteAddr = "192.0.2.7:40000"
		}
		if o.onRequest != nil {
			o.onRequest(r)
		}
		rl.ServeHTTP(w, r)
	}))
	logger := testLogger(t)
	if o.logs != nil {
		logger = slog.New(slog.NewMultiHandler(logger.Handler(), slog.NewTextHandler(o.logs, nil)))
	}
	rl = relay.New(relay.Config{Store: st, Logger: logger.With("replica", name),
		Replica: relay.ReplicaConfig{Name: name, Heartbeat: o.heartbeat, Address: srv.URL, HopKey: []byte("test hop key, shared by replicas")},
		Alerts:  o.alerts})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rl.Run(ctx) })
	var once sync.Once
	r := &replica{relay: rl, srv: srv, served: &served, stop: func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			rl.Close()
			srv.Close()
		})
	}}
	t.Cleanup(r.stop)
	return r
}

// replicaDatabase is a fresh PostgreSQL database with accounts of a fresh
// sim in it (one, "a1", unless labels names others), for replicas to share.
func replicaDatabase(t *testing.T, labels ...string) (string, *sim.Server, *store.Store) {
	if len(labels) == 0 {
		labels = []string{"a1"}
	}
	dbURL := storetest.PostgresURL(t)
	var accounts []sim.Account
	for _, l := range labels {
		accounts = append(accounts, simAccount(l, "org-a"))
	}
	upstream := sim.NewServer(sim.Config{Accounts: accounts, Logger: testLogger(t)})
	t.Cleanup(upstream.Close)
	setup := storetest.Open(t, dbURL, store.Options{})
	for _, l := range labels {
		_, err := setup.CreateAccount(context.Background(), store.Account{Kind: store.KindChatGPT, Label: l, BaseURL: upstream.CodexBaseURL(), ChatGPTAccountID: l},
			store.Credentials{AccessToken: "at-" + l, RefreshToken: "rt-" + l})
		require.NoError(t, err)
	}
	return dbURL, upstream, setup
}

// roundRobin is a load balancer that sends each request to the next
// replica in turn, as a plain one in front of several replicas does.
func roundRobin(t *testing.T, replicas ...*replica) *httptest.Server {
	var next atomic.Int64
	proxies := make([]*httputil.ReverseProxy, len(replicas))
	for i, r := range replicas {
		u, err := url.Parse(r.srv.URL)
		require.NoError(t, err)
		proxies[i] = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1}
	}
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxies[int(next.Add(1))%len(proxies)].ServeHTTP(w, r)
	}))
	t.Cleanup(lb.Close)
	return lb
}

// Two replicas on one PostgreSQL: each lists the other's lanes (from its
// heartbeat), a thread reset on one closes the thread's lane on the other
// and drops its continuity there, and a stopped replica's lanes leave the
// listing.
func TestReplicasShareLanesAndResets(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)

	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	h := &harness{t: t, sim: upstream, store: setup, relay: b.relay, srv: b.srv}
	resp, body := h.post(sessionS, rootT, responseRequest("on replica b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, 1, b.relay.Bridge().Len(), "replica b holds the thread's bridge lane")
	require.Equal(t, 0, a.relay.Bridge().Len())
	entries, _ := b.relay.Continuity().Len()
	require.Positive(t, entries)

	laneOn := func(r *replica, replicaName string) bool {
		for _, l := range r.relay.Lanes() {
			if l.Replica == replicaName && l.Kind == "bridge" {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return laneOn(a, "replica-b") }, time.Minute, 20*time.Millisecond,
		"replica a lists replica b's lane")
	assert.True(t, laneOn(b, "replica-b"), "and b its own, named")
	for _, l := range a.relay.Lanes() {
		assert.Equal(t, sessionS, l.SessionID, "a bridge lane names its client's session")
		assert.Equal(t, rootT, l.ThreadID, "and thread")
	}

	reset, err := setup.ResetBindings(context.Background(), store.BindingReset{ThreadID: rootT})
	require.NoError(t, err)
	require.NotEmpty(t, reset)
	// The operator resets the thread on replica a. (Said again until heard:
	// b's listener subscribes in the background and may not be up yet.)
	require.Eventually(t, func() bool {
		a.relay.Forget(reset)
		time.Sleep(50 * time.Millisecond)
		return b.relay.Bridge().Len() == 0
	}, time.Minute, 20*time.Millisecond, "replica b closed the reset thread's lane")
	require.Eventually(t, func() bool { entries, _ := b.relay.Continuity().Len(); return entries == 0 }, time.Minute, 20*time.Millisecond,
		"and dropped its continuity")

	resp, body = h.post(sessionS, rootT, responseRequest("again on b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Eventually(t, func() bool { return laneOn(a, "replica-b") }, time.Minute, 20*time.Millisecond)
	b.stop()
	require.Eventually(t, func() bool { return !laneOn(a, "replica-b") }, time.Minute, 20*time.Millisecond,
		"a stopped replica's lanes leave the listing")
}

// The real Codex CLI over HTTP behind a round-robin load balancer in front
// of two replicas: every request of the thread is served by the replica
// holding its lane (the other forwards it), so one upstream lane carries
// the whole thread with deltas, and when that replica stops the other
// takes the thread over.
func TestCodexAcrossReplicasBehindALoadBalancer(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	require.Eventually(t, func() bool { return len(a.relay.Lanes()) == 0 && replicasSee(t, setup) == 2 }, time.Minute, 20*time.Millisecond)
	lb := roundRobin(t, a, b)

	ctx := context.Background()
	codex := codexcli.New(t, codexcli.Provider{BaseURL: lb.URL + "/backend-api/codex", WebSockets: false, Key: "unused"})
	res, err := codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo across-replicas"}]]`, codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Contains(t, res.FinalMessage, "across-replicas")
	resumed, err := codex.Resume(ctx, res.ThreadID, "and once more", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)

	assert.Positive(t, a.served.Load(), "the balancer used replica a")
	assert.Positive(t, b.served.Load(), "and replica b")
	assert.Equal(t, 1, a.relay.Bridge().Len()+b.relay.Bridge().Len(), "one lane for the thread, on one replica")
	recs := h0(t, upstream).responseRecords(res.ThreadID)
	require.GreaterOrEqual(t, len(recs), 3)
	for _, r := range recs[1:] {
		assert.Equal(t, recs[0].ConnID, r.ConnID, "every request went over the holder's lane")
	}
	assert.Equal(t, recs[0].ResponseID, recs[1].PreviousResponseID, "the tool turn's second request went as a delta on it")
	logged, _, err := setup.Requests(ctx, store.RequestFilter{ThreadID: res.ThreadID})
	require.NoError(t, err)
	assert.Len(t, logged, len(recs), "each request logged once, by the replica that served it")

	// The holder stops: the other replica takes the thread over.
	holder, other := a, b
	if b.relay.Bridge().Len() == 1 {
		holder, other = b, a
	}
	holder.stop()
	codex2 := codexcli.New(t, codexcli.Provider{BaseURL: other.srv.URL + "/backend-api/codex", WebSockets: false, Key: "unused"})
	codex2.Home = codex.Home
	again, err := codex2.Resume(ctx, res.ThreadID, "after the holder stopped", codexcli.RunOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, again.ExitCode, again.Stderr)
	assert.Equal(t, 1, other.relay.Bridge().Len(), "the surviving replica holds the thread's lane now")
}

// replicasSee counts the replicas registered as live.
func replicasSee(t *testing.T, st *store.Store) int {
	reps, err := st.Replicas(context.Background(), time.Now().Add(-5*time.Second)) // wide: it also deletes what it leaves out
	require.NoError(t, err)
	return len(reps)
}

// h0 wraps a sim for its record helpers.
func h0(t *testing.T, upstream *sim.Server) *harness { return &harness{t: t, sim: upstream} }

// When a replica's announcement connection drops and comes back, it may
// have missed a reset: it closes its idle lanes rather than keep a thread
// on an account it was reset from.
func TestReplicaDropsLanesAfterALostAnnouncementConnection(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	b := startReplica(t, dbURL, "replica-b")
	h := &harness{t: t, sim: upstream, store: setup, relay: b.relay, srv: b.srv}
	resp, body := h.post(sessionS, rootT, responseRequest("a lane on b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, 1, b.relay.Bridge().Len())

	admin, err := sqlx.Open("postgres", dbURL)
	require.NoError(t, err)
	defer admin.Close()
	// Cut the listener's connection (the server ends its backend), again
	// until it was there to cut: it subscribes in the background.
	require.Eventually(t, func() bool {
		var cut int
		err := admin.Get(&cut, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND query ILIKE 'listen%' AND pid <> pg_backend_pid()`)
		return err == nil && cut > 0
	}, time.Minute, 50*time.Millisecond)
	require.Eventually(t, func() bool { return b.relay.Bridge().Len() == 0 }, time.Minute, 20*time.Millisecond,
		"the idle lane was closed once the listener reconnected")
}

// With no client keys, a relay serves loopback clients only; a request a
// replica admitted so and forwarded reaches the lane's holder from another
// host, and is admitted there on the strength of its verified hop. A
// request without one, or with a forged one, is still refused.
func TestForwardedKeylessRequestIsAdmitted(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	a := startReplica(t, dbURL, "replica-a")
	b := startReplicaWith(t, dbURL, "replica-b", replicaOptions{elsewhere: true})
	require.Eventually(t, func() bool { return replicasSee(t, setup) == 2 }, time.Minute, 20*time.Millisecond, "both registered")
	hdr := http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}}
	ident, err := relay.ParseIdentity(hdr)
	require.NoError(t, err)
	lease, err := setup.LeaseLane(context.Background(), string(ident.Key), "", b.relay.ReplicaID(), time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Equal(t, b.relay.ReplicaID(), lease.ReplicaID, "replica b holds the thread")

	viaA := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv}
	resp, body := viaA.post(sessionS, rootT, responseRequest("forwarded to b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, 1, b.relay.Bridge().Len(), "served on replica b")
	assert.Equal(t, 0, a.relay.Bridge().Len())

	viaB := &harness{t: t, sim: upstream, store: setup, relay: b.relay, srv: b.srv}
	resp, _ = viaB.post(sessionS, rootT, responseRequest("straight to b"), nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a keyless client from another host is refused")
	resp, _ = viaB.post(sessionS, rootT, responseRequest("forged"), http.Header{relay.HeaderHop: {"rep_x.1.00"}})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "so is one with a forged hop")
}

// capturedRequest is a request as it reached a replica.
type capturedRequest struct {
	method, uri string
	header      http.Header
	body        []byte
}

// send sends c again, to r, with the headers in changed in place of its own.
func (c *capturedRequest) send(t *testing.T, r *replica, changed http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, r.srv.URL+c.uri, bytes.NewReader(c.body))
	require.NoError(t, err)
	req.Header = c.header.Clone()
	for k, vs := range changed {
		req.Header[k] = vs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// The probe of issue 36.7: a genuine hop, captured on its way from one
// replica to the other and sent again, gets none of the trust a hop gets.
// Sent to the replica that forwarded it, with another User-Agent and
// originator, or as it was, it is an ordinary request there: forwarded to
// the thread's holder, not served where it landed as a forwarded request is
// (before, it was). Sent again as it was to the replica it was addressed to, it is
// refused as a replay: a keyless request from another host, 401 (before,
// served). Each refusal is logged once, without the hop's header.
func TestReplayedHopIsNotTrusted(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	aLogs, bLogs := &logLines{}, &logLines{}
	a := startReplicaWith(t, dbURL, "replica-a", replicaOptions{logs: aLogs})
	var (
		mu       sync.Mutex
		captured *capturedRequest // the first hop b received
	)
	capture := func(r *http.Request) {
		if r.Header.Get(relay.HeaderHop) == "" {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			panic(err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		defer mu.Unlock()
		if captured == nil {
			captured = &capturedRequest{method: r.Method, uri: r.URL.RequestURI(), header: r.Header.Clone(), body: body}
		}
	}
	b := startReplicaWith(t, dbURL, "replica-b", replicaOptions{elsewhere: true, logs: bLogs, onRequest: capture})
	require.Eventually(t, func() bool { return replicasSee(t, setup) == 2 }, time.Minute, 20*time.Millisecond, "both registered")
	ident, err := relay.ParseIdentity(http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}})
	require.NoError(t, err)
	lease, err := setup.LeaseLane(context.Background(), string(ident.Key), "", b.relay.ReplicaID(), time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Equal(t, b.relay.ReplicaID(), lease.ReplicaID, "replica b holds the thread")

	viaA := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv}
	resp, body := viaA.post(sessionS, rootT, responseRequest("forwarded to b"),
		http.Header{"User-Agent": {"codex_cli_rs/0.130.0"}, "Originator": {"codex_cli_rs"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, 1, b.relay.Bridge().Len(), "served on replica b")
	mu.Lock()
	hop := captured
	mu.Unlock()
	require.NotNil(t, hop, "b received a hop")
	header := hop.header.Get(relay.HeaderHop)
	require.NotEmpty(t, header)

	code, body := hop.send(t, b, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "the hop replayed to b as it was is refused as a replay: %s", body)
	assert.Len(t, bLogs.containing("replica hop refused", "replayed"), 1, "logged once: %q", bLogs.containing("hop"))

	forwardsToB := b.served.Load()
	code, body = hop.send(t, a, http.Header{"User-Agent": {"curl/8.0"}, "Originator": {"someone_else"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, a.relay.Bridge().Len(), "a did not serve it as a request forwarded to it")
	assert.Equal(t, forwardsToB+1, b.served.Load(), "a forwarded it to the thread's holder")
	assert.Len(t, aLogs.containing("replica hop refused", "signature does not match"), 1, "logged once: %q", aLogs.containing("hop"))
	// Its headers as they were, the hop is still not a's to accept.
	code, body = hop.send(t, a, nil)
	require.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, a.relay.Bridge().Len(), "a did not serve it as a request forwarded to it")
	assert.Equal(t, forwardsToB+2, b.served.Load(), "a forwarded it to the thread's holder")
	assert.Len(t, aLogs.containing("replica hop refused", "addressed to another replica"), 1, "logged once: %q", aLogs.containing("hop"))
	assert.Len(t, aLogs.containing("replica hop refused"), 2)
	assert.Len(t, bLogs.containing("replica hop refused"), 1, "the hops a signed afresh verified on b")

	for _, logs := range []*logLines{aLogs, bLogs} {
		assert.Empty(t, logs.containing(header[strings.LastIndexByte(header, '.')+1:]), "no log line holds the hop's signature")
	}
}

// A keyed request a replica forwards to the lane's holder counts once in
// its key's use: where it is served, not also where it arrived.
func TestForwardedKeyedRequestCountsOnce(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	ctx := context.Background()
	k, secret, err := setup.CreateClientKey(ctx, store.ClientKey{Name: "laptop"})
	require.NoError(t, err)
	a := startReplica(t, dbURL, "replica-a")
	b := startReplica(t, dbURL, "replica-b")
	require.Eventually(t, func() bool { return replicasSee(t, setup) == 2 }, time.Minute, 20*time.Millisecond, "both registered")
	ident, err := relay.ParseIdentity(http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}})
	require.NoError(t, err)
	lease, err := setup.LeaseLane(ctx, string(ident.Key), k.ID, b.relay.ReplicaID(), time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Equal(t, b.relay.ReplicaID(), lease.ReplicaID, "replica b holds the thread")

	viaA := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv}
	resp, body := viaA.post(sessionS, rootT, responseRequest("forwarded to b"), http.Header{"Authorization": {"Bearer " + secret}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, 1, b.relay.Bridge().Len(), "served on replica b")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, a.relay.SettleWrites(wctx))
	require.NoError(t, b.relay.SettleWrites(wctx))
	counted, err := setup.ClientKey(ctx, k.ID)
	require.NoError(t, err)
	assert.EqualValues(t, 1, counted.RequestCount, "one request, counted once")
}

// Codex over WebSocket behind the same balancer: each connection stays on
// the replica it reached (its lanes live there), and a resumed thread that
// reaches the other replica goes on there, in full.
func TestCodexWebSocketAcrossReplicas(t *testing.T) {
	dbURL, _, _ := replicaDatabase(t)
	a, b := startReplica(t, dbURL, "replica-a"), startReplica(t, dbURL, "replica-b")
	lb := roundRobin(t, a, b)
	ctx := context.Background()
	codex := codexcli.New(t, codexcli.Provider{BaseURL: lb.URL + "/backend-api/codex", WebSockets: true, Key: "unused"})
	res, err := codex.Exec(ctx, `run it [[sim:tool exec_command {"cmd":"echo ws-across"}]]`, codexcli.RunOptions{BypassSandbox: true})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Contains(t, res.FinalMessage, "ws-across")
	assert.Empty(t, res.WebSocketFallback(), "Codex kept its WebSocket")
	for range 2 {
		resumed, err := codex.Resume(ctx, res.ThreadID, "and again", codexcli.RunOptions{})
		require.NoError(t, err)
		require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)
		assert.Empty(t, resumed.WebSocketFallback())
	}
	assert.Positive(t, a.served.Load(), "replica a took connections")
	assert.Positive(t, b.served.Load(), "and so did replica b")
}

// A holder that is alive by its heartbeat but cannot be reached: the
// request is served where it landed, and the client never notices.
func TestUnreachableHolderIsServedAround(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	a := startReplica(t, dbURL, "replica-a")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	beat := func() error {
		return setup.Heartbeat(context.Background(), store.Replica{ID: "rep_ghost", Name: "ghost", Address: "http://127.0.0.1:1", StartedAt: time.Now()})
	}
	require.NoError(t, beat())
	wg.Go(func() { // a ghost replica that keeps beating
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
				_ = beat()
			}
		}
	})
	ident, err := relay.ParseIdentity(http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}})
	require.NoError(t, err)
	lease, err := setup.LeaseLane(context.Background(), string(ident.Key), "", "rep_ghost", time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Equal(t, "rep_ghost", lease.ReplicaID)

	h := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv}
	resp, body := h.post(sessionS, rootT, responseRequest("the holder is unreachable"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "response.completed")
	assert.Equal(t, 1, a.relay.Bridge().Len(), "served on replica a")
	still, err := setup.LeaseLane(context.Background(), string(ident.Key), "", "rep_probe", time.Now().Add(-time.Second))
	require.NoError(t, err)
	assert.Equal(t, "rep_ghost", still.ReplicaID, "the holder was alive all along: replica a tried it, then served around it")
}

// A draining replica hands its threads over at once: its row goes, so
// another replica takes its lane leases without waiting for its heartbeat
// to go stale (here it never would: nobody else prunes the row).
func TestDrainingReplicaHandsItsLeasesOver(t *testing.T) {
	dbURL, _, setup := replicaDatabase(t)
	b := startReplica(t, dbURL, "replica-b")
	ctx := context.Background()
	rows := func() int {
		all, err := setup.Replicas(ctx, time.Time{}) // every row, stale ones too; deletes none
		require.NoError(t, err)
		return len(all)
	}
	require.Eventually(t, func() bool { return rows() == 1 }, time.Minute, 20*time.Millisecond, "b registered")
	ident, err := relay.ParseIdentity(http.Header{"Session-Id": {sessionS}, "Thread-Id": {rootT}})
	require.NoError(t, err)
	longAgo := time.Now().Add(-time.Hour) // a heartbeat this old still counts: only a missing row frees the lease
	lease, err := setup.LeaseLane(ctx, string(ident.Key), "", b.relay.ReplicaID(), longAgo)
	require.NoError(t, err)
	require.Equal(t, b.relay.ReplicaID(), lease.ReplicaID)
	still, err := setup.LeaseLane(ctx, string(ident.Key), "", "rep_next", longAgo)
	require.NoError(t, err)
	require.Equal(t, b.relay.ReplicaID(), still.ReplicaID, "b holds it while it serves")

	b.relay.Drain()
	require.Eventually(t, func() bool { return rows() == 0 }, time.Minute, 20*time.Millisecond, "b removed its row")
	taken, err := setup.LeaseLane(ctx, string(ident.Key), "", "rep_next", longAgo)
	require.NoError(t, err)
	assert.Equal(t, "rep_next", taken.ReplicaID, "the next replica takes the thread over at once")
	assert.Equal(t, lease.Epoch+1, taken.Epoch)
}

// A replica whose heartbeat lapsed while it was alive (a slow database, a
// stalled machine) loses its threads' leases to the replica that takes
// them over. Told so, it retires its bridge lane of each and forwards their
// next requests to the new holder, instead of serving them on a lane of
// its own beside the new holder's (a lane that also kept a thread on an
// account an operator had moved it from).
func TestALeaseTakenOverRetiresItsFormerHoldersLane(t *testing.T) {
	dbURL, upstream, setup := replicaDatabase(t)
	ctx := context.Background()
	// b renews its row once an hour: a takes it for gone 1.5 s after its
	// start, though b serves and listens all along.
	b := startReplicaWith(t, dbURL, "replica-b", replicaOptions{heartbeat: time.Hour})
	a := startReplica(t, dbURL, "replica-a")
	onB := &harness{t: t, sim: upstream, store: setup, relay: b.relay, srv: b.srv}
	onA := &harness{t: t, sim: upstream, store: setup, relay: a.relay, srv: a.srv}
	local := func(r *replica, name string) (lanes int, requests int64) {
		for _, l := range r.relay.Lanes() {
			if l.Replica == name {
				lanes++
				requests += l.Requests
			}
		}
		return lanes, requests
	}

	// Both have registered first: on a busy machine a replica's first
	// heartbeat may come late, and a, not seeing b's row yet, would take b
	// for gone before b ever said it was there.
	require.Eventually(t, func() bool {
		all, err := setup.Replicas(ctx, time.Time{}) // every row; deletes none
		require.NoError(t, err)
		return len(all) == 2
	}, time.Minute, 20*time.Millisecond, "both replicas registered")
	resp, body := onB.post(sessionS, rootT, responseRequest("on b"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	lanes, _ := local(b, "replica-b")
	require.Equal(t, 1, lanes, "b holds the thread's bridge lane")
	require.Eventually(t, func() bool {
		live, err := setup.Replicas(ctx, a.relay.ReplicaLiveSince())
		require.NoError(t, err)
		return len(live) == 1 && live[0].ID == a.relay.ReplicaID()
	}, time.Minute, 50*time.Millisecond, "a takes b for gone")

	next := responseRequest("on a")
	next["input"] = []any{userMessage("on b"), userMessage("on a")}
	resp, body = onA.post(sessionS, rootT, next, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	lanes, _ = local(a, "replica-a")
	require.Equal(t, 1, lanes, "a took the thread over and served it on a lane of its own")
	assert.Eventually(t, func() bool { lanes, _ := local(b, "replica-b"); return lanes == 0 }, time.Minute, 20*time.Millisecond,
		"b, told of the takeover, retired its lane: %+v", b.relay.Lanes())

	third := responseRequest("on b again")
	third["input"] = []any{userMessage("on b"), userMessage("on a"), userMessage("on b again")}
	resp, body = onB.post(sessionS, rootT, third, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	lanes, _ = local(b, "replica-b")
	assert.Zero(t, lanes, "b forwarded the thread's request to its new holder")
	lanes, requests := local(a, "replica-a")
	assert.Equal(t, 1, lanes)
	assert.EqualValues(t, 2, requests, "a's lane served the request b forwarded")
	recs := onA.responseRecords(rootT)
	require.Len(t, recs, 3)
	assert.Equal(t, "a1", recs[2].Account)
}
