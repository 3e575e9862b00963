//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
)

// The upstream dies under a relay process, or stops answering: the
// simulated upstream runs as a process of its own and is SIGKILLed or
// SIGSTOPped mid-answer, and accounts point at loopback ports that take
// connections and never answer, or never take them. Every client, over
// every transport, gets a terminal event within the deadline that applies
// (the relay's stall deadline, or its connect and handshake deadlines),
// never a hang; the attempt is recorded with the class classify gives that
// failure (stream_cut, stall, transport: the upstream's, never the
// account's auth or quota), the account keeps its standing, a request that
// failed before any output moves to another account of the organisation,
// and the next request works once the upstream is back.

const (
	// upStall is the relay's stall deadline here
	// (CODEX_RELAY_STREAM_IDLE_TIMEOUT).
	upStall = 3 * time.Second
	// upConnect and upHandshake are the relay's own deadlines on
	// connecting to an upstream and on its WebSocket handshake
	// (relay.NewUpstreamWith: the dialer's 10s, Upstream.DialTimeout 15s).
	upConnect   = 10 * time.Second
	upHandshake = 15 * time.Second
	// upGuard bounds every turn a client runs: past it the client hangs,
	// and the test fails there.
	upGuard = 40 * time.Second
	// upMargin is how late after its deadline a terminal event may come
	// (a loaded machine, the race detector).
	upMargin = 5 * time.Second
)

// The client transports: Codex over HTTP (session and thread headers: the
// relay bridges the thread over an upstream WebSocket lane), a script over
// HTTP with no identity (a plain HTTP request upstream), and Codex over a
// WebSocket (a direct upstream lane).
const (
	overSSE   = "sse"
	overPlain = "sse-plain"
	overWS    = "ws"
)

var upTransports = []string{overSSE, overPlain, overWS}

// TestUpstreamDies: see the comment above.
func TestUpstreamDies(t *testing.T) {
	f := newUpFixture(t)
	t.Run("sim killed mid-stream", func(t *testing.T) {
		for _, tr := range upTransports {
			t.Run(tr, func(t *testing.T) { f.killedMidStream(t, tr) })
		}
	})
	t.Run("sim frozen mid-stream", func(t *testing.T) {
		for _, tr := range upTransports {
			t.Run(tr, func(t *testing.T) { f.frozenMidStream(t, tr) })
		}
	})
	t.Run("black-hole port", func(t *testing.T) {
		// Every case waits for a deadline of the relay: they all run at
		// once, and are checked one by one as they end.
		var cases []*blackHoleCase
		for _, account := range []string{"hole", "deaf"} {
			for _, tr := range upTransports {
				for _, failover := range []bool{false, true} {
					bc := &blackHoleCase{name: map[string]string{"hole": "accepts, never answers", "deaf": "never accepts"}[account] + "/" + tr +
						map[bool]string{true: "/fails over", false: "/alone"}[failover], account: account, tr: tr, failover: failover}
					bc.deadline, bc.class = blackHoleExpect(account, tr)
					cases = append(cases, bc)
					if _, ok := f.accounts[account]; ok {
						f.startBlackHole(t, bc)
					}
				}
			}
		}
		for _, bc := range cases {
			t.Run(bc.name, func(t *testing.T) {
				if bc.ended == nil {
					t.Skip("a port that never accepts relies on Linux's accept queue")
				}
				f.checkBlackHole(t, bc)
			})
		}
	})
	for label, id := range f.accounts {
		assert.Equal(t, "active", accountStatus(f.relay.url, id),
			"account %s keeps its standing: a dead or silent upstream is no auth, billing or quota failure", label)
	}
}

// upFixture is one relay process, the simulated upstream process (k1 and
// k2, one organisation), a port that takes connections and never answers
// (hole) and one that never takes them (deaf), each an account of the
// same organisation ahead of k2 (priority 10).
type upFixture struct {
	bin      string
	relay    *process
	sim      *process // the sim process running now; replaced by restarts (owned by the test's goroutine)
	simAddr  string
	accounts map[string]string // label -> the relay's account id
}

func newUpFixture(t *testing.T) *upFixture {
	f := &upFixture{bin: buildBinary(t), accounts: map[string]string{}}
	f.sim = startSimProcess(t, f.bin, "127.0.0.1:0")
	f.simAddr = strings.TrimPrefix(f.sim.url, "http://")
	t.Cleanup(func() {
		_ = f.sim.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("sim log:\n%s", f.sim.stderr.String())
		}
	})
	hole, deaf := blackHole(t), ""
	if runtime.GOOS == "linux" {
		deaf = deafPort(t)
	}
	f.relay = startProcess(t, f.bin, []string{"CODEX_RELAY_DATABASE_URL=" + filepath.Join(t.TempDir(), "relay.db"),
		"CODEX_RELAY_SECRET_KEY=a-secret-key-of-the-updeath-tests", "CODEX_RELAY_ADMIN_TOKEN=" + crashAdminToken,
		"CODEX_RELAY_LOG_LEVEL=info", "CODEX_RELAY_ADDR=127.0.0.1:0", "CODEX_RELAY_STREAM_IDLE_TIMEOUT=" + upStall.String()})
	for _, a := range []struct {
		label, base string
		priority    int
	}{{"k1", f.sim.url + "/v1", 0}, {"k2", f.sim.url + "/v1", 0}, {"hole", "http://" + hole + "/v1", 10}, {"deaf", "http://" + deaf + "/v1", 10}} {
		if a.label == "deaf" && deaf == "" {
			continue
		}
		code, acc, raw := request(t, http.MethodPost, f.relay.url+"/api/v1/accounts", crashAdminToken, map[string]any{"label": a.label, "kind": "openai",
			"base_url": a.base, "organization": "org-k", "api_key": "sk-sim-" + a.label, "priority": a.priority})
		require.Equal(t, http.StatusCreated, code, raw)
		f.accounts[a.label] = acc["id"].(string)
	}
	return f
}

// restartSim starts the sim again on the port it had.
func (f *upFixture) restartSim(t *testing.T) {
	t.Helper()
	f.sim = startSimProcess(t, f.bin, f.simAddr)
}

// key makes a client key that may use only the accounts labelled.
func (f *upFixture) key(t *testing.T, labels ...string) (key, id string) {
	t.Helper()
	var ids []string
	for _, l := range labels {
		ids = append(ids, f.accounts[l])
	}
	code, k, raw := request(t, http.MethodPost, f.relay.url+"/api/v1/keys", crashAdminToken, map[string]any{"name": t.Name(), "account_ids": ids})
	require.Equal(t, http.StatusCreated, code, raw)
	return k["key"].(string), k["id"].(string)
}

// killedMidStream: the sim is SIGKILLed while it streams a slow answer.
// The client's stream ends with response.failed at once (the relay sees
// the connection end), recorded as the upstream's stream_cut; a request
// while the sim is dead is refused at once (connection refused: transport);
// the sim restarted on its port serves the next request.
func (f *upFixture) killedMidStream(t *testing.T, tr string) {
	key, keyID := f.key(t, "k1")
	c := newUpClient(t, tr, f.relay.url, key)
	c.turn(t, "hello").served(t)

	tn := c.begin(t, "a long answer [[sim:events 400]] [[sim:gap 25ms]]")
	tn.waitDeltas(t, 3)
	dead := f.sim
	killNine(t, dead)
	killed := time.Now()
	t.Cleanup(func() {
		if f.sim == dead { // not restarted (the test failed first): the next subtests need it
			f.restartSim(t)
		}
	})
	end := tn.end(t)
	t.Logf("%s: SIGKILL after %d deltas; the client read %s %q %v after the kill (%v after its request)",
		tr, 3, end.typ, end.code, end.at.Sub(killed).Round(time.Millisecond), end.at.Sub(tn.start).Round(time.Millisecond))
	assert.Equal(t, "response.failed", end.typ, "a cut stream ends with response.failed")
	assert.Equal(t, "upstream_stream_interrupted", end.code)
	assert.Less(t, end.at.Sub(killed), upMargin, "at once: the relay saw the connection end, it did not wait for a deadline")
	att := f.attempts(t, keyID, 2)
	require.Len(t, att, 1, "output reached the client: nothing is retried")
	assert.Equal(t, f.accounts["k1"], att[0].AccountID)
	assert.Equal(t, "stream_cut", att[0].Class, "the upstream's connection ended without a terminal event")
	assert.Equal(t, "terminal", att[0].Action)
	t.Logf("%s: attempt %s/%s, %d %s (%s)", tr, att[0].Class, att[0].Action, att[0].Status, att[0].ErrorCode, att[0].Detail)

	refused := c.turn(t, "while the upstream is dead")
	t.Logf("%s: with the sim dead, the client read %s %d %q in %v", tr, refused.typ, refused.status, refused.code, refused.took().Round(time.Millisecond))
	refused.failedWith(t, http.StatusBadGateway, "upstream_unreachable")
	assert.Less(t, refused.took(), upMargin, "a refused connection is answered at once")
	att = f.attempts(t, keyID, 3)
	require.NotEmpty(t, att)
	assert.Equal(t, f.accounts["k1"], att[0].AccountID)
	assert.Equal(t, "transport", att[0].Class, "connection refused")
	assert.Equal(t, "next_account", att[0].Action, "nothing reached the client: another account could take it (the key allows none)")
	t.Logf("%s: attempt %s/%s, %d %s (%s)", tr, att[0].Class, att[0].Action, att[0].Status, att[0].ErrorCode, att[0].Detail)

	f.restartSim(t)
	back := c.turn(t, "once the upstream is back")
	back.served(t)
	att = f.attempts(t, keyID, 4)
	require.Len(t, att, 1)
	assert.Equal(t, "ok", att[0].Class)
	t.Logf("%s: the restarted sim served the next request in %v", tr, back.took().Round(time.Millisecond))
}

// frozenMidStream: the sim is SIGSTOPped while it streams: its sockets stay
// open and say nothing. The relay's stall deadline ends the client's stream
// with response.failed, recorded as a stall; once the sim runs again the
// next request is served.
func (f *upFixture) frozenMidStream(t *testing.T, tr string) {
	key, keyID := f.key(t, "k1")
	c := newUpClient(t, tr, f.relay.url, key)
	tn := c.begin(t, "a long answer [[sim:events 400]] [[sim:gap 25ms]]")
	tn.waitDeltas(t, 3)
	require.NoError(t, f.sim.cmd.Process.Signal(syscall.SIGSTOP))
	frozen := time.Now()
	cont := sync.OnceFunc(func() { _ = f.sim.cmd.Process.Signal(syscall.SIGCONT) })
	t.Cleanup(cont)
	end := tn.end(t)
	took := end.at.Sub(frozen)
	t.Logf("%s: SIGSTOP after 3 deltas; the client read %s %q %v after the freeze (stall deadline %v)", tr, end.typ, end.code, took.Round(time.Millisecond), upStall)
	assert.Equal(t, "response.failed", end.typ)
	assert.Equal(t, "upstream_stream_interrupted", end.code)
	assert.Greater(t, took, upStall-time.Second, "the stall deadline ended it, nothing earlier")
	assert.Less(t, took, upStall+upMargin, "within the stall deadline")
	att := f.attempts(t, keyID, 1)
	require.Len(t, att, 1)
	assert.Equal(t, "stall", att[0].Class)
	assert.Equal(t, "terminal", att[0].Action)
	t.Logf("%s: attempt %s/%s, %d %s (%s)", tr, att[0].Class, att[0].Action, att[0].Status, att[0].ErrorCode, att[0].Detail)

	cont()
	c.turn(t, "once the upstream runs again").served(t)
	att = f.attempts(t, keyID, 2)
	require.Len(t, att, 1)
	assert.Equal(t, "ok", att[0].Class)
}

// blackHoleCase is one request on the account labelled account, whose
// port never answers: alone, or with a live account of the organisation
// beside it (k2). It runs while the others do; ended tells how it ended.
type blackHoleCase struct {
	name, account, tr string
	failover          bool
	deadline          time.Duration // when the relay gives up on the port
	class             string        // the class of that attempt
	keyID             string
	ended             chan upResult // nil: not run
}

// blackHoleExpect is what the relay does with a request on the account
// labelled account (hole or deaf) from a client over tr: when it gives up
// on the port, and the class of that attempt.
func blackHoleExpect(account, tr string) (time.Duration, string) {
	switch {
	case account == "deaf":
		return upConnect, "transport" // connecting has its own deadline
	case tr == overPlain:
		return upStall, "stall" // the request went: its answer has the stall deadline to start
	}
	return upHandshake, "transport" // the lane's WebSocket handshake has its own deadline
}

// upResult is how a turn run in a goroutine of its own ended.
type upResult struct {
	end upEnd
	err error
}

// startBlackHole sends bc's request and reads its answer in a goroutine of
// its own.
func (f *upFixture) startBlackHole(t *testing.T, bc *blackHoleCase) {
	labels := []string{bc.account}
	if bc.failover {
		labels = append(labels, "k2")
	}
	var key string
	key, bc.keyID = f.key(t, labels...)
	c := newUpClient(t, bc.tr, f.relay.url, key)
	ctx, cancel := context.WithTimeout(context.Background(), upGuard)
	t.Cleanup(cancel)
	bc.ended = make(chan upResult, 1)
	go func() {
		tn, err := c.start(ctx, "into the void")
		if err != nil {
			bc.ended <- upResult{err: err}
			return
		}
		e, err := tn.finish()
		bc.ended <- upResult{end: e, err: err}
	}()
}

// checkBlackHole checks bc: it ended within its deadline, the attempt on the
// black-holed account is recorded with its class; alone, the client got a
// terminal error; with k2 beside it, the request moved there and was
// served.
func (f *upFixture) checkBlackHole(t *testing.T, bc *blackHoleCase) {
	r := <-bc.ended
	require.NoError(t, r.err, "%s: the client reads a terminal event within %v", bc.tr, upGuard)
	tn := r.end
	t.Logf("%s on %s: the client read %s %d %q after %v (the relay's deadline: %v)", bc.tr, bc.account, tn.typ, tn.status, tn.code,
		tn.took().Round(time.Millisecond), bc.deadline)
	att := f.attempts(t, bc.keyID, 1)
	require.NotEmpty(t, att)
	assert.Equal(t, f.accounts[bc.account], att[0].AccountID, "the black-holed account, of the higher priority, is tried first")
	assert.Equal(t, bc.class, att[0].Class)
	assert.Equal(t, "next_account", att[0].Action, "nothing reached the client: the request may move")
	assert.Greater(t, att[0].duration(), bc.deadline-time.Second, "the relay waited for its deadline: %s", att[0].Detail)
	assert.Less(t, att[0].duration(), bc.deadline+upMargin, "and no longer: %s", att[0].Detail)
	t.Logf("%s on %s: attempt %s/%s after %v, %d %s (%s)", bc.tr, bc.account, att[0].Class, att[0].Action, att[0].duration().Round(time.Millisecond),
		att[0].Status, att[0].ErrorCode, att[0].Detail)
	if !bc.failover {
		tn.failedWith(t, http.StatusBadGateway, "upstream_unreachable")
		assert.Less(t, tn.took(), bc.deadline+upMargin)
		return
	}
	tn.served(t)
	assert.Less(t, tn.took(), bc.deadline+upMargin, "served right after the black hole's deadline")
	require.Len(t, att, 2)
	assert.Equal(t, f.accounts["k2"], att[1].AccountID, "the live account of the organisation served it")
	assert.Equal(t, f.accounts[bc.account], att[1].FromAccountID)
	assert.Equal(t, "ok", att[1].Class)
	assert.Equal(t, "failover", att[1].Recovery)
}

// attemptRecord is an attempt as GET /api/v1/diagnostics shows it.
type attemptRecord struct {
	AccountID     string    `json:"account_id"`
	FromAccountID string    `json:"from_account_id"`
	Class         string    `json:"class"`
	Recovery      string    `json:"recovery"`
	Action        string    `json:"action"`
	Status        int       `json:"status"`
	ErrorCode     string    `json:"error_code"`
	Detail        string    `json:"detail"`
	Seq           int       `json:"seq"`
	StartedAt     time.Time `json:"started_at"`
	EndedAt       time.Time `json:"ended_at"`
}

func (a attemptRecord) duration() time.Duration { return a.EndedAt.Sub(a.StartedAt) }

// attempts waits until the client key keyID has n requests logged (a
// request is logged once its client has the answer) and returns the
// attempts of the newest, in order.
func (f *upFixture) attempts(t *testing.T, keyID string, n int) []attemptRecord {
	t.Helper()
	var reqs struct {
		Requests []struct {
			ID string `json:"id"`
		} `json:"requests"`
		Total int `json:"total"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		adminGet(t, f.relay.url+"/api/v1/requests?client_key="+keyID, &reqs)
		if reqs.Total >= n {
			break
		}
		require.True(t, time.Now().Before(deadline), "request %d of the key is logged within 10s (%d are)", n, reqs.Total)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, n, reqs.Total, "the key's requests")
	var diag struct {
		Attempts []attemptRecord `json:"attempts"`
	}
	adminGet(t, f.relay.url+"/api/v1/diagnostics?request="+reqs.Requests[0].ID, &diag)
	att := diag.Attempts
	for i, j := 0, len(att)-1; i < j; i, j = i+1, j-1 {
		att[i], att[j] = att[j], att[i] // newest first: make it oldest first
	}
	return att
}

// adminGet decodes the admin API's answer to GET url into out.
func adminGet(t *testing.T, url string, out any) {
	t.Helper()
	code, _, raw := request(t, http.MethodGet, url, crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	require.NoError(t, json.Unmarshal([]byte(raw), out))
}

var simListening = regexp.MustCompile(`codex-relay sim listening on (http://\S+)`)

// startSimProcess runs `bin sim` on addr (port 0: a free one) with the
// OpenAI accounts k1 and k2 of org-k, and waits for its banner. The caller
// ends it.
func startSimProcess(t *testing.T, bin, addr string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, "sim", "-addr", addr,
		"-account", "id=k1,kind=openai,org=org-k,token=sk-sim-k1",
		"-account", "id=k2,kind=openai,org=org-k,token=sk-sim-k2"),
		stderr: &logbuf.Buffer{}, done: make(chan error, 1)}
	out := &logbuf.Buffer{}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	p.cmd.Stdout, p.cmd.Stderr = out, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	deadline := time.After(30 * time.Second)
	for {
		if m := simListening.FindStringSubmatch(out.String()); m != nil {
			p.url = m[1]
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("the sim exited before listening: %v\n%s%s", err, out.String(), p.stderr.String())
		case <-deadline:
			_ = p.cmd.Process.Kill()
			t.Fatalf("the sim did not listen within 30s:\n%s%s", out.String(), p.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// blackHole listens on loopback, takes every connection, reads what comes
// and never answers: an upstream that stopped answering.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu     sync.Mutex
		conns  []net.Conn // guarded by mu
		closed bool       // guarded by mu
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				c.Close()
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// deafPort listens on loopback with an accept queue of one, filled by a
// connection of its own and never accepted: Linux answers no further SYN
// on it (an accept queue overflow drops it), so a dial there hangs until
// its deadline.
func deafPort(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for filled := 0; ; filled++ {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			require.Positive(t, filled, "the first connection fills the queue: %v", err)
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "a dial hangs, it is not refused: %v", err)
			return addr // the queue is full: dials hang now
		}
		t.Cleanup(func() { c.Close() })
		require.Less(t, filled, 4, "the accept queue of a listener with backlog 0 fills")
	}
}

// upThreads numbers the test clients' sessions and threads.
var upThreads atomic.Int64

// upClient is one client of the relay over one transport: one thread,
// except over plain HTTP, which sends no identity.
type upClient struct {
	tr              string
	base, key       string
	session, thread string
	ws              *websocket.Conn // over WebSocket: the session's connection
}

func newUpClient(t *testing.T, tr, base, key string) *upClient {
	n := upThreads.Add(1)
	c := &upClient{tr: tr, base: base, key: key}
	if tr != overPlain {
		c.session = fmt.Sprintf("019a5555-0000-7000-8000-%012d", n)
		c.thread = fmt.Sprintf("019a5555-0000-7000-9000-%012d", n)
	}
	if tr == overWS {
		c.ws = dialRelayWS(t, base, key, c.session, c.thread)
	}
	return c
}

// upTurn is one request under way, as its client reads it. Its reads are
// bounded by upGuard from its start.
type upTurn struct {
	tr     string
	ctx    context.Context
	start  time.Time
	ws     *websocket.Conn
	sse    *sseStream // a streamed HTTP answer
	status int        // the HTTP answer's status
	body   []byte     // an HTTP answer that was no stream, until read
	deltas int        // output deltas read so far
}

// start sends text as a new turn (its input whole: no chain), bounded by
// ctx, and returns once the request went (over HTTP, once the answer's
// headers came).
func (c *upClient) start(ctx context.Context, text string) (*upTurn, error) {
	tn := &upTurn{tr: c.tr, ctx: ctx, start: time.Now(), ws: c.ws}
	input := []any{textMessage(text)}
	if c.ws != nil {
		msg, err := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.4", "store": false, "input": input})
		if err != nil {
			return nil, err
		}
		return tn, c.ws.Write(ctx, websocket.MessageText, msg)
	}
	body, err := json.Marshal(map[string]any{"model": "gpt-5.4", "stream": true, "store": false, "input": input})
	if err != nil {
		return nil, err
	}
	path := "/backend-api/codex/responses"
	if c.tr == overPlain {
		path = "/v1/responses" // as the OpenAI SDKs send it
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	if c.session != "" {
		req.Header.Set("session-id", c.session)
		req.Header.Set("thread-id", c.thread)
	}
	resp, err := http.DefaultClient.Do(req) // ctx's end closes the body
	if err != nil {
		return nil, err
	}
	tn.status = resp.StatusCode
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		tn.sse = &sseStream{resp: resp, rd: bufio.NewReader(resp.Body)}
		return tn, nil
	}
	defer resp.Body.Close()
	tn.body, err = io.ReadAll(resp.Body)
	return tn, err
}

// begin starts a turn bounded by upGuard.
func (c *upClient) begin(t *testing.T, text string) *upTurn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), upGuard)
	t.Cleanup(cancel)
	tn, err := c.start(ctx, text)
	require.NoError(t, err, "%s: the relay takes the request within %v", c.tr, upGuard)
	return tn
}

// turn runs one whole turn and returns how it ended.
func (c *upClient) turn(t *testing.T, text string) upEnd {
	t.Helper()
	return c.begin(t, text).end(t)
}

// next is the turn's next event: its type and payload. An HTTP answer that
// was no stream is one event of type "http_error".
func (tn *upTurn) next() (string, []byte, error) {
	switch {
	case tn.ws != nil:
		_, data, err := tn.ws.Read(tn.ctx)
		if err != nil {
			return "", nil, err
		}
		var ev struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return "", data, fmt.Errorf("a frame that is no event: %w", err)
		}
		return ev.Type, data, nil
	case tn.sse != nil:
		ev, err := tn.sse.next()
		return ev.Type, ev.Data, err
	case tn.body != nil:
		b := tn.body
		tn.body = nil
		return "http_error", b, nil
	}
	return "", nil, io.EOF
}

func isTurnEnd(typ string) bool {
	switch typ {
	case "response.completed", "response.incomplete", "response.failed", "error", "http_error":
		return true
	}
	return false
}

// waitDeltas reads until the turn has streamed n output deltas.
func (tn *upTurn) waitDeltas(t *testing.T, n int) {
	t.Helper()
	for tn.deltas < n {
		typ, data, err := tn.next()
		require.NoError(t, err, "%s: the long answer streams", tn.tr)
		require.False(t, isTurnEnd(typ), "%s: the long answer streams: %s", tn.tr, data)
		if typ == "response.output_text.delta" {
			tn.deltas++
		}
	}
}

// upEnd is how a turn ended, as its client read it.
type upEnd struct {
	tr     string
	typ    string // the terminal event: response.completed, response.failed, error, or http_error
	status int    // the HTTP status of an http_error, or a WebSocket error event's
	code   string // the error code the client read
	data   []byte
	start  time.Time
	at     time.Time // when the client read it
}

func (e upEnd) took() time.Duration { return e.at.Sub(e.start) }

// finish reads the turn's events up to its terminal one; a stream (or a
// connection) that ends without one is an error, and so is the end of the
// turn's context.
func (tn *upTurn) finish() (upEnd, error) {
	if tn.sse != nil {
		defer tn.sse.resp.Body.Close()
	}
	for {
		typ, data, err := tn.next()
		if err != nil {
			return upEnd{}, err
		}
		if typ == "response.output_text.delta" {
			tn.deltas++
		}
		if !isTurnEnd(typ) {
			continue
		}
		e := upEnd{tr: tn.tr, typ: typ, data: data, start: tn.start, at: time.Now()}
		var ev struct {
			Status   int `json:"status"`
			Error    struct{ Code string }
			Response struct {
				Error struct{ Code string }
			}
		}
		_ = json.Unmarshal(data, &ev)
		e.status, e.code = ev.Status, ev.Error.Code
		switch typ {
		case "http_error":
			e.status = tn.status
		case "response.failed":
			e.code = ev.Response.Error.Code
		}
		return e, nil
	}
}

// end reads the turn up to its terminal event: an ended stream or a hang
// fails the test.
func (tn *upTurn) end(t *testing.T) upEnd {
	t.Helper()
	e, err := tn.finish()
	require.NoError(t, err, "%s: the client reads a terminal event, not an ended stream or a hang, within %v", tn.tr, upGuard)
	return e
}

// served checks that the turn completed.
func (e upEnd) served(t *testing.T) {
	t.Helper()
	require.Equal(t, "response.completed", e.typ, "%s: the turn is served: %s", e.tr, e.data)
}

// failedWith checks that the turn ended with the relay's error of status
// and code: an HTTP error answer, or a WebSocket error event.
func (e upEnd) failedWith(t *testing.T, status int, code string) {
	t.Helper()
	want := map[bool]string{true: "error", false: "http_error"}[e.tr == overWS]
	assert.Equal(t, want, e.typ, "%s: %s", e.tr, e.data)
	assert.Equal(t, status, e.status, "%s: %s", e.tr, e.data)
	assert.Equal(t, code, e.code, "%s: %s", e.tr, e.data)
}
