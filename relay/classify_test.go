package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	reset := now.Add(2 * time.Hour)
	cases := []struct {
		name    string
		end     attemptEnd
		class   attemptClass
		action  nextAction
		penalty *penalty
	}{
		{"completed", attemptEnd{Completed: true}, classOK, actionDone, nil},
		{"completed counts even when the client left right after", attemptEnd{Completed: true, Cancelled: true}, classOK, actionDone, nil},
		{"cancelled wins", attemptEnd{Cancelled: true, Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached}}, classCancelled, actionTerminal, nil},
		{"usage limit before work", attemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsAt: reset.Unix()}},
			classUsageLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: reset}},
		{"usage limit with resets_in_seconds", attemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsInSeconds: 60}},
			classUsageLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: now.Add(time.Minute)}},
		{"sharing cap without reset cools down", attemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached}},
			classUsageLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: now.Add(30 * time.Minute)}},
		{"usage limit after work is terminal but still penalised", attemptEnd{Status: 429, Committed: true, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsAt: reset.Unix()}},
			classUsageLimit, actionTerminal, &penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: reset}},
		{"rate limit try again in", attemptEnd{Status: 429, Err: &wire.Error{Code: wire.CodeRateLimitExceeded, Message: "Rate limit reached. Please try again in 7s."}},
			classRateLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: wire.CodeRateLimitExceeded, Until: now.Add(7 * time.Second)}},
		{"in-stream rate limit without status", attemptEnd{Err: &wire.Error{Code: wire.CodeRateLimitExceeded, Message: "try again in 1.5s"}},
			classRateLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: wire.CodeRateLimitExceeded, Until: now.Add(1500 * time.Millisecond)}},
		{"insufficient quota", attemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeInsufficientQuota, Code: wire.CodeInsufficientQuota}},
			classQuota, actionNext, &penalty{Status: store.StatusQuotaExceeded, Reason: wire.CodeInsufficientQuota, Until: now.Add(time.Hour)}},
		{"401", attemptEnd{Status: 401, Err: &wire.Error{Code: wire.CodeTokenExpired}},
			classAuth, actionNext, &penalty{Status: store.StatusReauthRequired, Reason: wire.CodeTokenExpired}},
		{"402", attemptEnd{Status: 402}, classBilling, actionNext, &penalty{Status: store.StatusQuotaExceeded, Reason: "upstream answered 402 (billing)", Until: now.Add(time.Hour)}},
		{"403", attemptEnd{Status: 403}, classForbidden, actionNext, &penalty{Status: store.StatusRateLimited, Reason: "upstream answered 403: cooling down", Until: now.Add(10 * time.Minute)}},
		{"500", attemptEnd{Status: 500}, classServer, actionNext, nil},
		{"503 overloaded", attemptEnd{Status: 503, Err: &wire.Error{Code: wire.CodeServerIsOverloaded}}, classServer, actionNext, nil},
		{"transport", attemptEnd{Transport: errors.New("connection refused")}, classTransport, actionNext, nil},
		{"stream cut before work", attemptEnd{StreamCut: true}, classStreamCut, actionNext, nil},
		{"stream cut after work", attemptEnd{StreamCut: true, Committed: true}, classStreamCut, actionTerminal, nil},
		{"stall", attemptEnd{Stalled: true}, classStall, actionNext, nil},
		{"validation is the client's", attemptEnd{Status: 400, Err: &wire.Error{Type: "invalid_request_error", Message: "bad"}}, classInvalid, actionTerminal, nil},
		{"previous response not found", attemptEnd{Status: 400, Err: &wire.Error{Code: wire.CodePreviousResponseNotFound}}, classPrevNotFound, actionTerminal, nil},
		{"ciphertext code", attemptEnd{Status: 400, Err: &wire.Error{Code: wire.CodeInvalidEncryptedContent}}, classCiphertext, actionTerminal, nil},
		{"ciphertext wording without code", attemptEnd{Status: 400, Err: &wire.Error{Message: "The encrypted content could not be decrypted"}}, classCiphertext, actionTerminal, nil},
		{"failed after work", attemptEnd{Committed: true, Err: &wire.Error{Type: "server_error"}}, classServer, actionTerminal, nil},
		{"a client that stopped reading", attemptEnd{Cancelled: true, ClientStalled: true, Committed: true}, classClientStalled, actionTerminal, nil},
		{"retry-after header sets the rest", attemptEnd{Status: 429, RetryAfter: 90 * time.Second, Err: &wire.Error{Code: wire.CodeRateLimitExceeded, Message: "try again in 7s"}},
			classRateLimit, actionNext, &penalty{Status: store.StatusRateLimited, Reason: wire.CodeRateLimitExceeded, Until: now.Add(90 * time.Second)}},
		{"connection limit before work: a fresh lane on the same account", attemptEnd{Err: &wire.Error{Code: wire.CodeWebSocketConnectionLimitReached}},
			classConnectionLimit, actionSame, nil},
		{"connection limit after work is terminal", attemptEnd{Committed: true, Err: &wire.Error{Code: wire.CodeWebSocketConnectionLimitReached}},
			classConnectionLimit, actionTerminal, nil},
		{"a chain the relay made, refused: the full request, same account", attemptEnd{Status: 400, ChainRefused: true, Err: &wire.Error{Code: wire.CodePreviousResponseNotFound}},
			classChainRefused, actionSame, nil},
		{"lane capacity: another account", attemptEnd{LaneCapacity: true}, classLaneCapacity, actionNext, nil},
		{"a lane the upstream ended before the request went: a fresh one, same account", attemptEnd{LaneGone: true},
			classConnectionLimit, actionSame, nil},
		{"401 after a token refresh: the same account", attemptEnd{Status: 401, Refreshed: true, Err: &wire.Error{Code: wire.CodeTokenExpired}}, classAuth, actionSame, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.end.Now = now
			o := classify(tc.end)
			assert.Equal(t, tc.class, o.Class)
			assert.Equal(t, tc.action, o.Action)
			if tc.penalty == nil {
				assert.Nil(t, o.Penalty)
			} else if assert.NotNil(t, o.Penalty) {
				assert.Equal(t, tc.penalty.Status, o.Penalty.Status)
				assert.Equal(t, tc.penalty.Reason, o.Penalty.Reason)
				assert.True(t, tc.penalty.Until.Equal(o.Penalty.Until), "until %v, want %v", o.Penalty.Until, tc.penalty.Until)
			}
		})
	}
}

func TestCiphertextRejectionNeverOnAccountStatuses(t *testing.T) {
	t.Parallel()
	e := &wire.Error{Code: wire.CodeInvalidEncryptedContent, Message: "could not be decrypted"}
	for _, st := range []int{401, 402, 403, 407, 429} {
		assert.False(t, isCiphertextRejection(st, e), "status %d", st)
	}
	assert.True(t, isCiphertextRejection(400, e))
	assert.False(t, isCiphertextRejection(400, nil))
}

func TestForwardHeaders(t *testing.T) {
	t.Parallel()
	src := http.Header{}
	for k, v := range map[string]string{
		"Authorization": "Bearer crk_client_secret", "Cookie": "a=b", "Chatgpt-Account-Id": "client-ws",
		"Connection": "keep-alive, X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5", "Transfer-Encoding": "chunked",
		"Content-Length": "10", "Content-Encoding": "zstd", "Host": "relay", "X-Forwarded-For": "1.2.3.4",
		"Session-Id": "s", "Thread-Id": "t", "X-Client-Request-Id": "t", "Originator": "codex_exec",
		"User-Agent": "codex/0.169.0", "X-Codex-Turn-Metadata": "{}", "X-Codex-Future-Header": "kept", "Openai-Beta": "x",
		"Sec-Websocket-Key": "k", "Openai-Organization": "org-client",
	} {
		src.Set(k, v)
	}
	// Spelled with underscores, as a hostile client may, to slip past a
	// list of hyphenated names (issue 36's probe): dropped all the same.
	for _, k := range []string{"chatgpt_account_id", "openai_organization", "api_key", "x_forwarded_for", "transfer_encoding",
		"Proxy_Authorization", "x_codex_relay_hop", "X_Hop"} {
		src[k] = []string{"smuggled"}
	}
	dst := http.Header{}
	forwardHeaders(dst, src)
	for k, vs := range dst {
		assert.NotContains(t, vs, "smuggled", "%s went upstream", k)
	}
	for _, gone := range []string{"Authorization", "Cookie", "Chatgpt-Account-Id", "Connection", "X-Hop", "Keep-Alive",
		"Transfer-Encoding", "Content-Length", "Content-Encoding", "Host", "X-Forwarded-For", "Sec-Websocket-Key", "Openai-Organization"} {
		assert.Empty(t, dst.Get(gone), gone)
	}
	for _, kept := range []string{"Session-Id", "Thread-Id", "X-Client-Request-Id", "Originator", "User-Agent",
		"X-Codex-Turn-Metadata", "X-Codex-Future-Header", "Openai-Beta"} {
		assert.Equal(t, src.Get(kept), dst.Get(kept), kept)
	}
	tgt := target{Account: store.Account{Kind: store.KindChatGPT, ChatGPTAccountID: "ws-upstream"}, Cred: store.Credentials{AccessToken: "at"}}
	tgt.authorize(dst)
	assert.Equal(t, "Bearer at", dst.Get("Authorization"), "the account's token replaces the client's key")
	assert.Equal(t, "ws-upstream", dst.Get("ChatGPT-Account-Id"))
}

// Every error that ends a request before an upstream answer reaches the
// client through failureFor: a stable code and a plain sentence, never an
// account id, an upstream URL or a dial error.
func TestFailureFor(t *testing.T) {
	t.Parallel()
	dial := errors.New(`dial upstream websocket acc_secret: Get "http://10.0.0.7:9000/backend-api/codex/responses": connection refused`)
	later := now.Add(time.Hour)
	cases := []struct {
		name   string
		err    error
		status int
		code   string
		class  attemptClass
	}{
		{"the client went away", context.Canceled, 499, "client_closed", classCancelled},
		{"the client went away while selection read the store", storeUnavailable("read accounts", fmt.Errorf("query: %w", context.Canceled)), 499, "client_closed", classCancelled},
		{"the database did not answer", storeUnavailable("read accounts", dial), 503, "store_unavailable", classStore},
		{"a conflict", &conflictError{A: hardOwner{"acc_secret", hardTurnState}, B: hardOwner{"acc_other", hardPreviousResponse}}, 409, "continuity_owner_conflict", classConflict},
		{"an owner resting until its reset", &ownerUnavailableError{Source: hardSessionPin, Account: store.Account{ID: "acc_secret", StatusUntil: later}, Cause: "rate_limited", InScope: true}, 429, "", classNoAccount},
		{"an owner gone", &ownerUnavailableError{Source: hardPreviousResponse, Account: store.Account{ID: "acc_secret"}, Cause: "the account is gone or outside this client key's scope"}, 503, "continuity_owner_unavailable", classNoAccount},
		{"a pool at its limits", &noAccountError{EarliestReset: later, Considered: 2}, 429, "", classNoAccount},
		{"an empty scope", &noAccountError{}, 503, "no_accounts", classNoAccount},
		{"a request refused", refuse(403, "model_not_allowed", "no"), 403, "model_not_allowed", classInvalid},
		{"a key refused", unauthorized("revoked"), 401, wire.CodeInvalidAPIKey, classInvalid},
		{"anything else", dial, 500, "internal_error", classFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, class := failureFor(tc.err, now)
			assert.Equal(t, tc.status, f.status)
			assert.Equal(t, tc.class, class)
			if tc.code != "" {
				assert.Equal(t, tc.code, f.err.Code)
			}
			if tc.status == 429 {
				assert.Equal(t, wire.TypeUsageLimitReached, f.err.Type, "Codex shows try again at")
				assert.Equal(t, later.Unix(), f.err.ResetsAt)
			}
			assert.NotEmpty(t, f.err.Message)
			for _, secret := range []string{"acc_secret", "acc_other", "10.0.0.7", "dial", "http://"} {
				assert.NotContains(t, f.err.Message, secret)
			}
		})
	}
}

// screen: an upstream's error about the account, or one the relay cannot
// read, becomes the relay's sentence with the status, type, code and
// headers kept; any other passes as it came, credentials masked; the
// relay's own failures pass untouched.
func TestScreen(t *testing.T) {
	t.Parallel()
	leak := []byte(`{"error":{"type":"invalid_request_error","code":"invalid_api_key","message":"Incorrect API key provided: sk-proj-ABCDEFGH1234"}}`)
	hdr := http.Header{"X-Request-Id": {"req_up"}}
	for _, c := range []struct {
		class  attemptClass
		status int
		reword bool
	}{
		{classAuth, 401, true}, {classBilling, 402, true}, {classForbidden, 403, true}, {classServer, 500, true},
		{classInvalid, 400, false}, {classRateLimit, 429, false}, {classUsageLimit, 429, false}, {classQuota, 429, false},
		{classPrevNotFound, 400, false}, {classCiphertext, 400, false},
	} {
		e, _ := wire.ParseErrorBody(leak)
		f := screen(&failure{status: c.status, header: hdr, body: leak, err: e}, c.class)
		assert.Equal(t, c.status, f.status, c.class)
		assert.Equal(t, hdr, f.header, c.class)
		assert.NotContains(t, string(f.httpBody()), "ABCDEFGH", c.class)
		assert.NotContains(t, string(f.wsEvent()), "ABCDEFGH", c.class)
		if c.reword {
			assert.Nil(t, f.body, c.class)
			assert.Equal(t, "invalid_api_key", f.err.Code, "%s: the upstream's code stays", c.class)
			assert.Contains(t, f.err.Message, "the upstream account", c.class)
		} else {
			assert.Contains(t, string(f.httpBody()), "Incorrect API key provided: sk-p***", "%s: the upstream's words, masked", c.class)
		}
	}
	own := failUnreachable()
	assert.Same(t, own, screen(own, classTransport), "the relay's own failure is its own words already")
	ev := screen(&failure{status: 401, event: []byte(`{"type":"error","status":401,"error":{"message":"Bearer sk-abcdef123456"}}`)}, classAuth)
	assert.NotContains(t, string(ev.wsEvent()), "abcdef123456")
	assert.Equal(t, "upstream_auth_failed", ev.err.Code, "an auth failure without a code gets one")

	a := screenAnswer(401, nil, leak, now)
	assert.Nil(t, a.body, "a one-shot answer (models, goals) is screened the same")
	assert.Equal(t, 401, a.status)
	b := screenAnswer(404, nil, []byte(`{"error":{"message":"no model sk-abcdefgh1234"}}`), now)
	assert.Equal(t, `{"error":{"message":"no model sk-a***"}}`, string(b.body))
}
