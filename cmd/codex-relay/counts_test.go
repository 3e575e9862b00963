package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
)

// A key's requests are counted once, the same way, wherever they are shown:
// the Keys page, `keys list`, the key's request log rows and the usage
// report by key all say the same number. Its requests are the Responses
// and Chat Completions requests it sent (over HTTP, and each WebSocket
// message, a prewarm too); a /models call and a WebSocket's handshake are
// none.
func TestAKeysRequestCountsAgree(t *testing.T) {
	upstream := sim.NewServer(sim.Config{Accounts: []sim.Account{{ID: "c1", AccessToken: "at-c1", RefreshToken: "rt-c1", Organization: "org-a"}}})
	t.Cleanup(upstream.Close)
	const token = "admin-token-of-the-counts-test"
	env := map[string]string{"CODEX_RELAY_DATABASE_URL": filepath.Join(t.TempDir(), "relay.db"), "CODEX_RELAY_ADMIN_TOKEN": token,
		"CODEX_RELAY_LOG_LEVEL": "warn"}
	r := start(t, env)
	code, _, raw := request(t, "POST", r.url+"/api/v1/accounts", token, map[string]any{"label": "c1", "kind": "chatgpt",
		"base_url": upstream.CodexBaseURL(), "access_token": "at-c1", "refresh_token": "rt-c1", "account_id": "c1"})
	require.Equal(t, http.StatusCreated, code, raw)
	code, created, raw := request(t, "POST", r.url+"/api/v1/keys", token, map[string]any{"name": "laptop"})
	require.Equal(t, http.StatusCreated, code, raw)
	keyID, secret := created["id"].(string), created["key"].(string)

	post := func(path string, body map[string]any) {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, r.url+path, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Session-Id", "019a7777-0000-7000-8000-000000000001")
		req.Header.Set("Thread-Id", "019a7777-0000-7000-8000-0000000000a1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	}
	input := func(text string) []any {
		return []any{map[string]any{"type": "message", "role": "user", "content": text}}
	}
	post("/backend-api/codex/responses", map[string]any{"model": "gpt-5.5-codex", "stream": true, "input": input("one")})
	post("/backend-api/codex/responses", map[string]any{"model": "gpt-5.5-codex", "stream": true, "input": input("two")})
	post("/v1/chat/completions", map[string]any{"model": "gpt-5.5-codex", "messages": []any{map[string]any{"role": "user", "content": "three"}}})
	req, err := http.NewRequest(http.MethodGet, r.url+"/backend-api/codex/models?client_version=0.171.0", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()

	// A WebSocket session as Codex holds it: a prewarm, then two turns.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.url, "http")+"/backend-api/codex/responses", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + secret}, "Session-Id": {"019a7777-0000-7000-8000-000000000002"},
			"Thread-Id": {"019a7777-0000-7000-8000-0000000000b1"}}})
	require.NoError(t, err)
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 20)
	for _, msg := range []map[string]any{
		{"type": "response.create", "model": "gpt-5.5-codex", "generate": false, "input": []any{}},
		{"type": "response.create", "model": "gpt-5.5-codex", "input": input("four")},
		{"type": "response.create", "model": "gpt-5.5-codex", "input": input("five")},
	} {
		b, err := json.Marshal(msg)
		require.NoError(t, err)
		require.NoError(t, conn.Write(ctx, websocket.MessageText, b))
		for {
			_, data, err := conn.Read(ctx)
			require.NoError(t, err)
			var ev struct{ Type string }
			require.NoError(t, json.Unmarshal(data, &ev))
			if ev.Type == "response.completed" {
				break
			}
			require.NotEqual(t, "error", ev.Type, "%s", data)
		}
	}
	require.NoError(t, conn.Close(websocket.StatusNormalClosure, ""))
	const want = 6 // two HTTP turns, a chat completion, the prewarm and two WebSocket turns

	keyCount := func() int {
		_, k, _ := request(t, "GET", r.url+"/api/v1/keys/"+keyID, token, nil)
		n, _ := k["request_count"].(float64)
		return int(n)
	}
	// The key's count is written behind the requests.
	require.Eventually(t, func() bool { return keyCount() == want }, time.Minute, 20*time.Millisecond,
		"the key counts its %d requests: %d", want, keyCount())

	// So are the request log's rows, apart from the key's count: the
	// answer's end does not wait for its row.
	logged := func() int {
		code, l, raw := request(t, "GET", r.url+"/api/v1/requests?client_key="+keyID, token, nil)
		require.Equal(t, http.StatusOK, code, raw)
		n, _ := l["total"].(float64)
		return int(n)
	}
	require.Eventually(t, func() bool { return logged() == want }, time.Minute, 20*time.Millisecond,
		"the request log holds the key's %d requests: %d", want, logged())
	require.Never(t, func() bool { return logged() != want }, 200*time.Millisecond, 20*time.Millisecond,
		"and no more come: the log has the same count as the key")

	code, usage, raw := request(t, "GET", r.url+"/api/v1/usage?group_by=key", token, nil)
	require.Equal(t, http.StatusOK, code, raw)
	rows := usage["rows"].([]any)
	require.Len(t, rows, 1, raw)
	assert.EqualValues(t, want, rows[0].(map[string]any)["requests"], "the usage report")

	out, _, err := runCLI(t, cliEnv{"CODEX_RELAY_URL": r.url, "CODEX_RELAY_ADMIN_TOKEN": token}, "keys", "list")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	col := strings.Index(lines[0], "REQUESTS")
	require.GreaterOrEqual(t, col, 0, out)
	n, err := strconv.Atoi(strings.Fields(lines[1][col:])[0])
	require.NoError(t, err, out)
	assert.Equal(t, want, n, "keys list")

	page := consolePage(t, r.url, token, "/admin/keys")
	m := regexp.MustCompile(`data-label="Requests"><a [^>]*>([0-9,]+)</a>`).FindStringSubmatch(page)
	require.NotNil(t, m, "the Keys page shows the key's requests")
	assert.Equal(t, strconv.Itoa(want), strings.ReplaceAll(m[1], ",", ""), "the Keys page")
}

// consolePage signs in to the console at base with the admin token and
// returns the page at path.
func consolePage(t *testing.T, base, token, path string) string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(base + "/admin/login")
	require.NoError(t, err)
	login, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="_csrf" value="([^"]+)"`).FindSubmatch(login)
	require.NotNil(t, m, "%s", login)
	resp, err = client.PostForm(base+"/admin/login", url.Values{"token": {token}, "_csrf": {string(m[1])}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	resp, err = client.Get(base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, fmt.Sprintf("%s: %s", path, body))
	return string(body)
}
