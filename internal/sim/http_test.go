package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestPlainTurnOverHTTP(t *testing.T) {
	t.Parallel()
	for _, account := range []string{"a1", "k1"} {
		t.Run(account, func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{})
			c := clientFor(t, upstream, account)
			resp, evs, err := c.turn(prompt(t, "say hi"))
			require.NoError(t, err)

			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			assert.NotEmpty(t, resp.Header.Get(wire.HeaderTurnState), "a turn's first answer issues a turn state")
			rl := wire.ParseRateLimitHeaders(resp.Header)
			require.NotNil(t, rl.Primary)
			require.NotNil(t, rl.Secondary)
			assert.Equal(t, 300, rl.Primary.WindowMinutes)
			assert.Equal(t, 10080, rl.Secondary.WindowMinutes)
			assert.Positive(t, rl.Primary.ResetAt)
			assert.Equal(t, "codex", resp.Header.Get(wire.HeaderActiveLimit))

			got := types(evs)
			require.GreaterOrEqual(t, len(got), 8)
			assert.Equal(t, []string{wire.EventResponseCreated, wire.EventOutputItemAdded, wire.EventOutputItemDone, wire.EventOutputItemAdded}, got[:4])
			assert.Equal(t, wire.EventResponseCompleted, got[len(got)-1])
			assert.NotEmpty(t, find(evs, wire.EventOutputTextDelta))

			items := outputItems(evs)
			require.Len(t, items, 2)
			assert.Equal(t, "reasoning", items[0]["type"], "a reasoning item comes before the message")
			assert.NotEmpty(t, items[0]["encrypted_content"])
			assert.Equal(t, "message", items[1]["type"])
			assert.Equal(t, "Simulated reply to: say hi", answerText(evs))
			var deltas strings.Builder
			for _, d := range find(evs, wire.EventOutputTextDelta) {
				deltas.WriteString(d.M["delta"].(string))
			}
			assert.Equal(t, "Simulated reply to: say hi", deltas.String())

			r := completedResponse(t, evs)
			id, _ := r["id"].(string)
			assert.True(t, strings.HasPrefix(id, "resp_"))
			assert.Equal(t, id, find(evs, wire.EventResponseCreated)[0].M["response"].(map[string]any)["id"])
			usage := r["usage"].(map[string]any)
			assert.Positive(t, usage["input_tokens"])
			assert.Positive(t, usage["output_tokens"])
			assert.Len(t, r["output"], 2)

			recs := upstream.Requests(RecordFilter{})
			require.Len(t, recs, 1)
			rec := recs[0]
			assert.Equal(t, account, rec.Account)
			assert.Equal(t, TransportHTTP, rec.Transport)
			assert.Equal(t, RecordHTTP, rec.Kind)
			assert.Equal(t, "gpt-5.5-codex", rec.Model)
			assert.Equal(t, "pck-1", rec.PromptCacheKey)
			assert.Equal(t, []string{"message", "message"}, rec.InputTypes)
			assert.Equal(t, 2, rec.InputCount)
			assert.Equal(t, id, rec.ResponseID)
			assert.Equal(t, OutcomeCompleted, rec.Outcome)
			assert.Equal(t, http.StatusOK, rec.Status)
			assert.Equal(t, len(evs), rec.Events)
			assert.Equal(t, got, rec.EventTypes)
			assert.True(t, rec.Done)
			assert.False(t, rec.ClientKey)
			st, _ := upstream.Account(account)
			assert.Equal(t, 1, st.Requests)
		})
	}
}

func TestAnswersAreStable(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	var texts []string
	for _, acct := range []string{"a1", "b1", "k1", "a1"} {
		_, evs, err := clientFor(t, upstream, acct).turn(prompt(t, "same prompt"))
		require.NoError(t, err)
		texts = append(texts, answerText(evs))
	}
	for _, txt := range texts {
		assert.Equal(t, texts[0], txt, "the answer depends on the prompt only, not on the account")
	}
}

func TestTurnStateOverHTTP(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	resp, _, err := c.turn(prompt(t, "first"))
	require.NoError(t, err)
	ts := resp.Header.Get(wire.HeaderTurnState)
	require.NotEmpty(t, ts)

	h := http.Header{}
	h.Set(wire.HeaderTurnState, ts)
	resp2 := c.postResponses(context.Background(), prompt(t, "second"), h)
	_, _ = io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	assert.Equal(t, ts, resp2.Header.Get(wire.HeaderTurnState), "an echoed turn state is kept for the turn")

	recs := upstream.Requests(RecordFilter{})
	require.Len(t, recs, 2)
	assert.Equal(t, ts, recs[0].TurnStateSent)
	assert.Equal(t, ts, recs[1].TurnState)
	assert.Empty(t, recs[1].TurnStateSent)
}

func TestIdentityHeadersRecorded(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	h := http.Header{}
	h.Set("session-id", "sess-1")
	h.Set("thread-id", "thr-1")
	h.Set("x-client-request-id", "thr-1")
	h.Set("x-codex-window-id", "thr-1:0")
	h.Set("x-codex-turn-metadata", `{"request_kind":"turn","turn_id":"t1"}`)
	h.Set("originator", "codex_exec")
	h.Set("User-Agent", "codex_exec/0.169.0")
	resp := c.postResponses(context.Background(), prompt(t, "hi"), h)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	recs := upstream.Records(RecordFilter{ThreadID: "thr-1"})
	require.Len(t, recs, 1)
	r := recs[0]
	assert.Equal(t, "sess-1", r.SessionID)
	assert.Equal(t, "thr-1", r.ClientRequestID)
	assert.Equal(t, "thr-1:0", r.WindowID)
	assert.Equal(t, "turn", r.RequestKind)
	assert.Equal(t, "codex_exec", r.Originator)
	assert.Equal(t, "codex_exec/0.169.0", r.UserAgent)
	assert.Equal(t, "cg-a1", r.ChatGPTAccountID)
	assert.Empty(t, upstream.Records(RecordFilter{SessionID: "other"}))

	// Older clients send session_id (underscore).
	h2 := http.Header{}
	h2.Set("session_id", "legacy-sess")
	resp = c.postResponses(context.Background(), prompt(t, "hi"), h2)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Len(t, upstream.Records(RecordFilter{SessionID: "legacy-sess"}), 1)
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	tests := []struct {
		name        string
		account     string // client to start from
		token       string // overrides the token when not empty
		base        string // overrides the base URL when not empty
		accountID   *string
		wantStatus  int
		wantCode    string
		wantAccount string
		clientKey   bool
	}{
		{name: "valid", account: "a1", wantStatus: 200, wantAccount: "a1"},
		{name: "missing token", account: "a1", token: "-", wantStatus: 401, wantCode: wire.CodeInvalidAPIKey},
		{name: "unknown token", account: "a1", token: "nope", wantStatus: 401, wantCode: wire.CodeInvalidAPIKey},
		{name: "relay client key is flagged", account: "a1", token: "crk_leaked", wantStatus: 401, wantCode: wire.CodeInvalidAPIKey, clientKey: true},
		{name: "chatgpt token on v1", account: "a1", base: "v1", wantStatus: 401, wantCode: wire.CodeInvalidAPIKey, wantAccount: "a1"},
		{name: "api key on backend", account: "k1", base: "codex", wantStatus: 401, wantCode: wire.CodeInvalidAPIKey, wantAccount: "k1"},
		{name: "missing account id", account: "a1", accountID: new(""), wantStatus: 403, wantCode: "account_mismatch", wantAccount: "a1"},
		{name: "other account id", account: "a1", accountID: new("cg-b1"), wantStatus: 403, wantCode: "account_mismatch", wantAccount: "a1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clientFor(t, upstream, tt.account)
			switch tt.token {
			case "":
			case "-":
				c.token = ""
			default:
				c.token = tt.token
			}
			switch tt.base {
			case "v1":
				c.base = upstream.OpenAIBaseURL()
			case "codex":
				c.base = upstream.CodexBaseURL()
			}
			if tt.accountID != nil {
				c.headers.Set(wire.HeaderChatGPTAccountID, *tt.accountID)
			}
			thread := "auth-" + tt.name
			h := http.Header{}
			h.Set("thread-id", thread)
			resp := c.postResponses(context.Background(), prompt(t, "hi"), h)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, tt.wantStatus, resp.StatusCode, "%s", b)
			if tt.wantCode != "" {
				e, ok := wire.ParseErrorBody(b)
				require.True(t, ok)
				assert.Equal(t, tt.wantCode, e.Code)
			}
			recs := upstream.Records(RecordFilter{ThreadID: thread})
			require.Len(t, recs, 1)
			assert.Equal(t, tt.wantAccount, recs[0].Account)
			assert.Equal(t, tt.clientKey, recs[0].ClientKey)
			assert.Equal(t, tt.wantStatus, recs[0].Status)
		})
	}
}

func TestPreviousResponseIDIsNeverFoundOverHTTP(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	_, evs, err := c.turn(prompt(t, "first"))
	require.NoError(t, err)
	id := completedResponse(t, evs)["id"].(string)

	_, _, err = c.turn(body(t, []any{userMsg("next")}, map[string]any{"previous_response_id": id}))
	status, e := errorOf(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, wire.CodePreviousResponseNotFound, e.Code)
	assert.Contains(t, e.Message, id)
}

func TestToolCallRoundTripOverHTTP(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "k1")
	first := userMsg(`run both [[sim:tool exec_command {"cmd":"echo one"}]] and [[sim:tool exec_command {"cmd":"echo ]] two"}]] [[sim:tool apply_patch *** Begin Patch]]`)
	_, evs, err := c.turn(body(t, []any{devMsg("x"), first}, nil))
	require.NoError(t, err)
	items := outputItems(evs)
	require.Len(t, items, 4, "reasoning, then every call of the turn in one response")
	assert.Equal(t, "reasoning", items[0]["type"])
	for i, want := range []string{`{"cmd":"echo one"}`, `{"cmd":"echo ]] two"}`} {
		it := items[1+i]
		assert.Equal(t, "function_call", it["type"])
		assert.Equal(t, "exec_command", it["name"])
		assert.Equal(t, want, it["arguments"])
		assert.NotEmpty(t, it["call_id"])
	}
	assert.Equal(t, "custom_tool_call", items[3]["type"], "a tool offered as custom is called with input")
	assert.Equal(t, "*** Begin Patch", items[3]["input"])
	assert.Empty(t, find(evs, wire.EventOutputTextDelta))
	assert.Len(t, find(evs, wire.EventFunctionCallArgumentsDelta), 2)

	// The follow-up carries the outputs; the answer quotes them.
	input := []any{devMsg("x"), first}
	for _, it := range items {
		input = append(input, it)
	}
	input = append(input,
		map[string]any{"type": "function_call_output", "call_id": items[1]["call_id"], "output": "one-out"},
		map[string]any{"type": "function_call_output", "call_id": items[2]["call_id"],
			"output": []any{map[string]any{"type": "input_text", "text": "two-out"}}},
		map[string]any{"type": "custom_tool_call_output", "call_id": items[3]["call_id"], "output": "patched"},
	)
	_, evs, err = c.turn(body(t, input, nil))
	require.NoError(t, err)
	assert.Equal(t, "Tool results:\none-out\ntwo-out\npatched", answerText(evs))

	recs := upstream.Requests(RecordFilter{})
	require.Len(t, recs, 2)
	assert.Empty(t, recs[0].ToolOutputs)
	assert.Equal(t, []ToolOutput{
		{CallID: items[1]["call_id"].(string), Output: "one-out"},
		{CallID: items[2]["call_id"].(string), Output: "two-out"},
		{CallID: items[3]["call_id"].(string), Output: "patched"},
	}, recs[1].ToolOutputs)
	assert.True(t, recs[1].HasInputType("function_call_output"))
}

func TestGoalContextOutputIsNotAToolResult(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	input := []any{
		userMsg("<codex_internal_context source=\"goal\">\ncontinue"),
		map[string]any{"type": "function_call_output", "name": "goal_objective", "output": "ship it"},
	}
	_, evs, err := c.turn(body(t, input, nil))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(answerText(evs), "Simulated reply to: <codex_internal_context"))
}

func TestDirectivesShapeTheStream(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "k1")

	_, evs, err := c.turn(prompt(t, "long [[sim:words 40]] [[sim:events 7]]"))
	require.NoError(t, err)
	assert.Len(t, find(evs, wire.EventOutputTextDelta), 7)
	assert.Len(t, strings.Fields(answerText(evs)), 40)

	start := time.Now()
	_, evs, err = c.turn(prompt(t, "slow [[sim:delay 150ms]] [[sim:gap 10ms]]"))
	require.NoError(t, err)
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, 150*time.Millisecond+time.Duration(len(evs)-1)*10*time.Millisecond)

	_, _, err = c.turn(prompt(t, "typo [[sim:wrods 3]]"))
	status, e := errorOf(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, e.Message, "unknown directive")
}

func TestZstdBodies(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{MaxBodyBytes: 1 << 20})
	c := clientFor(t, upstream, "a1")
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	defer enc.Close()

	zstdHeader := http.Header{"Content-Encoding": {"zstd"}}
	tests := []struct {
		name       string
		body       []byte
		header     http.Header
		wantStatus int
	}{
		{"zstd", enc.EncodeAll(prompt(t, "compressed hello"), nil), zstdHeader, http.StatusOK},
		{"identity", prompt(t, "plain hello"), nil, http.StatusOK},
		{"corrupt zstd", []byte("not zstd at all"), zstdHeader, http.StatusBadRequest},
		{"unsupported encoding", prompt(t, "x"), http.Header{"Content-Encoding": {"br"}}, http.StatusBadRequest},
		{"too large after decompression", enc.EncodeAll(prompt(t, strings.Repeat("a", 2<<20)), nil), zstdHeader, http.StatusRequestEntityTooLarge},
		{"not json", []byte("{"), nil, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := c.postResponses(context.Background(), tt.body, tt.header)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, tt.wantStatus, resp.StatusCode, "%s", b[:min(len(b), 300)])
			if tt.wantStatus == http.StatusOK {
				evs, err := readSSE(bytes.NewReader(b))
				require.NoError(t, err)
				assert.Contains(t, answerText(evs), "hello")
			}
		})
	}
	recs := upstream.Requests(RecordFilter{})
	require.NotEmpty(t, recs)
	assert.Equal(t, "zstd", recs[0].ContentEncoding)
	assert.Equal(t, "gpt-5.5-codex", recs[0].Model)
}

func TestPromptCacheModel(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	cached := func(acct, text string) float64 {
		_, evs, err := clientFor(t, upstream, acct).turn(prompt(t, text))
		require.NoError(t, err)
		usage := completedResponse(t, evs)["usage"].(map[string]any)
		return usage["input_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	}
	assert.Zero(t, cached("a1", "first"), "a cold cache")
	assert.Positive(t, cached("a1", "second turn"), "same key, same account: cached")
	assert.Zero(t, cached("a2", "second turn"), "another account has its own cache")
}

func TestUsagePerRequest(t *testing.T) {
	t.Parallel()
	accts := testAccounts()
	accts[0].UsagePerRequest = 10
	accts[0].Primary.UsedPercent = 85
	upstream := newSim(t, Config{Accounts: accts})
	c := clientFor(t, upstream, "a1")
	for range 2 {
		_, _, err := c.turn(prompt(t, "spend"))
		require.NoError(t, err)
	}
	st, _ := upstream.Account("a1")
	assert.Equal(t, 100.0, st.Usage.Primary.UsedPercent, "capped at 100")
	assert.Equal(t, 20.0, st.Usage.Secondary.UsedPercent)
	resp, _, err := c.turn(prompt(t, "spend"))
	require.NoError(t, err)
	assert.Equal(t, "100", resp.Header.Get(wire.HeaderPrimaryUsedPercent))
}

func TestUnknownRouteIsRecorded(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	c := clientFor(t, upstream, "a1")
	resp := c.do(context.Background(), http.MethodGet, upstream.URL+"/backend-api/codex/nope", nil, nil)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	recs := upstream.Records(RecordFilter{Route: RouteUnknown})
	require.Len(t, recs, 1)
	assert.Equal(t, "/backend-api/codex/nope", recs[0].Path)
}

func TestModels(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Models: []string{"m1", "m2"}})
	for _, tt := range []struct {
		account, path, want string
	}{
		{"a1", "/backend-api/codex/models?client_version=0.169.0", `{"models":[{"slug":"m1","display_name":"m1","visibility":"list","supported_in_api":true,"priority":0},{"slug":"m2","display_name":"m2","visibility":"list","supported_in_api":true,"priority":1}]}`},
		{"k1", "/v1/models", `{"object":"list","data":[{"id":"m1","object":"model","created":1700000000,"owned_by":"openai"},{"id":"m2","object":"model","created":1700000000,"owned_by":"openai"}]}`},
	} {
		resp := clientFor(t, upstream, tt.account).do(context.Background(), http.MethodGet, upstream.URL+tt.path, nil, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.JSONEq(t, tt.want, string(b))
	}
	assert.Len(t, upstream.Records(RecordFilter{Route: RouteModels}), 2)
}

func TestUsageEndpoint(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	accts := testAccounts()
	accts[0].Primary = Window{UsedPercent: 42, ResetsIn: Duration(time.Hour)}
	accts[0].Secondary = Window{UsedPercent: 7}
	accts[0].Credits = &wire.Credits{HasCredits: true, Balance: "12.5"}
	upstream := newSim(t, Config{Accounts: accts, Now: func() time.Time { return now }})
	c := clientFor(t, upstream, "a1")
	resp := c.do(context.Background(), http.MethodGet, upstream.UsageURL(), nil, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.JSONEq(t, `{
		"user_id":"user-a1","account_id":"cg-a1","email":"a1@sim.invalid","plan_type":"plus",
		"rate_limit":{"allowed":true,"limit_reached":false,
			"primary_window":{"used_percent":42,"limit_window_seconds":18000,"reset_after_seconds":3600,"reset_at":1800003600},
			"secondary_window":{"used_percent":7,"limit_window_seconds":604800,"reset_after_seconds":604800,"reset_at":1800604800}},
		"code_review_rate_limit":null,
		"credits":{"has_credits":true,"unlimited":false,"balance":"12.5"}}`, string(b))

	// The usage route takes the ChatGPT token with or without the account header.
	c.headers.Del(wire.HeaderChatGPTAccountID)
	resp = c.do(context.Background(), http.MethodGet, upstream.UsageURL(), nil, nil)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	// An API key has no ChatGPT usage.
	resp = clientFor(t, upstream, "k1").do(context.Background(), http.MethodGet, upstream.UsageURL(), nil, nil)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestGoalRoutes(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	goal := func(acct, op, payload string) (int, map[string]any) {
		resp := clientFor(t, upstream, acct).do(context.Background(), http.MethodPost, upstream.CodexBaseURL()+"/thread/goal/"+op, []byte(payload), nil)
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	status, m := goal("a1", "get", `{"threadId":"t1"}`)
	require.Equal(t, http.StatusOK, status)
	assert.Nil(t, m["goal"])

	status, m = goal("a1", "set", `{"threadId":"t1","objective":"ship the sim","status":"active"}`)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, map[string]any{"objective": "ship the sim", "status": "active"}, m["goal"])

	_, m = goal("a1", "get", `{"threadId":"t1"}`)
	assert.Equal(t, map[string]any{"objective": "ship the sim", "status": "active"}, m["goal"])
	_, m = goal("a1", "get", `{"threadId":"t2"}`)
	assert.Nil(t, m["goal"], "goals are per thread")
	_, m = goal("a2", "get", `{"threadId":"t1"}`)
	assert.Nil(t, m["goal"], "goals are per account: a relay must route goal calls by thread")
	g, ok := upstream.Goal("a1", "t1")
	require.True(t, ok)
	assert.JSONEq(t, `{"objective":"ship the sim","status":"active"}`, string(g))

	_, m = goal("a1", "clear", `{"threadId":"t1"}`)
	assert.Equal(t, true, m["cleared"])
	_, m = goal("a1", "clear", `{"threadId":"t1"}`)
	assert.Equal(t, false, m["cleared"])
	_, m = goal("a1", "get", `{"threadId":"t1"}`)
	assert.Nil(t, m["goal"])

	status, _ = goal("a1", "set", `{"objective":"no thread"}`)
	assert.Equal(t, http.StatusBadRequest, status)
	status, _ = goal("a1", "delete", `{"threadId":"t1"}`)
	assert.Equal(t, http.StatusNotFound, status)

	recs := upstream.Records(RecordFilter{Route: RouteGoalSet})
	require.Len(t, recs, 2)
	assert.Equal(t, "t1", recs[0].GoalThreadID)
}
