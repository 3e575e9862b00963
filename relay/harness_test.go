package relay_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// harness is a relay on a real SQLite store in front of the simulated
// upstream, served on loopback.
type harness struct {
	t     *testing.T
	sim   *sim.Server
	store *store.Store
	relay *relay.Server
	srv   *httptest.Server
	// ids maps sim account ids to relay account ids.
	ids map[string]string
}

// simAccount is a ChatGPT account of the sim in organisation org.
func simAccount(id, org string) sim.Account {
	return sim.Account{ID: id, AccessToken: "at-" + id, RefreshToken: "rt-" + id, Organization: org}
}

func newHarness(t *testing.T, accounts ...sim.Account) *harness {
	t.Helper()
	return newHarnessWith(t, func(*harness, *relay.Config) {}, accounts...)
}

// newHarnessWith is newHarness with the relay's configuration adjusted.
func newHarnessWith(t *testing.T, adjust func(*harness, *relay.Config), accounts ...sim.Account) *harness {
	t.Helper()
	return newHarnessSim(t, sim.Config{Accounts: accounts, Logger: testLogger(t)}, adjust)
}

// newHarnessSim is newHarnessWith with the sim's configuration given whole.
func newHarnessSim(t *testing.T, simCfg sim.Config, adjust func(*harness, *relay.Config)) *harness {
	t.Helper()
	return newHarnessOn(t, storetest.SQLiteURL(t), simCfg, adjust)
}

// newHarnessOn is newHarnessSim on the database at dbURL.
func newHarnessOn(t *testing.T, dbURL string, simCfg sim.Config, adjust func(*harness, *relay.Config)) *harness {
	t.Helper()
	accounts := simCfg.Accounts
	upstream := sim.NewServer(simCfg)
	t.Cleanup(upstream.Close)
	st := storetest.Open(t, dbURL, store.Options{})
	h := &harness{t: t, sim: upstream, store: st, ids: map[string]string{}}
	for _, a := range accounts {
		acc := store.Account{Label: a.ID, Organization: a.Organization}
		cred := store.Credentials{}
		if a.Kind == sim.KindOpenAI {
			acc.Kind, acc.BaseURL, cred.APIKey = store.KindOpenAI, upstream.OpenAIBaseURL(), a.AccessToken
		} else {
			acc.Kind, acc.BaseURL = store.KindChatGPT, upstream.CodexBaseURL()
			acc.ChatGPTAccountID = cmp.Or(a.ChatGPTAccountID, a.ID)
			cred.AccessToken, cred.RefreshToken = a.AccessToken, a.RefreshToken
		}
		created, err := st.CreateAccount(context.Background(), acc, cred)
		require.NoError(t, err)
		h.ids[a.ID] = created.ID
	}
	cfg := relay.Config{Store: st, Logger: testLogger(t), StreamIdleTimeout: 20 * time.Second}
	adjust(h, &cfg)
	h.relay = relay.New(cfg)
	h.srv = httptest.NewServer(h.relay)
	t.Cleanup(func() {
		h.relay.Close() // live WebSocket sessions first: Close below does not wait for them
		h.srv.Close()
	})
	return h
}

// simID maps a relay account id back to the sim's.
func (h *harness) simID(relayID string) string {
	for s, r := range h.ids {
		if r == relayID {
			return s
		}
	}
	return ""
}

func (h *harness) codexBaseURL() string { return h.srv.URL + "/backend-api/codex" }

// responseRequest is a minimal Responses body as a Go client sends it.
func responseRequest(prompt string) map[string]any {
	return map[string]any{
		"model": "gpt-5.5-codex", "stream": true, "store": false, "prompt_cache_key": "pck-shared",
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": prompt}}}},
	}
}

// post sends one Responses request through the relay and reads the whole answer.
func (h *harness) post(session, thread string, body map[string]any, extra http.Header) (*http.Response, string) {
	h.t.Helper()
	b, err := json.Marshal(body)
	require.NoError(h.t, err)
	hdr := http.Header{"Content-Type": {"application/json"}}
	if session != "" {
		hdr.Set("session-id", session)
	}
	if thread != "" {
		hdr.Set("thread-id", thread)
	}
	for k, vs := range extra {
		hdr[k] = vs
	}
	code, rh, raw := h.raw(http.MethodPost, "/backend-api/codex/responses", hdr, b)
	return &http.Response{StatusCode: code, Header: rh}, raw
}

// completedID returns the response id of the response.completed event of an SSE body.
func completedID(t *testing.T, sse string) string {
	t.Helper()
	for _, line := range strings.Split(sse, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(data, `"response.completed"`) {
			continue
		}
		var ev struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &ev))
		return ev.Response.ID
	}
	t.Fatalf("no response.completed in %q", sse)
	return ""
}

// responseRecords are the sim's records of response requests, optionally of one thread.
func (h *harness) responseRecords(thread string) []sim.Record {
	var out []sim.Record
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Kind == sim.RecordHandshake || r.Route != sim.RouteResponses {
			continue
		}
		if thread != "" && r.ThreadID != thread {
			continue
		}
		out = append(out, r)
	}
	return out
}

// testLogger sends logs to t.Logf until the test ends, and drops them after
// (a straggling goroutine must not write to a finished test).
func testLogger(t *testing.T) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool // guarded by mu
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

// wsClient is a Go client of the relay's WebSocket route, as Codex uses it.
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
}

func (h *harness) dialWS(session, thread string) *wsClient {
	h.t.Helper()
	return h.dialWSWith(session, thread, http.Header{})
}

// dialWSWith is dialWS with extra handshake headers (a client key).
func (h *harness) dialWSWith(session, thread string, hdr http.Header) *wsClient {
	h.t.Helper()
	if session != "" {
		hdr.Set("session-id", session)
	}
	if thread != "" {
		hdr.Set("thread-id", thread)
	}
	hdr.Set("OpenAI-Beta", "responses_websockets=2026-02-06")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "ws" + strings.TrimPrefix(h.codexBaseURL(), "http") + "/responses"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(h.t, err)
	conn.SetReadLimit(64 << 20)
	h.t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: h.t, conn: conn}
}

// turn sends one response.create and reads events until a terminal one.
func (c *wsClient) turn(body map[string]any) []map[string]any {
	c.t.Helper()
	msg := map[string]any{"type": "response.create"}
	for k, v := range body {
		msg[k] = v
	}
	b, err := json.Marshal(msg)
	require.NoError(c.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(c.t, c.conn.Write(ctx, websocket.MessageText, b))
	return c.events(ctx)
}

// events reads events until a terminal one.
func (c *wsClient) events(ctx context.Context) []map[string]any {
	c.t.Helper()
	var events []map[string]any
	for {
		_, data, err := c.conn.Read(ctx)
		require.NoError(c.t, err, "events so far: %v", events)
		var ev map[string]any
		require.NoError(c.t, json.Unmarshal(data, &ev))
		events = append(events, ev)
		switch ev["type"] {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return events
		}
	}
}

// lastEvent returns the terminal event and, for response events, the response id.
func lastEvent(events []map[string]any) (typ, responseID string) {
	ev := events[len(events)-1]
	typ, _ = ev["type"].(string)
	if r, ok := ev["response"].(map[string]any); ok {
		responseID, _ = r["id"].(string)
	}
	return typ, responseID
}

func userMessage(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

func storeFilterThread(thread string) store.AttemptFilter {
	return store.AttemptFilter{ThreadID: thread}
}

// testClock is a clock a test moves by hand. Safe for concurrent use.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock(t time.Time) *testClock { return &testClock{t: t} }

func (c *testClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// readAllString reads and closes an answer's body.
func readAllString(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
