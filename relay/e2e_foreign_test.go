package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// foreignUpstream is a Responses provider written apart from the sim, the
// way a third party might: HTTP only (no WebSocket, no /models), no chains,
// no rate-limit headers or turn state, and SSE with CRLF line ends, comment
// lines and no "event:" lines (the type only inside the data). The relay
// must serve Codex through it with nothing of the sim to lean on.
type foreignUpstream struct {
	key string

	mu       sync.Mutex
	requests []foreignRequest
}

type foreignRequest struct {
	auth     string
	previous string
	items    int
	answered int
}

func (f *foreignUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/responses" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var body struct {
		Model              string            `json:"model"`
		PreviousResponseID string            `json:"previous_response_id"`
		Input              []json.RawMessage `json:"input"`
	}
	raw, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	rec := foreignRequest{auth: r.Header.Get("Authorization"), previous: body.PreviousResponseID, items: len(body.Input)}
	status := http.StatusOK
	defer func() {
		rec.answered = status
		f.mu.Lock()
		f.requests = append(f.requests, rec)
		f.mu.Unlock()
	}()
	fail := func(code int, typ, errCode, msg string) {
		status = code
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, msg, typ, errCode)
	}
	switch {
	case rec.auth != "Bearer "+f.key:
		fail(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.")
		return
	case err != nil:
		fail(http.StatusBadRequest, "invalid_request_error", "invalid_json", "We could not parse the JSON body of your request.")
		return
	case body.PreviousResponseID != "":
		fail(http.StatusBadRequest, "invalid_request_error", "previous_response_not_found",
			fmt.Sprintf("Previous response with id '%s' not found.", body.PreviousResponseID))
		return
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	id := fmt.Sprintf("resp_foreign_%d", len(f.snapshot()))
	text := fmt.Sprintf("foreign says: %d items seen", len(body.Input))
	item := map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	response := func(status string, output []any) map[string]any {
		return map[string]any{"id": id, "object": "response", "status": status, "model": body.Model, "output": output}
	}
	events := []map[string]any{
		{"type": "response.created", "response": response("in_progress", []any{})},
		{"type": "response.output_item.added", "output_index": 0, "item": map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "status": "in_progress", "content": []any{}}},
	}
	for _, word := range strings.SplitAfter(text, " ") {
		events = append(events, map[string]any{"type": "response.output_text.delta", "item_id": "msg_" + id, "output_index": 0, "content_index": 0, "delta": word})
	}
	done := response("completed", []any{item})
	done["usage"] = map[string]any{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
	events = append(events,
		map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item},
		map[string]any{"type": "response.completed", "response": done})
	fmt.Fprint(w, ": a comment the client must skip\r\n\r\n")
	for _, e := range events {
		data, _ := json.Marshal(e)
		fmt.Fprintf(w, "data: %s\r\n\r\n", data)
		flusher.Flush()
	}
}

func (f *foreignUpstream) snapshot() []foreignRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]foreignRequest(nil), f.requests...)
}

// The real Codex CLI, over both transports, through the relay to an
// upstream the sim did not shape: two turns of one thread complete, the
// client's key never goes upstream, and every request goes in full.
func TestCodexThroughAForeignUpstream(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "websocket"}[ws], func(t *testing.T) {
			t.Parallel()
			up := &foreignUpstream{key: "sk-foreign-upstream"}
			upSrv := httptest.NewServer(up)
			t.Cleanup(upSrv.Close)
			st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
			ctx := context.Background()
			_, err := st.CreateAccount(ctx, store.Account{Kind: store.KindCompatible, Label: "foreign", BaseURL: upSrv.URL + "/v1"},
				store.Credentials{APIKey: up.key})
			require.NoError(t, err)
			_, clientKey, err := st.CreateClientKey(ctx, store.ClientKey{Name: "codex"})
			require.NoError(t, err)
			rl := relay.New(relay.Config{Store: st, Logger: testLogger(t)})
			srv := httptest.NewServer(rl)
			t.Cleanup(func() { rl.Close(); srv.Close() })

			codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/v1", WebSockets: ws, Key: clientKey})
			res, err := codex.Exec(ctx, "hello there", codexcli.RunOptions{})
			require.NoError(t, err)
			require.Equal(t, 0, res.ExitCode, res.Stderr)
			assert.Contains(t, res.FinalMessage, "foreign says")
			assert.Empty(t, res.WebSocketFallback())
			resumed, err := codex.Resume(ctx, res.ThreadID, "and again", codexcli.RunOptions{})
			require.NoError(t, err)
			require.Equal(t, 0, resumed.ExitCode, resumed.Stderr)
			assert.Contains(t, resumed.FinalMessage, "foreign says")

			reqs := up.snapshot()
			require.GreaterOrEqual(t, len(reqs), 2)
			for _, r := range reqs {
				assert.Equal(t, "Bearer "+up.key, r.auth, "the account's key went upstream, never the client's")
				assert.Empty(t, r.previous, "an HTTP-only upstream gets full requests")
				assert.Equal(t, http.StatusOK, r.answered)
			}
			last := reqs[len(reqs)-1]
			assert.Greater(t, last.items, reqs[0].items, "the resumed turn carried the whole history")
			logged, _, err := st.Requests(ctx, store.RequestFilter{ThreadID: res.ThreadID})
			require.NoError(t, err)
			require.NotEmpty(t, logged)
			for _, r := range logged {
				assert.Equal(t, http.StatusOK, r.Status, "no request failed on the way")
			}
		})
	}
}
