package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// testAccounts: a1 and a2 share organisation org-x, b1 is in org-y, k1 is an
// API key in org-x.
func testAccounts() []Account {
	return []Account{
		{ID: "a1", Kind: KindChatGPT, Organization: "org-x", AccessToken: "at-a1", RefreshToken: "rt-a1", ChatGPTAccountID: "cg-a1"},
		{ID: "a2", Kind: KindChatGPT, Organization: "org-x", AccessToken: "at-a2", RefreshToken: "rt-a2", ChatGPTAccountID: "cg-a2"},
		{ID: "b1", Kind: KindChatGPT, Organization: "org-y", AccessToken: "at-b1", RefreshToken: "rt-b1", ChatGPTAccountID: "cg-b1"},
		{ID: "k1", Kind: KindOpenAI, Organization: "org-x", AccessToken: "sk-k1"},
	}
}

// newSim starts a sim with testAccounts (or cfg's own accounts) and closes
// it when the test ends.
func newSim(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Accounts == nil {
		cfg.Accounts = testAccounts()
	}
	s := NewServer(cfg)
	t.Cleanup(s.Close)
	return s
}

// client is a test client of one account.
type client struct {
	t       testing.TB
	sim     *Server
	base    string // base URL of the flavour
	token   string
	headers http.Header
	hc      *http.Client
}

// clientFor returns a client for account id of the test accounts.
func clientFor(t testing.TB, upstream *Server, id string) *client {
	t.Helper()
	st, ok := upstream.Account(id)
	require.True(t, ok, "no account %s", id)
	c := &client{t: t, sim: upstream, token: st.AccessToken, headers: http.Header{}, hc: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(c.hc.CloseIdleConnections)
	if st.Kind == KindChatGPT {
		c.base = upstream.CodexBaseURL()
		c.headers.Set(wire.HeaderChatGPTAccountID, st.ChatGPTAccountID)
	} else {
		c.base = upstream.OpenAIBaseURL()
	}
	return c
}

func (c *client) do(ctx context.Context, method, url string, body []byte, h http.Header) *http.Response {
	c.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	require.NoError(c.t, err)
	for k, v := range c.headers {
		req.Header[k] = v
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	return resp
}

// postResponses posts a response request and returns the answer; the
// caller reads (and closes) the body.
func (c *client) postResponses(ctx context.Context, body []byte, h http.Header) *http.Response {
	return c.do(ctx, http.MethodPost, c.base+"/responses", body, h)
}

// turn posts body and reads the whole SSE answer.
func (c *client) turn(body []byte) (*http.Response, []event, error) {
	c.t.Helper()
	resp := c.postResponses(context.Background(), body, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp, nil, &statusError{resp.StatusCode, b}
	}
	evs, err := readSSE(resp.Body)
	return resp, evs, err
}

type statusError struct {
	status int
	body   []byte
}

func (e *statusError) Error() string { return http.StatusText(e.status) + ": " + string(e.body) }

// errorOf returns the status and decoded error body of an error answer.
func errorOf(t testing.TB, err error) (int, wire.Error) {
	t.Helper()
	var se *statusError
	require.ErrorAs(t, err, &se)
	e, ok := wire.ParseErrorBody(se.body)
	require.True(t, ok, "not an error body: %s", se.body)
	return se.status, e
}

// event is one decoded server event.
type event struct {
	Type string
	Data []byte
	M    map[string]any
}

func decodeEvent(data []byte) event {
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	typ, _ := wire.EventType(data)
	return event{Type: typ, Data: bytes.Clone(data), M: m}
}

func readSSE(r io.Reader) ([]event, error) {
	sr := wire.NewSSEReader(r, 0, 0)
	var out []event
	for {
		ev, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, decodeEvent(ev.Data))
	}
}

func types(evs []event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// find returns the events of type typ.
func find(evs []event, typ string) []event {
	var out []event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// completedResponse returns the response object of the response.completed
// event.
func completedResponse(t testing.TB, evs []event) map[string]any {
	t.Helper()
	done := find(evs, wire.EventResponseCompleted)
	require.Len(t, done, 1, "events: %v", types(evs))
	return done[0].M["response"].(map[string]any)
}

// outputItems returns the items of output_item.done events.
func outputItems(evs []event) []map[string]any {
	var out []map[string]any
	for _, e := range find(evs, wire.EventOutputItemDone) {
		out = append(out, e.M["item"].(map[string]any))
	}
	return out
}

// answerText returns the text of the message items of the events.
func answerText(evs []event) string {
	var b strings.Builder
	for _, it := range outputItems(evs) {
		if it["type"] != "message" {
			continue
		}
		for _, p := range it["content"].([]any) {
			b.WriteString(p.(map[string]any)["text"].(string))
		}
	}
	return b.String()
}

// item helpers for request bodies.
func userMsg(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

func devMsg(text string) map[string]any {
	return map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

// body renders a response request with the given input items and extra
// fields, as Codex would send it.
func body(t testing.TB, input []any, extra map[string]any) []byte {
	t.Helper()
	m := map[string]any{
		"model": "gpt-5.5-codex", "input": input, "stream": true, "store": false,
		"tools": []any{
			map[string]any{"type": "function", "name": "exec_command", "parameters": map[string]any{}},
			map[string]any{"type": "custom", "name": "apply_patch"},
		},
		"include": []any{"reasoning.encrypted_content"}, "prompt_cache_key": "pck-1",
		"future_field": map[string]any{"unknown": true},
	}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// prompt is a request body with one user message.
func prompt(t testing.TB, text string) []byte {
	return body(t, []any{devMsg("be brief"), userMsg(text)}, nil)
}

// wsConnFor dials the sim's WebSocket for account id.
func (c *client) dial(ctx context.Context) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	for k, v := range c.headers {
		h[k] = v
	}
	h.Set("Authorization", "Bearer "+c.token)
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	url := "ws" + strings.TrimPrefix(c.base, "http") + "/responses"
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h, HTTPClient: c.hc,
		CompressionMode: websocket.CompressionContextTakeover})
	if conn != nil {
		conn.SetReadLimit(16 << 20)
	}
	return conn, resp, err
}

func (c *client) mustDial(ctx context.Context) *websocket.Conn {
	c.t.Helper()
	conn, _, err := c.dial(ctx)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = conn.CloseNow() })
	return conn
}

// wsTurn sends one response.create built from body and reads events up to
// and including the terminal one.
func wsTurn(ctx context.Context, t testing.TB, conn *websocket.Conn, b []byte) ([]event, error) {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	m["type"] = wire.MessageResponseCreate
	msg, err := json.Marshal(m)
	require.NoError(t, err)
	if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, err
	}
	return wsRead(ctx, conn)
}

// wsRead reads events up to and including a terminal one.
func wsRead(ctx context.Context, conn *websocket.Conn) ([]event, error) {
	var out []event
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return out, err
		}
		ev := decodeEvent(data)
		out = append(out, ev)
		if wire.IsTerminal(ev.Type) {
			return out, nil
		}
	}
}

// testCtx is a context that ends with the test or after d.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or a second passes.
func waitFor(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
