package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The database goes away under a running relay process, and comes back:
// a PostgreSQL server stopped the hard way (`pg_ctl stop -m immediate`:
// its processes gone, every connection cut) for dbOutage, then started
// again on the same port and data folder; a SQLite file made immutable
// under the process, then writable again. What the issue asks of both:
// streams in progress finish, new requests get a prompt 503
// store_unavailable (never a hang), /readyz says so while /healthz stays
// 200, writes resume once the database is back, and nothing is written
// twice.

// dbOutage is how long PostgreSQL stays down: the 30 seconds of the issue.
const dbOutage = 30 * time.Second

// dbPromptly bounds the time to a 503 while the database is away: the
// relay answers from what it has, without waiting on a driver timeout.
const dbPromptly = 5 * time.Second

// dbPG is a throwaway PostgreSQL server of one test, in a folder of its
// own, on a loopback port of its own, that the test stops and starts.
type dbPG struct {
	t      *testing.T
	initdb string // absolute paths of the server's programs
	pgCtl  string
	dir    string // data/ and log; owned by the postgres user when the test runs as root
	port   int
}

// newDBPG makes and starts a cluster; it is stopped and removed when the
// test ends. Without PostgreSQL's programs the test is skipped, or fails
// when CODEX_RELAY_REQUIRE_E2E=1 (storetest's convention).
func newDBPG(t *testing.T) *dbPG {
	t.Helper()
	missing := func(why string) {
		if storetest.Required() {
			t.Fatalf("%s, but CODEX_RELAY_REQUIRE_E2E=1: this test must run", why)
		}
		t.Skipf("%s: the PostgreSQL outage test is skipped (apt-get install postgresql)", why)
	}
	c := &dbPG{t: t, initdb: dbPGProgram("initdb"), pgCtl: dbPGProgram("pg_ctl")}
	if c.initdb == "" || c.pgCtl == "" {
		missing("initdb or pg_ctl is neither on PATH nor in /usr/lib/postgresql/*/bin")
	}
	var owner *user.User
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: its programs run as postgres.
		if _, err := exec.LookPath("runuser"); err != nil {
			missing("the test runs as root and runuser is missing")
		}
		var err error
		if owner, err = user.Lookup("postgres"); err != nil {
			missing("the test runs as root and there is no postgres user")
		}
	}
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "codex-relay-dbloss-")
	require.NoError(t, err)
	c.dir = dir
	t.Cleanup(func() {
		_, _ = c.run(c.pgCtl, "-D", c.data(), "stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	require.NoError(t, os.Chmod(dir, 0o755))
	if owner != nil {
		uid, _ := strconv.Atoi(owner.Uid)
		gid, _ := strconv.Atoi(owner.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c.port = l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	out, err := c.run(c.initdb, "-D", c.data(), "-A", "trust", "-U", "postgres")
	require.NoError(t, err, "initdb: %s", out)
	c.start()
	return c
}

// dbPGProgram finds one of PostgreSQL's programs: on PATH, else in the
// newest /usr/lib/postgresql/VERSION/bin (where Debian keeps them).
func dbPGProgram(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	sort.Strings(found)
	if len(found) == 0 {
		return ""
	}
	return found[len(found)-1]
}

func (c *dbPG) data() string { return filepath.Join(c.dir, "data") }

// url is the cluster's postgres database as CODEX_RELAY_DATABASE_URL.
func (c *dbPG) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// run runs one of PostgreSQL's programs, as the postgres user when the test
// runs as root, within a minute.
func (c *dbPG) run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// start starts the server on its port and data folder, and waits until it
// takes connections.
func (c *dbPG) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	out, err := c.run(c.pgCtl, "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", opts, "start")
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		require.NoError(c.t, err, "pg_ctl start: %s\n%s", out, logs)
	}
}

// stop stops the server the hard way: every server process quits at once,
// with no checkpoint, and every client connection is cut.
func (c *dbPG) stop() {
	c.t.Helper()
	out, err := c.run(c.pgCtl, "-D", c.data(), "stop", "-m", "immediate")
	require.NoError(c.t, err, "pg_ctl stop: %s", out)
}

// dbAnswer is what came of one request to the relay.
type dbAnswer struct {
	status int
	body   string
	took   time.Duration
	err    error // no answer within the hang guard
}

// storeUnavailable reports a 503 whose error code is store_unavailable.
func (a dbAnswer) storeUnavailable() bool {
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return a.err == nil && a.status == http.StatusServiceUnavailable && json.Unmarshal([]byte(a.body), &body) == nil &&
		body.Error.Code == "store_unavailable"
}

// dbTry sends text as the first request of thread (in a session of its
// own), streamed, with a hang guard of 30s, and reads the whole answer.
func dbTry(base, key, thread, text string) dbAnswer {
	return dbSend(base+"/v1/responses", key, thread, thread, []any{textMessage(text)})
}

// dbSend posts a streamed request of input to url for a thread, with a
// hang guard of 30s, and reads the whole answer.
func dbSend(url, key, session, thread string, input []any) dbAnswer {
	body, _ := json.Marshal(map[string]any{"model": "gpt-5.4", "stream": true, "store": false, "input": input})
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return dbAnswer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("session-id", session)
	req.Header.Set("thread-id", thread)
	start := time.Now()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return dbAnswer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return dbAnswer{status: resp.StatusCode, body: string(raw), took: time.Since(start), err: err}
}

// dbWSTry sends one response.create on conn and reads until the turn's
// terminal event or an error event, 30s at most (the connection must
// neither hang nor close); it returns that event's type and the event.
func dbWSTry(t *testing.T, conn *websocket.Conn, input []any) (string, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.4", "store": false, "input": input})
	require.NoError(t, err)
	require.NoError(t, conn.Write(ctx, websocket.MessageText, msg))
	for {
		_, data, err := conn.Read(ctx)
		require.NoError(t, err, "the WebSocket turn ends with an event, neither a hang nor a close")
		var ev struct {
			Type string `json:"type"`
		}
		require.NoError(t, json.Unmarshal(data, &ev))
		switch ev.Type {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return ev.Type, data
		}
	}
}

// dbWSError is the status and code of a WebSocket error event.
func dbWSError(t *testing.T, data []byte) (int, string) {
	t.Helper()
	var ev struct {
		Status int `json:"status"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(data, &ev))
	return ev.Status, ev.Error.Code
}

// dbGet answers GET path on base within 10s: the status code (0 when
// nothing answered) and the body. It fails no test: it runs inside
// require.Eventually.
func dbGet(base, path string) (int, string) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(base + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// dbLogged is the request log's rows, by thread, as GET /api/v1/requests
// lists them (the newest 100).
func dbLogged(t *testing.T, base string) map[string][]map[string]any {
	t.Helper()
	code, body, raw := request(t, http.MethodGet, base+"/api/v1/requests?limit=100", crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	out := map[string][]map[string]any{}
	for _, r := range body["requests"].([]any) {
		r := r.(map[string]any)
		out[r["thread_id"].(string)] = append(out[r["thread_id"].(string)], r)
	}
	return out
}

// dbServed counts the rows of a request log that say a request was
// served (status 200).
func dbServed(rows []map[string]any) int {
	n := 0
	for _, r := range rows {
		if r["status"] == float64(http.StatusOK) {
			n++
		}
	}
	return n
}

// dbOnlyRefusals checks that rows, apart from the served ones, are at
// most max refusals of the outage: 503 store_unavailable.
func dbOnlyRefusals(t *testing.T, rows []map[string]any, max int, what string) {
	t.Helper()
	refused := 0
	for _, r := range rows {
		if r["status"] == float64(http.StatusOK) {
			continue
		}
		refused++
		assert.Equal(t, float64(http.StatusServiceUnavailable), r["status"], "%s: %v", what, r)
		assert.Equal(t, "store_unavailable", r["error_code"], "%s: %v", what, r)
	}
	assert.LessOrEqual(t, refused, max, "%s: logged at most once each", what)
}

// dbNoRowTwice fails the test when two rows of the request log share an
// id: a request logged twice.
func dbNoRowTwice(t *testing.T, log map[string][]map[string]any) {
	t.Helper()
	seen := map[string]bool{}
	for _, rows := range log {
		for _, r := range rows {
			id := r["id"].(string)
			assert.False(t, seen[id], "request %s logged once", id)
			seen[id] = true
		}
	}
}

// dbStart runs the binary on dbURL with one OpenAI account on a new sim and
// a client key; it returns the process, the sim and the key.
func dbStart(t *testing.T, dbURL string) (*process, *sim.Server, string) {
	t.Helper()
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{{ID: "k1", Kind: sim.KindOpenAI, AccessToken: "sk-sim-k1", Organization: "org-k"}}})
	t.Cleanup(upstream.Close)
	p := startProcess(t, buildBinary(t), crashEnv(dbURL, upstream))
	code, _, raw := request(t, http.MethodPost, p.url+"/api/v1/accounts", crashAdminToken,
		map[string]any{"label": "k1", "kind": "openai", "base_url": upstream.OpenAIBaseURL(), "organization": "org-k", "api_key": "sk-sim-k1"})
	require.Equal(t, http.StatusCreated, code, raw)
	code, key, raw := request(t, http.MethodPost, p.url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	return p, upstream, key["key"].(string)
}

// dbLongStream opens a 10s answer on conv (400 deltas, 25ms apart), reads
// its first deltas, and reads the rest in the background: the channel gets
// the types of the events that came after, once the stream ends.
func dbLongStream(t *testing.T, conv *conversation) <-chan []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream := conv.open(ctx, "a long answer [[sim:events 400]] [[sim:gap 25ms]]")
	for deltas := 0; deltas < 3; {
		ev, err := stream.next()
		require.NoError(t, err, "the long answer streams")
		if ev.Type == "response.output_text.delta" {
			deltas++
		}
	}
	end := make(chan []string, 1)
	go func() {
		var seen []string
		for {
			ev, err := stream.next()
			if err != nil {
				end <- seen
				return
			}
			seen = append(seen, ev.Type)
		}
	}()
	return end
}

// dbStreamCompleted waits (30s at most) for a stream of dbLongStream to end,
// and checks it ended with response.completed.
func dbStreamCompleted(t *testing.T, end <-chan []string) {
	t.Helper()
	select {
	case seen := <-end:
		require.NotEmpty(t, seen, "the stream went on")
		assert.Equal(t, "response.completed", seen[len(seen)-1], "the stream in progress completed: %d events after the first deltas", len(seen))
	case <-time.After(30 * time.Second):
		t.Fatal("the stream in progress did not end within 30s")
	}
}

// The relay on a PostgreSQL server that is stopped for 30 seconds, hard,
// with a WebSocket thread holding a live lane and a long answer streaming
// on another thread. The stream completes. Every new request during the
// outage gets 503 store_unavailable at once (the WebSocket thread's next
// turn an error event saying the same, on a connection that stays open),
// and never reaches the upstream; /readyz answers 503 naming the database,
// /healthz 200. Once the server is back, /readyz turns 200 and requests
// are served (the WebSocket thread's on the same connection), the
// binding of the thread whose answer completed during the outage is
// written, and the request log holds every request served while the
// database was there, once. The request served during the outage leaves no row: the relay does
// not keep rows it could not write.
func TestPostgresGoesAwayAndComesBack(t *testing.T) {
	pg := newDBPG(t)
	p, upstream, key := dbStart(t, pg.url())
	const (
		session = "019a5555-0000-7000-8000-000000000001"
		threadW = "019a5555-0000-7000-8000-0000000000a1" // a WebSocket thread with a live lane
		threadL = "019a5555-0000-7000-8000-0000000000b1" // a long answer across the stop
		threadN = "019a5555-0000-7000-8000-0000000000c1" // new requests during the outage
		threadR = "019a5555-0000-7000-8000-0000000000d1" // a new thread once it is back
	)
	ws := dialRelayWS(t, p.url, key, session, threadW)
	wsHistory := []any{textMessage("over a WebSocket")}
	wsHistory = append(wsHistory, wsTurn(t, ws, wsHistory)...)
	lane := lastResponse(t, upstream, threadW)
	long := &conversation{t: t, base: func() string { return p.url }, path: "/v1/responses", key: key, session: session, thread: threadL}
	streamEnd := dbLongStream(t, long)

	pg.stop()
	stopped := time.Now()
	first := dbTry(p.url, key, threadN, "a new thread while the database is away")
	require.NoError(t, first.err, "the request is answered, not left hanging")
	require.True(t, first.storeUnavailable(), "503 store_unavailable: %d %s", first.status, first.body)
	assert.Less(t, first.took, dbPromptly)
	t.Logf("database stopped: a new thread's request got 503 store_unavailable in %v", first.took.Round(time.Millisecond))

	code, body := dbGet(p.url, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "database unreachable", "/readyz says the database is the cause")
	assert.NotContains(t, body, "127.0.0.1", "but not where it is: /readyz answers anyone")
	t.Logf("/readyz during the outage: %s", body)
	code, body = dbGet(p.url, "/healthz")
	assert.Equal(t, http.StatusOK, code, "the process itself is fine: %s", body)

	typ, ev := dbWSTry(t, ws, append(wsHistory, textMessage("the next turn, the database away")))
	require.Equal(t, "error", typ, "the live thread's next turn is refused: %s", ev)
	status, errCode := dbWSError(t, ev)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "store_unavailable", errCode)

	dbStreamCompleted(t, streamEnd)
	t.Logf("the stream in progress completed %v after the stop", time.Since(stopped).Round(time.Millisecond))

	// Down for the rest of the outage: every request is answered at once.
	var slowest time.Duration
	tries := 1
	for time.Since(stopped) < dbOutage {
		a := dbTry(p.url, key, threadN, "a new thread while the database is away")
		require.True(t, a.storeUnavailable(), "%v %d %s", a.err, a.status, a.body)
		slowest, tries = max(slowest, a.took), tries+1
		time.Sleep(min(time.Second, time.Until(stopped.Add(dbOutage))))
	}
	assert.Less(t, slowest, dbPromptly)
	code, body = dbGet(p.url, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	t.Logf("%d requests during the %v outage: each 503 store_unavailable, the slowest in %v; /readyz at its end: %s",
		tries, dbOutage, slowest.Round(time.Millisecond), body)
	assert.Empty(t, upstream.Requests(sim.RecordFilter{ThreadID: threadN}), "no refused request reached the upstream")

	pg.start()
	back := time.Now()
	require.Eventually(t, func() bool { code, _ := dbGet(p.url, "/readyz"); return code == http.StatusOK },
		time.Minute, 50*time.Millisecond, "/readyz turns 200 once the database is back")
	t.Logf("database back: /readyz 200 after %v", time.Since(back).Round(time.Millisecond))
	(&conversation{t: t, base: func() string { return p.url }, path: "/v1/responses", key: key, session: threadR, thread: threadR}).turn("once it is back")
	t.Logf("database back: a new thread served %v after the start", time.Since(back).Round(time.Millisecond))
	// The long answer's thread was placed as its answer completed, with the
	// database away: its binding, kept for a retry, is written now.
	require.Eventually(t, func() bool {
		code, body, _ := request(t, http.MethodGet, p.url+"/api/v1/bindings?kind=thread&thread="+threadL, crashAdminToken, nil)
		return code == http.StatusOK && body["total"] == float64(1)
	}, time.Minute, 100*time.Millisecond, "the binding of the thread whose answer completed during the outage is written once the database is back")
	sent := append(wsHistory, textMessage("the next turn, the database back"))
	wsTurn(t, ws, sent)
	next := lastResponse(t, upstream, threadW)
	assert.Equal(t, "k1", next.Account)
	if next.ConnID == lane.ConnID {
		// Before the announcements' connection came back.
		assert.Equal(t, lane.ResponseID, next.PreviousResponseID, "a delta on its lane: the refused turn never went upstream")
		t.Logf("the WebSocket thread's next turn went on its lane, as a delta")
	} else {
		// Announcements resumed after a lost connection retire every lane
		// (a binding reset may have gone unheard): a new lane takes the
		// whole history.
		assert.Empty(t, next.PreviousResponseID, "a full request on a new lane")
		assert.Equal(t, len(sent), next.InputCount, "the whole history went upstream, without the refused turn")
		t.Logf("the WebSocket thread's next turn went whole on a new lane (its lane was retired when announcements resumed)")
	}

	// Served while the database was there: one row each (the row is
	// written after the answer, hence the wait). Served during the outage
	// (the long answer): at most one row, never two. Refused during it: a
	// row only if the relay kept it until the database was back (the
	// request log retries what the database did not take), as the refusal
	// it was.
	var log map[string][]map[string]any
	require.Eventually(t, func() bool {
		log = dbLogged(t, p.url)
		return dbServed(log[threadW]) >= 2 && dbServed(log[threadR]) >= 1
	}, time.Minute, 50*time.Millisecond, "the requests served with the database there are logged")
	time.Sleep(200 * time.Millisecond) // a second row of any of them would be written by now
	log = dbLogged(t, p.url)
	dbNoRowTwice(t, log)
	assert.Equal(t, 2, dbServed(log[threadW]), "the WebSocket thread: its two served turns, once each")
	dbOnlyRefusals(t, log[threadW], 1, "the WebSocket thread's refused turn")
	assert.Len(t, log[threadR], 1, "the thread served after the outage, once")
	assert.Equal(t, 1, dbServed(log[threadR]))
	assert.LessOrEqual(t, len(log[threadL]), 1, "the answer completed during the outage is never logged twice")
	dbOnlyRefusals(t, log[threadN], len(log[threadN]), "the refused requests")
	t.Logf("request log: the answer that completed during the outage has %d rows (the relay keeps no row it could not write)", len(log[threadL]))
}

// dbImmutable sets or clears the immutable attribute of paths (chattr): set,
// no process, root included, can write, create, rename or remove them,
// through files opened before too.
func dbImmutable(t *testing.T, on bool, paths ...string) {
	t.Helper()
	flag := map[bool]string{true: "+i", false: "-i"}[on]
	out, err := exec.Command("chattr", append([]string{flag}, paths...)...).CombinedOutput()
	require.NoError(t, err, "chattr %s: %s", flag, out)
}

// The relay on a SQLite file that is made read-only under it: the folder,
// the database file and its write-ahead log made immutable (chattr +i,
// which binds root too, and files the process has open). The -shm file is
// left alone: it is a shared memory map, and a write fault on it kills the
// process outright, whatever a program does. Reads still work there; every
// write fails (SQLITE_IOERR_WRITE). A stream in progress completes; the
// next request is refused with 503 store_unavailable, before it reaches the
// upstream, and so is every one after (the live WebSocket thread's turn as
// an error event); /readyz says the database refuses writes. Made writable
// again, the next request is served and logged, once.
func TestSQLiteReadOnly(t *testing.T) {
	if _, err := exec.LookPath("chattr"); err != nil {
		if storetest.Required() {
			t.Fatal("chattr is missing, but CODEX_RELAY_REQUIRE_E2E=1: this test must run")
		}
		t.Skip("chattr is missing: the SQLite read-only test is skipped (apt-get install e2fsprogs)")
	}
	dir := filepath.Join(t.TempDir(), "db")
	p, upstream, key := dbStart(t, "sqlite:"+filepath.Join(dir, "relay.db"))
	const (
		session = "019a6666-0000-7000-8000-000000000001"
		threadA = "019a6666-0000-7000-8000-0000000000a1" // an HTTP thread
		threadW = "019a6666-0000-7000-8000-0000000000b1" // a WebSocket thread with a live lane
		threadL = "019a6666-0000-7000-8000-0000000000c1" // a long answer across the change
		threadN = "019a6666-0000-7000-8000-0000000000d1" // new requests while read-only
		threadR = "019a6666-0000-7000-8000-0000000000e1" // a new thread once it is writable
	)
	conv := &conversation{t: t, base: func() string { return p.url }, path: "/v1/responses", key: key, session: session, thread: threadA}
	conv.turn("a first turn")
	ws := dialRelayWS(t, p.url, key, session, threadW)
	wsHistory := []any{textMessage("over a WebSocket")}
	wsHistory = append(wsHistory, wsTurn(t, ws, wsHistory)...)
	long := &conversation{t: t, base: func() string { return p.url }, path: "/v1/responses", key: key, session: session, thread: threadL}
	streamEnd := dbLongStream(t, long)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	locked := []string{dir}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "-shm") {
			locked = append(locked, filepath.Join(dir, e.Name()))
		}
	}
	require.Contains(t, locked, filepath.Join(dir, "relay.db-wal"), "the database is in WAL mode")
	t.Cleanup(func() { dbImmutable(t, false, locked...) }) // or the temp folder cannot be removed
	dbImmutable(t, true, locked...)
	readOnly := time.Now()
	_, err = os.OpenFile(filepath.Join(dir, "relay.db-wal"), os.O_WRONLY|os.O_APPEND, 0)
	require.Error(t, err, "the write-ahead log cannot be written, by root either")

	first := dbTry(p.url, key, threadN, "a new thread, the database read-only")
	require.NoError(t, first.err, "the request is answered, not left hanging")
	require.True(t, first.storeUnavailable(), "503 store_unavailable: %d %s", first.status, first.body)
	assert.Less(t, first.took, dbPromptly)
	t.Logf("database read-only: a new thread's request got 503 store_unavailable in %v", first.took.Round(time.Millisecond))
	code, body := dbGet(p.url, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "database refuses writes")
	code, _ = dbGet(p.url, "/healthz")
	assert.Equal(t, http.StatusOK, code)
	t.Logf("/readyz while read-only: %s", body)

	again := dbTry(p.url, key, threadA, "the HTTP thread's next turn")
	assert.True(t, again.storeUnavailable(), "the next turn of a thread is refused too: %v %d %s", again.err, again.status, again.body)
	typ, ev := dbWSTry(t, ws, append(wsHistory, textMessage("the next turn, the database read-only")))
	require.Equal(t, "error", typ, "the live thread's next turn is refused: %s", ev)
	status, errCode := dbWSError(t, ev)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "store_unavailable", errCode)
	code, _, raw := request(t, http.MethodGet, p.url+"/api/v1/accounts", crashAdminToken, nil)
	assert.Equal(t, http.StatusOK, code, "reads still work: %s", raw)
	dbStreamCompleted(t, streamEnd)
	assert.Empty(t, upstream.Requests(sim.RecordFilter{ThreadID: threadN}), "no refused request reached the upstream")

	dbImmutable(t, false, locked...)
	t.Logf("read-only for %v", time.Since(readOnly).Round(time.Millisecond))
	writable := time.Now()
	served := dbTry(p.url, key, threadR, "once it is writable")
	require.NoError(t, served.err)
	require.Equal(t, http.StatusOK, served.status, "the first request after is served: %s", served.body)
	t.Logf("writable again: the first new thread's request was served in %v", served.took.Round(time.Millisecond))
	require.Eventually(t, func() bool { code, _ := dbGet(p.url, "/readyz"); return code == http.StatusOK },
		time.Minute, 20*time.Millisecond, "/readyz turns 200")
	t.Logf("writable again: /readyz 200 after %v", time.Since(writable).Round(time.Millisecond))
	wsTurn(t, ws, append(wsHistory, textMessage("the next turn, the database writable")))

	var log map[string][]map[string]any
	require.Eventually(t, func() bool {
		log = dbLogged(t, p.url)
		return dbServed(log[threadR]) >= 1 && dbServed(log[threadW]) >= 2
	}, time.Minute, 50*time.Millisecond, "writes resume: the requests served after are logged")
	time.Sleep(200 * time.Millisecond) // a second row of any of them would be written by now
	log = dbLogged(t, p.url)
	dbNoRowTwice(t, log)
	assert.Equal(t, 1, dbServed(log[threadA]), "the HTTP thread's first turn, once")
	assert.Equal(t, 2, dbServed(log[threadW]), "the WebSocket thread's turns before and after, once each")
	assert.Equal(t, 1, dbServed(log[threadR]), "the thread served after, once")
	assert.LessOrEqual(t, len(log[threadL]), 1, "the answer completed while read-only is never logged twice")
	assert.Zero(t, dbServed(log[threadN]), "the refused requests were not served")
	t.Logf("request log: the answer that completed while read-only has %d rows", len(log[threadL]))
}

// convTry sends c's next turn (text after its history) to the relay at
// base and reads the whole answer, without adding anything to the history:
// a turn refused is sent again as it was.
func convTry(c *conversation, base, text string) dbAnswer {
	return dbSend(base+c.path, c.key, c.session, c.thread, append(append([]any{}, c.history...), textMessage(text)))
}

// A replica cut off from its database (the link drops every packet, its
// connections stay open) while another keeps its own. The cut one finds out
// by its heartbeat: it says so on /readyz and refuses its requests with 503
// store_unavailable, sending nothing upstream, so it never serves a thread
// whose lease it can no longer renew. Once its heartbeat lapses, the other
// replica serves its thread, on the same account, rebuilt whole. When the
// link comes back, the cut replica has let its leases go: the thread's
// next request there is forwarded to its new holder and goes on as a delta
// on that replica's lane, not on the stale lane left behind.
func TestReplicaCutOffFromItsDatabase(t *testing.T) {
	upstream := crashUpstream(t)
	dbURL := storetest.PostgresURL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	link := storetest.NewLink(t, u.Host)
	viaLink := *u
	viaLink.Host = link.Addr()
	bin := buildBinary(t)
	cut, other := startProcess(t, bin, crashEnv(viaLink.String(), upstream)), startProcess(t, bin, crashEnv(dbURL, upstream))
	require.Eventually(t, func() bool { return liveReplicas(cut.url) == 2 && liveReplicas(other.url) == 2 },
		time.Minute, 50*time.Millisecond, "both replicas registered")
	addCrashAccounts(t, other.url, upstream)
	code, key, raw := request(t, http.MethodPost, other.url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	base := cut.url
	conv := &conversation{t: t, base: func() string { return base }, path: "/backend-api/codex/responses", key: key["key"].(string),
		session: "019a5555-0000-7000-8000-000000000001", thread: "019a5555-0000-7000-9000-000000000001"}
	conv.turn("first turn, on the replica about to be cut off")
	first := lastResponse(t, upstream, conv.thread)
	_, lanes := replicaLanes(t, cut.url)
	require.True(t, lanes[conv.thread], "the thread's lane is on the replica about to be cut off")

	link.Partition()
	cutAt := time.Now()
	require.Eventually(t, func() bool { code, _ := dbGet(cut.url, "/readyz"); return code == http.StatusServiceUnavailable },
		time.Minute, 100*time.Millisecond, "the cut replica's /readyz says it cannot use its database")
	t.Logf("/readyz 503 %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	since := seqMark(upstream)
	ans := convTry(conv, cut.url, "second turn")
	require.True(t, ans.storeUnavailable(), "the cut replica refuses the thread's turn: %d %s %v", ans.status, ans.body, ans.err)
	t.Logf("the cut replica answered 503 store_unavailable in %v", ans.took.Round(time.Millisecond))
	assert.Empty(t, upstream.Requests(sim.RecordFilter{ThreadID: conv.thread, Since: since}), "nothing went upstream")

	require.Eventually(t, func() bool { return liveReplicas(other.url) == 1 }, time.Minute, 100*time.Millisecond,
		"the cut replica's heartbeat lapses")
	t.Logf("the other replica counts the cut one gone %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	base = other.url
	sent := len(conv.history) + 1
	conv.turn("second turn")
	recs := upstream.Requests(sim.RecordFilter{ThreadID: conv.thread, Since: since})
	require.Len(t, recs, 1, "one request upstream")
	moved := recs[0]
	assert.Equal(t, first.Account, moved.Account, "the thread stays on its account")
	assert.Empty(t, moved.PreviousResponseID, "rebuilt whole on the other replica")
	assert.Equal(t, sent, moved.InputCount, "the whole history went upstream")
	assert.NotEqual(t, first.ConnID, moved.ConnID, "on the other replica's lane")

	link.Heal()
	healedAt := time.Now()
	require.Eventually(t, func() bool { code, _ := dbGet(cut.url, "/readyz"); return code == http.StatusOK },
		time.Minute, 50*time.Millisecond, "the cut replica is ready once its link is back")
	t.Logf("/readyz 200 %v after the link came back", time.Since(healedAt).Round(time.Millisecond))
	base = cut.url
	since = seqMark(upstream)
	conv.turn("third turn, sent to the replica that was cut off")
	recs = upstream.Requests(sim.RecordFilter{ThreadID: conv.thread, Since: since})
	require.Len(t, recs, 1, "one request upstream")
	assert.Equal(t, moved.ResponseID, recs[0].PreviousResponseID, "a delta on the new holder's lane")
	assert.Equal(t, moved.ConnID, recs[0].ConnID, "forwarded to the replica that holds the thread now, not served on the stale lane")

	// Cut off again, it still stops when told to: nothing it waits on at
	// the database outlives the shutdown.
	link.Partition()
	require.Eventually(t, func() bool { code, _ := dbGet(cut.url, "/readyz"); return code == http.StatusServiceUnavailable },
		time.Minute, 100*time.Millisecond, "cut off again")
	stopAt := time.Now()
	require.NoError(t, cut.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-cut.done:
		assert.NoError(t, err, "a clean exit on SIGTERM")
		t.Logf("cut off, it stopped %v after SIGTERM", time.Since(stopAt).Round(time.Millisecond))
	case <-time.After(60 * time.Second):
		t.Fatal("the replica cut off from its database did not stop on SIGTERM")
	}
}
