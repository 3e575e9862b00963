package relay

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	reset := now.Add(2 * time.Hour)
	cases := []struct {
		name    string
		end     AttemptEnd
		class   Class
		action  Action
		penalty *Penalty
	}{
		{"completed", AttemptEnd{Completed: true}, ClassOK, ActionDone, nil},
		{"completed counts even when the client left right after", AttemptEnd{Completed: true, Cancelled: true}, ClassOK, ActionDone, nil},
		{"cancelled wins", AttemptEnd{Cancelled: true, Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached}}, ClassCancelled, ActionTerminal, nil},
		{"usage limit before work", AttemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsAt: reset.Unix()}},
			ClassUsageLimit, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: reset}},
		{"usage limit with resets_in_seconds", AttemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsInSeconds: 60}},
			ClassUsageLimit, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: now.Add(time.Minute)}},
		{"sharing cap without reset cools down", AttemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeUsageLimitReached}},
			ClassUsageLimit, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: now.Add(30 * time.Minute)}},
		{"usage limit after work is terminal but still penalised", AttemptEnd{Status: 429, WorkObserved: true, Err: &wire.Error{Type: wire.TypeUsageLimitReached, ResetsAt: reset.Unix()}},
			ClassUsageLimit, ActionTerminal, &Penalty{Status: store.StatusRateLimited, Reason: "usage_limit_reached", Until: reset}},
		{"rate limit try again in", AttemptEnd{Status: 429, Err: &wire.Error{Code: wire.CodeRateLimitExceeded, Message: "Rate limit reached. Please try again in 7s."}},
			ClassRateLimit, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: wire.CodeRateLimitExceeded, Until: now.Add(7 * time.Second)}},
		{"in-stream rate limit without status", AttemptEnd{Err: &wire.Error{Code: wire.CodeRateLimitExceeded, Message: "try again in 1.5s"}},
			ClassRateLimit, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: wire.CodeRateLimitExceeded, Until: now.Add(1500 * time.Millisecond)}},
		{"insufficient quota", AttemptEnd{Status: 429, Err: &wire.Error{Type: wire.TypeInsufficientQuota, Code: wire.CodeInsufficientQuota}},
			ClassQuota, ActionNext, &Penalty{Status: store.StatusQuotaExceeded, Reason: wire.CodeInsufficientQuota, Until: now.Add(time.Hour)}},
		{"401", AttemptEnd{Status: 401, Err: &wire.Error{Code: wire.CodeTokenExpired}},
			ClassAuth, ActionNext, &Penalty{Status: store.StatusReauthRequired, Reason: wire.CodeTokenExpired}},
		{"402", AttemptEnd{Status: 402}, ClassBilling, ActionNext, &Penalty{Status: store.StatusQuotaExceeded, Reason: "upstream answered 402 (billing)", Until: now.Add(time.Hour)}},
		{"403", AttemptEnd{Status: 403}, ClassForbidden, ActionNext, &Penalty{Status: store.StatusRateLimited, Reason: "upstream answered 403: cooling down", Until: now.Add(10 * time.Minute)}},
		{"500", AttemptEnd{Status: 500}, ClassServer, ActionNext, nil},
		{"503 overloaded", AttemptEnd{Status: 503, Err: &wire.Error{Code: wire.CodeServerIsOverloaded}}, ClassServer, ActionNext, nil},
		{"transport", AttemptEnd{Transport: errors.New("connection refused")}, ClassTransport, ActionNext, nil},
		{"stream cut before work", AttemptEnd{StreamCut: true}, ClassStreamCut, ActionNext, nil},
		{"stream cut after work", AttemptEnd{StreamCut: true, WorkObserved: true}, ClassStreamCut, ActionTerminal, nil},
		{"stall", AttemptEnd{Stalled: true}, ClassStall, ActionNext, nil},
		{"validation is the client's", AttemptEnd{Status: 400, Err: &wire.Error{Type: "invalid_request_error", Message: "bad"}}, ClassInvalid, ActionTerminal, nil},
		{"previous response not found", AttemptEnd{Status: 400, Err: &wire.Error{Code: wire.CodePreviousResponseNotFound}}, ClassPrevNotFound, ActionTerminal, nil},
		{"ciphertext code", AttemptEnd{Status: 400, Err: &wire.Error{Code: wire.CodeInvalidEncryptedContent}}, ClassCiphertext, ActionTerminal, nil},
		{"ciphertext wording without code", AttemptEnd{Status: 400, Err: &wire.Error{Message: "The encrypted content could not be decrypted"}}, ClassCiphertext, ActionTerminal, nil},
		{"failed after work", AttemptEnd{WorkObserved: true, Err: &wire.Error{Type: "server_error"}}, ClassServer, ActionTerminal, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.end.Now = now
			o := Classify(tc.end)
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
		assert.False(t, IsCiphertextRejection(st, e), "status %d", st)
	}
	assert.True(t, IsCiphertextRejection(400, e))
	assert.False(t, IsCiphertextRejection(400, nil))
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
	dst := http.Header{}
	forwardHeaders(dst, src)
	for _, gone := range []string{"Authorization", "Cookie", "Chatgpt-Account-Id", "Connection", "X-Hop", "Keep-Alive",
		"Transfer-Encoding", "Content-Length", "Content-Encoding", "Host", "X-Forwarded-For", "Sec-Websocket-Key", "Openai-Organization"} {
		assert.Empty(t, dst.Get(gone), gone)
	}
	for _, kept := range []string{"Session-Id", "Thread-Id", "X-Client-Request-Id", "Originator", "User-Agent",
		"X-Codex-Turn-Metadata", "X-Codex-Future-Header", "Openai-Beta"} {
		assert.Equal(t, src.Get(kept), dst.Get(kept), kept)
	}
	tgt := Target{Account: store.Account{Kind: store.KindChatGPT, ChatGPTAccountID: "ws-upstream"}, Cred: store.Credentials{AccessToken: "at"}}
	tgt.authorize(dst)
	assert.Equal(t, "Bearer at", dst.Get("Authorization"), "the account's token replaces the client's key")
	assert.Equal(t, "ws-upstream", dst.Get("ChatGPT-Account-Id"))
}
