package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
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

// The relay as an operating-system process killed with SIGKILL: no drain,
// no deferred cleanup, sockets cut by the kernel, a database left as the
// last committed transaction left it. What a restart (or a surviving
// replica) must find there is everything an operator or a client relies on:
// accounts, keys, pins, bindings, the newest rotated refresh token, and a
// thread that goes on, on its account, from the history the client resends.

const crashAdminToken = "admin-token-of-the-crash-tests"

// crashUpstream is a sim with an OpenAI key (k1) and a ChatGPT account (c1)
// whose refresh token rotates: each refresh token works once.
func crashUpstream(t *testing.T) *sim.Server {
	t.Helper()
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{
		{ID: "k1", Kind: sim.KindOpenAI, AccessToken: "sk-sim-k1", Organization: "org-k"},
		{ID: "c1", Kind: sim.KindChatGPT, AccessToken: "at-c1", RefreshToken: "rt-c1", Organization: "org-c"},
	}})
	t.Cleanup(upstream.Close)
	return upstream
}

// crashEnv is the environment of every process of a test: one database,
// one secret key, the sim's token endpoint, any free port.
func crashEnv(dbURL string, upstream *sim.Server) []string {
	return []string{"CODEX_RELAY_DATABASE_URL=" + dbURL, "CODEX_RELAY_SECRET_KEY=a-secret-key-that-outlives-the-process",
		"CODEX_RELAY_ADMIN_TOKEN=" + crashAdminToken, "CODEX_RELAY_TOKEN_URL=" + upstream.TokenURL(),
		"CODEX_RELAY_LOG_LEVEL=info", "CODEX_RELAY_ADDR=127.0.0.1:0"}
}

// killNine sends SIGKILL to p and waits for it to be gone.
func killNine(t *testing.T, p *process) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill())
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the killed process did not go away within 10s")
	}
}

// addCrashAccounts creates k1 and c1 (of a higher priority) through the
// API; it returns the relay account id of each sim account.
func addCrashAccounts(t *testing.T, base string, upstream *sim.Server) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for sid, body := range map[string]map[string]any{
		"k1": {"label": "k1", "kind": "openai", "base_url": upstream.OpenAIBaseURL(), "organization": "org-k", "api_key": "sk-sim-k1"},
		"c1": {"label": "c1", "kind": "chatgpt", "base_url": upstream.CodexBaseURL(), "access_token": "at-c1", "refresh_token": "rt-c1", "account_id": "c1",
			"priority": 10}, // the relay's first choice: a thread elsewhere stays there only by its binding
	} {
		code, acc, raw := request(t, http.MethodPost, base+"/api/v1/accounts", crashAdminToken, body)
		require.Equal(t, http.StatusCreated, code, raw)
		ids[sid] = acc["id"].(string)
	}
	return ids
}

// setPaused pauses or resumes account id through the relay at bases[0],
// and waits until every relay in bases shows it so (another replica hears
// of it by an announcement).
func setPaused(t *testing.T, bases []string, id string, paused bool) {
	t.Helper()
	action, want := "resume", "active"
	if paused {
		action, want = "pause", "paused"
	}
	code, _, raw := request(t, http.MethodPost, bases[0]+"/api/v1/accounts/"+id+"/"+action, crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	require.Eventually(t, func() bool {
		for _, base := range bases {
			if accountStatus(base, id) != want {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "every relay sees account %s %s", id, want)
}

// accountStatus is the status of account id in the listing of the relay at
// base (the one selection reads); "" when it does not answer. It fails no
// test: it runs inside require.Eventually.
func accountStatus(base, id string) string {
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/accounts", nil)
	if err != nil {
		return ""
	}
	req.Header.Set("Authorization", "Bearer "+crashAdminToken)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var list struct {
		Accounts []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"accounts"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil {
		return ""
	}
	for _, a := range list.Accounts {
		if a.ID == id {
			return a.Status
		}
	}
	return ""
}

// sseEvent is one server-sent event of a streamed response.
type sseEvent struct {
	Type string
	Data []byte
}

// sseStream reads a streamed response event by event.
type sseStream struct {
	resp *http.Response
	rd   *bufio.Reader
}

// next returns the next event, or an error when the stream ends (io.EOF
// for a clean end of the body).
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if ev.Type != "" || ev.Data != nil {
				return ev, nil
			}
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = append(ev.Data, strings.TrimPrefix(line, "data: ")...)
		}
	}
}

// conversation is an HTTP client of one thread that resends the whole
// history every turn, as Codex does over HTTP.
type conversation struct {
	t       *testing.T
	base    func() string // the relay (or balancer) to send to
	path    string
	key     string
	session string
	thread  string
	history []any
}

func textMessage(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

// open sends the history plus text as one streamed request, bounded by
// ctx, and returns the stream once the answer's headers came.
func (c *conversation) open(ctx context.Context, text string) *sseStream {
	c.t.Helper()
	c.history = append(c.history, textMessage(text))
	body, err := json.Marshal(map[string]any{"model": "gpt-5.4", "stream": true, "store": false, "input": c.history})
	require.NoError(c.t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base()+c.path, bytes.NewReader(body))
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("session-id", c.session)
	req.Header.Set("thread-id", c.thread)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		require.Equal(c.t, http.StatusOK, resp.StatusCode, "%s", raw)
	}
	return &sseStream{resp: resp, rd: bufio.NewReader(resp.Body)}
}

// turn runs one whole turn (30s at most) and adds its output to the
// history; it returns the completed response's id.
func (c *conversation) turn(text string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := c.open(ctx, text)
	defer s.resp.Body.Close()
	var types []string
	for {
		ev, err := s.next()
		require.NoError(c.t, err, "the turn %q ends with response.completed; events so far: %v", text, types)
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.completed":
			var done struct {
				Response struct {
					ID     string `json:"id"`
					Output []any  `json:"output"`
				} `json:"response"`
			}
			require.NoError(c.t, json.Unmarshal(ev.Data, &done))
			c.history = append(c.history, done.Response.Output...)
			return done.Response.ID
		case "response.failed", "response.incomplete", "error":
			require.Failf(c.t, "turn failed", "%q: %s", text, ev.Data)
		}
	}
}

// wsTurn sends one response.create on conn (input given whole) and reads
// until response.completed; it returns the output items.
func wsTurn(t *testing.T, conn *websocket.Conn, input []any) []any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.4", "store": false, "input": input})
	require.NoError(t, err)
	require.NoError(t, conn.Write(ctx, websocket.MessageText, msg))
	for {
		_, data, err := conn.Read(ctx)
		require.NoError(t, err)
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				Output []any `json:"output"`
			} `json:"response"`
		}
		require.NoError(t, json.Unmarshal(data, &ev))
		switch ev.Type {
		case "response.completed":
			return ev.Response.Output
		case "response.failed", "response.incomplete", "error":
			require.Failf(t, "WebSocket turn failed", "%s", data)
		}
	}
}

func dialRelayWS(t *testing.T, base, key, session, thread string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := http.Header{"Authorization": {"Bearer " + key}, "Session-Id": {session}, "Thread-Id": {thread},
		"Openai-Beta": {"responses_websockets=2026-02-06"}}
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/backend-api/codex/responses", &websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(t, err)
	conn.SetReadLimit(64 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

// lastResponse is the sim's newest record of a response request of thread.
func lastResponse(t *testing.T, upstream *sim.Server, thread string) sim.Record {
	t.Helper()
	var last *sim.Record
	for _, r := range upstream.Requests(sim.RecordFilter{ThreadID: thread}) {
		if r.Route == sim.RouteResponses {
			last = &r
		}
	}
	require.NotNil(t, last, "the sim saw thread %s", thread)
	return *last
}

// seqMark is the sequence number of the sim's newest record: a filter
// with Since set to it selects what comes after.
func seqMark(upstream *sim.Server) int64 {
	recs := upstream.Records(sim.RecordFilter{})
	if len(recs) == 0 {
		return 0
	}
	return recs[len(recs)-1].Seq
}

// bindingsOf lists the bindings GET /api/v1/bindings?query= answers.
func bindingsOf(t *testing.T, base, query string) []map[string]any {
	t.Helper()
	code, body, raw := request(t, http.MethodGet, base+"/api/v1/bindings?"+query, crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	var out []map[string]any
	for _, b := range body["bindings"].([]any) {
		out = append(out, b.(map[string]any))
	}
	return out
}

// A relay killed with SIGKILL in the middle of a streamed turn: the client's
// stream ends (no hang), and the same binary restarted on the same
// database, with the same environment, has lost nothing durable. The
// accounts, the client key, the pin and the thread's binding are there; the
// ChatGPT account's refresh token is the one rotated just before the kill
// (the next refresh succeeds, where the spent one would be refused); and
// the client's next turn, its full history resent, is served on the same
// account and completes.
func TestKillNineMidStreamAndRestart(t *testing.T) {
	bin := buildBinary(t)
	t.Run("sqlite", func(t *testing.T) {
		killNineMidStreamAndRestart(t, bin, filepath.Join(t.TempDir(), "relay.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		killNineMidStreamAndRestart(t, bin, storetest.PostgresURL(t))
	})
}

func killNineMidStreamAndRestart(t *testing.T, bin, dbURL string) {
	upstream := crashUpstream(t)
	env := crashEnv(dbURL, upstream)
	p := startProcess(t, bin, env)
	ids := addCrashAccounts(t, p.url, upstream)
	code, key, raw := request(t, http.MethodPost, p.url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	clientKey := key["key"].(string)

	// Session S is pinned to the ChatGPT account; its thread T goes over
	// HTTP and its thread W over a WebSocket. Thread U, of a session of its
	// own, is placed by the relay on k1 (c1 is paused for its first turn),
	// where only its binding keeps it once c1 is back.
	const (
		sessionS = "019a3333-0000-7000-8000-000000000001"
		threadT  = "019a3333-0000-7000-8000-0000000000a1"
		threadW  = "019a3333-0000-7000-8000-0000000000b1"
		sessionU = "019a3333-0000-7000-8000-000000000002"
		threadU  = "019a3333-0000-7000-8000-0000000000c1"
	)
	code, pin, raw := request(t, http.MethodPost, p.url+"/api/v1/bindings", crashAdminToken, map[string]any{"session_id": sessionS, "account_id": ids["c1"]})
	require.Equal(t, http.StatusCreated, code, raw)

	base := p.url
	at := func() string { return base }
	conv := &conversation{t: t, base: at, path: "/backend-api/codex/responses", key: clientKey, session: sessionS, thread: threadT}
	conv.turn("hello")
	conv.turn("and again")
	require.Equal(t, "c1", lastResponse(t, upstream, threadT).Account, "the pinned session's thread is on c1")
	setPaused(t, []string{p.url}, ids["c1"], true)
	other := &conversation{t: t, base: at, path: "/v1/responses", key: clientKey, session: sessionU, thread: threadU}
	other.turn("a thread placed by the relay")
	require.Equal(t, "k1", lastResponse(t, upstream, threadU).Account)
	setPaused(t, []string{p.url}, ids["c1"], false)

	ws := dialRelayWS(t, p.url, clientKey, sessionS, threadW)
	wsHistory := []any{textMessage("over a WebSocket")}
	wsHistory = append(wsHistory, wsTurn(t, ws, wsHistory)...)
	require.Equal(t, "c1", lastResponse(t, upstream, threadW).Account)

	// The long turn first meets a 401: the relay redeems rt-c1, stores the
	// rotated refresh token, then streams slowly until it is killed.
	_, err := upstream.AddFault(sim.Fault{Kind: sim.FaultUnauthorized, Account: "c1", Times: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := conv.open(ctx, "a long answer [[sim:events 400]] [[sim:gap 25ms]]")
	deltas := 0
	for deltas < 3 {
		ev, err := stream.next()
		require.NoError(t, err, "the long turn streams")
		if ev.Type == "response.output_text.delta" {
			deltas++
		}
	}
	c1, _ := upstream.Account("c1")
	require.Equal(t, 1, c1.Refreshes, "the relay refreshed c1's token before the long turn")
	require.NotEqual(t, "rt-c1", c1.RefreshToken, "the sim rotated the refresh token")
	long := lastResponse(t, upstream, threadT)

	killNine(t, p)
	var end error
	var seen []string
	for end == nil {
		var ev sseEvent
		ev, end = stream.next()
		seen = append(seen, ev.Type)
	}
	require.NoError(t, ctx.Err(), "the client's stream ended when the process died, without waiting for its deadline")
	assert.NotContains(t, seen, "response.completed", "the cut turn did not pretend to complete")
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, _, werr := ws.Read(wctx)
	require.Error(t, werr, "the WebSocket client sees its connection end")
	require.NoError(t, wctx.Err(), "at once, not at its deadline")
	wcancel()
	t.Logf("after SIGKILL: the HTTP stream ended with %v, the WebSocket with %v", end, werr)
	require.Eventually(t, func() bool {
		for _, r := range upstream.Requests(sim.RecordFilter{ThreadID: threadT}) {
			if r.Seq == long.Seq {
				return r.Done && r.Outcome == sim.OutcomeGone
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "upstream, the long turn was cut off by the relay's death")

	// The same binary, the same environment, the same database.
	p = startProcess(t, bin, env)
	base = p.url
	code, accounts, raw := request(t, http.MethodGet, p.url+"/api/v1/accounts", crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	require.Len(t, accounts["accounts"], 2, "both accounts survived")
	for _, a := range accounts["accounts"].([]any) {
		a := a.(map[string]any)
		assert.Contains(t, []string{ids["k1"], ids["c1"]}, a["id"])
		assert.Equal(t, "active", a["status"], "account %s", a["label"])
	}
	code, keys, raw := request(t, http.MethodGet, p.url+"/api/v1/keys", crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	require.Len(t, keys["keys"], 1, "the client key survived")
	assert.Equal(t, key["id"], keys["keys"].([]any)[0].(map[string]any)["id"])
	code, _, raw = request(t, http.MethodPost, p.url+"/backend-api/codex/responses", "crk_not-a-key-of-this-relay", map[string]any{"model": "gpt-5.4", "input": "hi"})
	assert.Equal(t, http.StatusUnauthorized, code, "keys are still enforced (no keyless mode after the restart): %s", raw)
	pins := bindingsOf(t, p.url, "session="+sessionS)
	var pinned bool
	for _, b := range pins {
		if b["pin"] == true {
			pinned = true
			assert.Equal(t, pin["id"], b["id"], "the pin survived")
			assert.Equal(t, ids["c1"], b["account_id"])
		}
	}
	assert.True(t, pinned, "the session's pin survived: %v", pins)
	threadBinding := func(thread string) string {
		for _, b := range bindingsOf(t, p.url, "thread="+thread) {
			if b["kind"] == "thread" {
				return b["account_id"].(string)
			}
		}
		return ""
	}
	assert.Equal(t, ids["c1"], threadBinding(threadT), "thread T's binding survived")
	assert.Equal(t, ids["k1"], threadBinding(threadU), "thread U's binding survived")

	// The next turn of T meets a 401 again: it is served only if the relay
	// redeems the rotated refresh token (rt-c1 is spent: the sim refuses it
	// with refresh_token_reused, and c1 would need a new login).
	_, err = upstream.AddFault(sim.Fault{Kind: sim.FaultUnauthorized, Account: "c1", Times: 1})
	require.NoError(t, err)
	since := seqMark(upstream)
	sent := len(conv.history) + 1
	conv.turn("after the crash") // the same client key still authenticates
	after := upstream.Requests(sim.RecordFilter{ThreadID: threadT, Since: since})
	require.Len(t, after, 2, "the 401, then the retry with the refreshed token")
	for _, r := range after {
		assert.Equal(t, "c1", r.Account, "the thread's next turn is served by its account")
		assert.Empty(t, r.PreviousResponseID, "a full request: the old process's lane died with it")
		assert.Equal(t, sent, r.InputCount, "the whole history went upstream")
	}
	assert.Equal(t, sim.OutcomeCompleted, after[1].Outcome)
	c1, _ = upstream.Account("c1")
	assert.Equal(t, 2, c1.Refreshes, "the refresh after the restart redeemed the rotated token")
	assert.Zero(t, c1.RefreshesRejected, "no spent refresh token was presented")
	code, acc, raw := request(t, http.MethodGet, p.url+"/api/v1/accounts/"+ids["c1"], crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	assert.Equal(t, "active", acc["status"], "c1 needs no new login")

	other.turn("and the other thread")
	assert.Equal(t, "k1", lastResponse(t, upstream, threadU).Account, "thread U stayed on its account")

	ws = dialRelayWS(t, p.url, clientKey, sessionS, threadW)
	wsHistory = append(wsHistory, textMessage("over a new WebSocket"))
	wsTurn(t, ws, wsHistory)
	w := lastResponse(t, upstream, threadW)
	assert.Equal(t, "c1", w.Account)
	assert.Empty(t, w.PreviousResponseID)
}

// replicaLanes maps each thread with a bridge lane on the replica at base
// (its own lanes, not the ones it lists for the others) to the replica's
// name.
func replicaLanes(t *testing.T, base string) (string, map[string]bool) {
	t.Helper()
	code, reps, raw := request(t, http.MethodGet, base+"/api/v1/replicas", crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	var self string
	for _, r := range reps["replicas"].([]any) {
		if r := r.(map[string]any); r["self"] == true {
			self = r["name"].(string)
		}
	}
	require.NotEmpty(t, self, "the replica lists itself: %s", raw)
	code, lanes, raw := request(t, http.MethodGet, base+"/api/v1/lanes", crashAdminToken, nil)
	require.Equal(t, http.StatusOK, code, raw)
	threads := map[string]bool{}
	for _, l := range lanes["lanes"].([]any) {
		if l := l.(map[string]any); l["replica"] == self && l["kind"] == "bridge" {
			threads[l["thread_id"].(string)] = true
		}
	}
	return self, threads
}

// adminCount is the length of the list field of the admin API's answer
// to GET path on the relay at base; -1 when it does not answer. It fails no
// test: it runs inside require.Eventually.
func adminCount(base, path, field string) int {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return -1
	}
	req.Header.Set("Authorization", "Bearer "+crashAdminToken)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var body map[string]json.RawMessage
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return -1
	}
	var list []json.RawMessage
	if json.Unmarshal(body[field], &list) != nil {
		return -1
	}
	return len(list)
}

// liveReplicas counts the replicas the one at base sees alive.
func liveReplicas(base string) int { return adminCount(base, "/api/v1/replicas", "replicas") }

// Two replica processes on one PostgreSQL behind a round-robin balancer,
// four threads each holding a lane (and its lease) on one of them. One
// replica is killed with SIGKILL: every thread's next request through the
// balancer is served by the survivor, on the thread's account, promptly
// (the survivor cannot reach the dead holder and serves the request
// itself, rebuilt whole: no previous_response_id of the dead lane goes
// upstream). Once the dead replica's heartbeat lapses the survivor takes
// its leases, and the threads go on as deltas on the survivor's lanes.
func TestReplicaKilledLeasesMoveToSurvivor(t *testing.T) {
	upstream := crashUpstream(t)
	env := crashEnv(storetest.PostgresURL(t), upstream)
	bin := buildBinary(t)
	procs := []*process{startProcess(t, bin, env), startProcess(t, bin, env)}
	require.Eventually(t, func() bool { return liveReplicas(procs[0].url) == 2 && liveReplicas(procs[1].url) == 2 },
		time.Minute, 50*time.Millisecond, "both replicas registered")
	ids := addCrashAccounts(t, procs[0].url, upstream)
	code, key, raw := request(t, http.MethodPost, procs[1].url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	_, lb := newBalancer(t, procs[0].url, procs[1].url)

	const n = 4
	convs := make([]*conversation, n)
	for i := range convs {
		convs[i] = &conversation{t: t, base: func() string { return lb.URL }, path: "/backend-api/codex/responses", key: key["key"].(string),
			session: fmt.Sprintf("019a4444-0000-7000-8000-%012d", i), thread: fmt.Sprintf("019a4444-0000-7000-9000-%012d", i)}
	}
	// First turns alternate between the replicas, each taking its thread's
	// lease: threads 0 and 1 on c1 (k1 paused meanwhile), 2 and 3 on k1, so
	// each replica holds a thread of each account, and only the bindings
	// keep them there once both accounts serve. The second turns are
	// shifted by one, so each reaches the other replica and is forwarded to
	// the holder, as a delta on its lane.
	bases := []string{procs[0].url, procs[1].url}
	for i, c := range convs {
		switch i {
		case 0:
			setPaused(t, bases, ids["k1"], true)
		case n / 2:
			setPaused(t, bases, ids["k1"], false)
			setPaused(t, bases, ids["c1"], true)
		}
		c.turn("first turn")
	}
	setPaused(t, bases, ids["c1"], false)
	for i := range convs {
		convs[(i+1)%n].turn("second turn")
	}
	before := make([]sim.Record, n)
	for i, c := range convs {
		recs := upstream.Requests(sim.RecordFilter{ThreadID: c.thread})
		require.Len(t, recs, 2)
		require.Equal(t, recs[0].ResponseID, recs[1].PreviousResponseID, "thread %d: its second turn went as a delta on the holder's lane", i)
		require.Equal(t, map[bool]string{true: "c1", false: "k1"}[i < n/2], recs[1].Account, "thread %d", i)
		before[i] = recs[1]
	}
	holder := map[string]int{} // thread -> index of the replica holding its lane
	for r, p := range procs {
		_, threads := replicaLanes(t, p.url)
		for th := range threads {
			holder[th] = r
		}
	}
	require.Len(t, holder, n, "every thread has its lane on one replica")
	victim, survivor := procs[holder[convs[0].thread]], procs[1-holder[convs[0].thread]]
	var victimThreads int
	for _, c := range convs {
		if procs[holder[c.thread]] == victim {
			victimThreads++
		}
	}
	require.Positive(t, victimThreads)
	require.Less(t, victimThreads, n, "the survivor holds threads of its own too")

	killNine(t, victim)
	killed := time.Now()
	for i, c := range convs {
		wasVictims := procs[holder[c.thread]] == victim
		sent := len(c.history) + 1
		since := seqMark(upstream)
		start := time.Now()
		c.turn("after the kill") // 30s at most: a hang guard, not a timing goal
		took := time.Since(start)
		recs := upstream.Requests(sim.RecordFilter{ThreadID: c.thread, Since: since})
		require.Len(t, recs, 1, "thread %d: one request upstream, no retry", i)
		last := recs[0]
		assert.Equal(t, before[i].Account, last.Account, "thread %d stays on its account", i)
		assert.Equal(t, sim.OutcomeCompleted, last.Outcome, "thread %d", i)
		if wasVictims {
			assert.Empty(t, last.PreviousResponseID, "thread %d: rebuilt whole, nothing of the dead lane", i)
			assert.Equal(t, sent, last.InputCount, "thread %d: the whole history went upstream", i)
			assert.NotEqual(t, before[i].ConnID, last.ConnID, "thread %d: on a new lane", i)
		} else if last.PreviousResponseID != "" {
			assert.Equal(t, before[i].ResponseID, last.PreviousResponseID, "thread %d: a delta only on its live lane", i)
			assert.Equal(t, before[i].ConnID, last.ConnID, "thread %d", i)
		}
		t.Logf("thread %d (account %s, lane on the %s replica): next turn completed in %v, %v after the kill", i, last.Account,
			map[bool]string{true: "killed", false: "surviving"}[wasVictims], took.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	}
	t.Logf("hand-over: all %d threads served by the survivor within %v of the SIGKILL", n, time.Since(killed).Round(time.Millisecond))
	_, threads := replicaLanes(t, survivor.url)
	assert.Len(t, threads, n, "the survivor holds every thread's lane now")

	// Once the dead replica's heartbeat lapses, the survivor takes its
	// leases over; the threads go on as deltas on the survivor's lanes.
	require.Eventually(t, func() bool { return liveReplicas(survivor.url) == 1 }, time.Minute, 100*time.Millisecond,
		"the killed replica's heartbeat lapses")
	t.Logf("the killed replica left the live list %v after the SIGKILL", time.Since(killed).Round(time.Millisecond))
	for i, c := range convs {
		prev := lastResponse(t, upstream, c.thread)
		c.turn("once the leases moved")
		last := lastResponse(t, upstream, c.thread)
		assert.Equal(t, before[i].Account, last.Account, "thread %d", i)
		assert.Equal(t, prev.ResponseID, last.PreviousResponseID, "thread %d: a delta on the survivor's lane", i)
		assert.Equal(t, prev.ConnID, last.ConnID, "thread %d", i)
	}
}

// A replica frozen (SIGSTOP: its sockets stay open, nothing answers) while
// it holds a thread's lane. Another replica forwards the thread's requests
// to it while its heartbeat is still fresh: a request it never answers is
// served by the forwarding replica once the holder has been silent past
// its own stream idle deadline, and a stream it stops in the middle ends
// with a terminal event, not a client left waiting.
func TestFrozenHolderDoesNotHoldForwardedRequests(t *testing.T) {
	upstream := crashUpstream(t)
	env := append(crashEnv(storetest.PostgresURL(t), upstream), "CODEX_RELAY_STREAM_IDLE_TIMEOUT=2s")
	bin := buildBinary(t)
	holder, other := startProcess(t, bin, env), startProcess(t, bin, env)
	require.Eventually(t, func() bool { return liveReplicas(holder.url) == 2 && liveReplicas(other.url) == 2 },
		time.Minute, 50*time.Millisecond, "both replicas registered")
	addCrashAccounts(t, other.url, upstream)
	code, key, raw := request(t, http.MethodPost, other.url+"/api/v1/keys", crashAdminToken, map[string]any{"name": "codex"})
	require.Equal(t, http.StatusCreated, code, raw)
	newConv := func(i int) *conversation {
		return &conversation{t: t, base: func() string { return holder.url }, path: "/backend-api/codex/responses", key: key["key"].(string),
			session: fmt.Sprintf("019a6666-0000-7000-8000-%012d", i), thread: fmt.Sprintf("019a6666-0000-7000-9000-%012d", i)}
	}
	idle, streaming := newConv(1), newConv(2)
	idle.turn("first turn, on the holder")
	streaming.turn("first turn, on the holder")
	first := lastResponse(t, upstream, idle.thread)
	thaw := func() { _ = holder.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(thaw)

	// A stream under way through the other replica, then the holder freezes.
	streaming.base = func() string { return other.url }
	end := dbLongStream(t, streaming)
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGSTOP))
	select {
	case seen := <-end:
		require.NotEmpty(t, seen)
		assert.Equal(t, "response.failed", seen[len(seen)-1], "the stream the frozen holder stopped ends with a terminal event")
	case <-time.After(30 * time.Second):
		t.Fatal("the stream through the frozen holder never ended")
	}

	// A new request for the other thread, forwarded to the frozen holder.
	since := seqMark(upstream)
	idle.base = func() string { return other.url }
	sent := len(idle.history) + 1
	idle.turn("second turn, while the holder is frozen") // 30 s at most: a hang guard
	recs := upstream.Requests(sim.RecordFilter{ThreadID: idle.thread, Since: since})
	require.Len(t, recs, 1, "served once, by the replica it was sent to")
	assert.Equal(t, first.Account, recs[0].Account, "on the thread's account")
	assert.Equal(t, sent, recs[0].InputCount, "the whole history, rebuilt")
	assert.NotEqual(t, first.ConnID, recs[0].ConnID, "not on the frozen holder's lane")
}
