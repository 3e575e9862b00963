package relay

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// The request the decision table's rows send: a history with reasoning
// ciphertext (which reasoning recovery can strip) and, for sealedBody, only
// ciphertext it cannot (an agent message's sealed body).
const (
	cipherBody = `{"model":"gpt-5.5-codex","input":[{"type":"message","role":"user","content":"hi"},` +
		`{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"REASONING-CIPHER"},` +
		`{"type":"message","role":"user","content":"go on"}]}`
	sealedBody = `{"model":"gpt-5.5-codex","input":[{"type":"message","role":"user","content":"hi"},` +
		`{"type":"agent_message","id":"am_1","encrypted_content":"SEALED-BODY"}]}`
)

func planOf(t *testing.T, body string) plan {
	t.Helper()
	var f struct {
		Model string            `json:"model"`
		Input []json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &f))
	return plan{body: []byte(body), input: f.Input, model: f.Model}
}

// The ends the rows are made of. Each failure names its account in its
// message, so a row can say whose failure the client gets.
func rejected(acct string) ended {
	return ended{account: acct, sentFull: true, facts: attemptEnd{Now: now, Status: http.StatusBadRequest,
		Err: &wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidEncryptedContent, Message: "rejected by " + acct}}}
}

func rejectedWithStatus(acct string, status int) ended {
	e := rejected(acct)
	e.facts.Status = status
	e.facts.Err = &wire.Error{Type: wire.TypeInvalidRequest, Message: "The encrypted content could not be decrypted (" + acct + ")"}
	return e
}

func failedWith(acct string, status int, typ, code string) ended {
	return ended{account: acct, sentFull: true, facts: attemptEnd{Now: now, Status: status,
		Err: &wire.Error{Type: typ, Code: code, Message: "failed on " + acct, ResetsAt: now.Add(2 * time.Hour).Unix()}}}
}

func usageLimited(acct string) ended {
	return failedWith(acct, http.StatusTooManyRequests, wire.TypeUsageLimitReached, "")
}

func serverError(acct string) ended {
	return failedWith(acct, http.StatusInternalServerError, wire.TypeServerError, "")
}

func answered401(acct string) ended {
	e := failedWith(acct, http.StatusUnauthorized, wire.TypeInvalidRequest, wire.CodeInvalidAPIKey)
	e.canRefresh = true
	return e
}

func noAccount(reset time.Time, fallbackInScope bool) ended {
	return ended{refused: &noAccountError{Considered: 2, EarliestReset: reset}, fallbackInScope: fallbackInScope, now: now}
}

func with(e ended, f func(*ended)) ended { f(&e); return e }

// want is what a row checks of the last step and of the state it leaves;
// fields left zero are checked to be zero too, except where a row has no
// say (plan fields are checked when the next step is an attempt).
type want struct {
	next     stepKind
	class    attemptClass
	action   nextAction
	recovery string // the recovery the record shows
	penalty  store.Status
	// The next attempt's plan (next == stepAttempt).
	force, planRecovery string
	stripped            bool // the reasoning ciphertext is gone from its body
	released, fallback  bool
	model               string
	// The answer (next == stepEnd): the message or code it carries ("": none).
	answer   string
	excluded []string
}

// TestDecide is the decision table: one row for each rule of the seeds
// (000: ciphertext recovery and mismatch switching; 002: an account cause
// before any work moves the request, once to the fallback group; the
// token refresh) and of the relay's own retries. Each row runs the ends it
// names, in order, through one request's decision step.
func TestDecide(t *testing.T) {
	t.Parallel()
	reset := now.Add(2 * time.Hour)
	rows := []struct {
		name  string
		body  string
		setup func(*tries)
		ends  []ended
		want  want
	}{
		// Seed 000: an account rejects ciphertext it did not issue.
		{name: "000: a rejection of reasoning ciphertext strips it and retries once on the same account",
			ends: []ended{rejected("a1")},
			want: want{next: stepAttempt, class: classCiphertext, action: actionSame, force: "a1", planRecovery: RecoveryReasoning, stripped: true}},
		{name: "000: the stripped retry rejected again: the unchanged request goes to another account, with no penalty",
			ends: []ended{rejected("a1"), rejected("a1")},
			want: want{next: stepAttempt, class: classCiphertext, action: actionNext, recovery: RecoveryReasoning, planRecovery: RecoveryMismatch, excluded: []string{"a1"}}},
		{name: "000: nothing the relay can strip (an agent message's sealed body): to another account at once",
			body: sealedBody, ends: []ended{rejected("a1")},
			want: want{next: stepAttempt, class: classCiphertext, action: actionNext, planRecovery: RecoveryMismatch, excluded: []string{"a1"}}},
		{name: "000: the wording 'could not be decrypted' without a code is a rejection too",
			body: sealedBody, ends: []ended{rejectedWithStatus("a1", http.StatusBadRequest)},
			want: want{next: stepAttempt, class: classCiphertext, action: actionNext, planRecovery: RecoveryMismatch, excluded: []string{"a1"}}},
		{name: "000: each account gets its own stripped retry",
			ends: []ended{rejected("a1"), rejected("a1"), rejected("b1")},
			want: want{next: stepAttempt, class: classCiphertext, action: actionSame, recovery: RecoveryMismatch, force: "b1", planRecovery: RecoveryReasoning, stripped: true, excluded: []string{"a1"}}},
		{name: "000: at most 3 mismatch switches; then the client gets the first mismatch failure",
			body: sealedBody, setup: func(t *tries) { t.max = 10 },
			ends: []ended{rejected("a1"), rejected("b1"), rejected("c1"), rejected("d1")},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, recovery: RecoveryMismatch, answer: "rejected by a1", excluded: []string{"a1", "b1", "c1"}}},
		{name: "000: accounts run out: the client gets the first mismatch failure",
			body: sealedBody, ends: []ended{rejected("a1"), noAccount(time.Time{}, false)},
			want: want{next: stepEnd, answer: "rejected by a1", excluded: []string{"a1"}}},
		{name: "000: an account that ends the request with an answer of its own: that is the answer",
			body: sealedBody, ends: []ended{rejected("a1"), failedWith("b1", http.StatusBadRequest, wire.TypeInvalidRequest, "")},
			want: want{next: stepEnd, class: classInvalid, action: actionTerminal, recovery: RecoveryMismatch, answer: "failed on b1", excluded: []string{"a1"}}},
		{name: "000: the switch budget bounds the switches",
			body: sealedBody, setup: func(t *tries) { t.max = 2 },
			ends: []ended{rejected("a1"), rejected("b1")},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, recovery: RecoveryMismatch, answer: "rejected by a1", excluded: []string{"a1"}}},
		{name: "000: never a recovery with recovery switched off",
			setup: func(t *tries) { t.recoveryOn = false }, ends: []ended{rejected("a1")},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, answer: "rejected by a1"}},
		{name: "000: never once output reached the client",
			ends: []ended{with(rejected("a1"), func(e *ended) { e.facts.Committed = true })},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal}},
		{name: "000: never for a request whose client went away",
			ends: []ended{with(rejected("a1"), func(e *ended) { e.gone = true })},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, answer: "rejected by a1"}},
		{name: "000: never for a 401 (an auth cause, moved on as one)",
			ends: []ended{rejectedWithStatus("a1", http.StatusUnauthorized)},
			want: want{next: stepAttempt, class: classAuth, action: actionNext, penalty: store.StatusReauthRequired, excluded: []string{"a1"}}},
		{name: "000: never for a 402",
			ends: []ended{rejectedWithStatus("a1", http.StatusPaymentRequired)},
			want: want{next: stepAttempt, class: classBilling, action: actionNext, penalty: store.StatusQuotaExceeded, excluded: []string{"a1"}}},
		{name: "000: never for a 403",
			ends: []ended{rejectedWithStatus("a1", http.StatusForbidden)},
			want: want{next: stepAttempt, class: classForbidden, action: actionNext, penalty: store.StatusRateLimited, excluded: []string{"a1"}}},
		{name: "000: never for a 407",
			ends: []ended{rejectedWithStatus("a1", http.StatusProxyAuthRequired)},
			want: want{next: stepAttempt, class: classForbidden, action: actionNext, penalty: store.StatusRateLimited, excluded: []string{"a1"}}},
		{name: "000: never for a 429",
			ends: []ended{rejectedWithStatus("a1", http.StatusTooManyRequests)},
			want: want{next: stepAttempt, class: classRateLimit, action: actionNext, penalty: store.StatusRateLimited, excluded: []string{"a1"}}},
		{name: "000: never for a request chained with previous_response_id",
			ends: []ended{with(rejected("a1"), func(e *ended) { e.sentFull = false })},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, answer: "rejected by a1"}},
		{name: "000: never for a request with a conversation",
			setup: func(t *tries) { t.conversation = true }, ends: []ended{rejected("a1")},
			want: want{next: stepEnd, class: classCiphertext, action: actionTerminal, answer: "rejected by a1"}},
		{name: "000: a stripped retry that failed with a 5xx is not retried on the same account",
			ends: []ended{rejected("a1"), serverError("a1")},
			want: want{next: stepAttempt, class: classServer, action: actionNext, recovery: RecoveryReasoning, planRecovery: RecoveryReasoning, stripped: true, excluded: []string{"a1"}}},
		{name: "000: an ordinary validation rejection after a stripped retry is the answer",
			ends: []ended{rejected("a1"), failedWith("a1", http.StatusBadRequest, wire.TypeInvalidRequest, "")},
			want: want{next: stepEnd, class: classInvalid, action: actionTerminal, recovery: RecoveryReasoning, answer: "failed on a1"}},

		// Seed 002: an account cause before any work moves the request on.
		{name: "002: a usage limit before any work: the same request to the next account, the account rate-limited",
			ends: []ended{usageLimited("a1")},
			want: want{next: stepAttempt, class: classUsageLimit, action: actionNext, penalty: store.StatusRateLimited, excluded: []string{"a1"}}},
		{name: "002: billing (402) before any work: the next account",
			ends: []ended{failedWith("a1", http.StatusPaymentRequired, wire.TypeInvalidRequest, "")},
			want: want{next: stepAttempt, class: classBilling, action: actionNext, penalty: store.StatusQuotaExceeded, excluded: []string{"a1"}}},
		{name: "002: a 5xx or a dead upstream before any work: the next account, no penalty",
			ends: []ended{{account: "a1", facts: attemptEnd{Now: now, Transport: errStall}}},
			want: want{next: stepAttempt, class: classTransport, action: actionNext, excluded: []string{"a1"}}},
		{name: "002: auth (401) on an account whose token can be refreshed: the token is refreshed first",
			ends: []ended{answered401("a1")},
			want: want{next: stepRefresh}},
		{name: "002: once refreshed, the same account takes the request again",
			ends: []ended{answered401("a1"), with(answered401("a1"), func(e *ended) { e.refresh = refreshDone })},
			want: want{next: stepAttempt, class: classAuth, action: actionSame, recovery: "token_refresh", force: "a1"}},
		{name: "002: a refused refresh moves the request on, the account to re-authenticate",
			ends: []ended{answered401("a1"), with(answered401("a1"), func(e *ended) { e.refresh = refreshRefused })},
			want: want{next: stepAttempt, class: classAuth, action: actionNext, penalty: store.StatusReauthRequired, excluded: []string{"a1"}}},
		{name: "002: a second 401 after the refresh is not refreshed again",
			ends: []ended{answered401("a1"), with(answered401("a1"), func(e *ended) { e.refresh = refreshDone }), answered401("a1")},
			want: want{next: stepAttempt, class: classAuth, action: actionNext, penalty: store.StatusReauthRequired, excluded: []string{"a1"}}},
		{name: "002: a 401 on an account no token source can refresh: the next account",
			ends: []ended{with(answered401("a1"), func(e *ended) { e.canRefresh = false })},
			want: want{next: stepAttempt, class: classAuth, action: actionNext, penalty: store.StatusReauthRequired, excluded: []string{"a1"}}},
		{name: "002: once work was observed nothing is retried; the account is still penalised",
			ends: []ended{with(usageLimited("a1"), func(e *ended) { e.facts.Committed = true })},
			want: want{next: stepEnd, class: classUsageLimit, action: actionTerminal, penalty: store.StatusRateLimited}},
		{name: "002: no work observed: the failed account's turn state binds nothing any more",
			setup: func(t *tries) { t.turnStateOwner = "a1" }, ends: []ended{usageLimited("a1")},
			want: want{next: stepAttempt, class: classUsageLimit, action: actionNext, penalty: store.StatusRateLimited, released: true, excluded: []string{"a1"}}},
		{name: "002: another account's turn state is kept",
			setup: func(t *tries) { t.turnStateOwner = "b1" }, ends: []ended{usageLimited("a1")},
			want: want{next: stepAttempt, class: classUsageLimit, action: actionNext, penalty: store.StatusRateLimited, excluded: []string{"a1"}}},
		{name: "002: the pool exhausted: the fallback group, once, asking for the fallback model",
			setup: func(t *tries) { t.fallbackModel = "gpt-5.4-mini" }, ends: []ended{usageLimited("a1"), noAccount(reset, true)},
			want: want{next: stepAttempt, planRecovery: RecoveryFallback, fallback: true, model: "gpt-5.4-mini", excluded: []string{"a1"}}},
		{name: "002: the fallback group is tried once",
			ends: []ended{noAccount(reset, true), noAccount(reset, true)},
			want: want{next: stepEnd, class: classNoAccount, action: actionTerminal, answer: wire.TypeUsageLimitReached}},
		{name: "002: no fallback without a fallback account in the key's scope",
			ends: []ended{noAccount(time.Time{}, false)},
			want: want{next: stepEnd, class: classNoAccount, action: actionTerminal, answer: wire.CodeServerIsOverloaded}},
		{name: "002: a compaction never falls back: it stays where its history can be read",
			setup: func(t *tries) { t.compaction = true }, ends: []ended{noAccount(time.Time{}, true)},
			want: want{next: stepEnd, class: classNoAccount, action: actionTerminal, answer: wire.CodeServerIsOverloaded}},
		{name: "002: every account failed: the client gets the first failure",
			ends: []ended{serverError("a1"), noAccount(time.Time{}, false)},
			want: want{next: stepEnd, answer: "failed on a1", excluded: []string{"a1"}}},
		{name: "002: every account at its usage limit: 429 with the earliest reset",
			ends: []ended{usageLimited("a1"), noAccount(reset, false)},
			want: want{next: stepEnd, class: classNoAccount, action: actionTerminal, answer: wire.TypeUsageLimitReached, excluded: []string{"a1"}}},

		// The request's budget and its client.
		{name: "the switch budget spent: the client gets the first failure",
			setup: func(t *tries) { t.max = 2 }, ends: []ended{usageLimited("a1"), serverError("b1")},
			want: want{next: stepEnd, class: classServer, action: actionNext, answer: "failed on a1", excluded: []string{"a1", "b1"}}},
		{name: "the client went away: nothing is retried, nothing answered",
			ends: []ended{with(serverError("a1"), func(e *ended) { e.gone = true })},
			want: want{next: stepEnd, class: classServer, action: actionNext, excluded: []string{"a1"}}},

		// The relay's own means, retried on the same account.
		{name: "a lane the upstream retired before the request went: a fresh lane on the same account",
			ends: []ended{{account: "a1", facts: attemptEnd{Now: now, LaneGone: true}}},
			want: want{next: stepAttempt, class: classConnectionLimit, action: actionSame, recovery: "fresh_lane", force: "a1"}},
		{name: "the upstream refused a chain the relay made on its lane: the full request on the same account",
			ends: []ended{{account: "a1", facts: attemptEnd{Now: now, Status: 400, Began: true, ChainRefused: true, Err: &wire.Error{Code: wire.CodePreviousResponseNotFound}}}},
			want: want{next: stepAttempt, class: classChainRefused, action: actionSame, recovery: "full_request", force: "a1"}},
		{name: "the client's own chain unknown upstream: previous_response_not_found, for Codex to resend in full",
			ends: []ended{failedWith("a1", http.StatusBadRequest, wire.TypeInvalidRequest, wire.CodePreviousResponseNotFound)},
			want: want{next: stepEnd, class: classPrevNotFound, action: actionTerminal, answer: wire.CodePreviousResponseNotFound}},
		{name: "completed: the request is done",
			ends: []ended{{account: "a1", facts: attemptEnd{Now: now, Began: true, Completed: true, Committed: true}}},
			want: want{next: stepDone, class: classOK, action: actionDone}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			body := row.body
			if body == "" {
				body = cipherBody
			}
			orig := planOf(t, body)
			tr := &tries{plan: orig, max: 4, recoveryOn: true,
				exclude: map[string]bool{}, refreshed: map[string]bool{}, stripped: map[string]bool{}}
			if row.setup != nil {
				row.setup(tr)
			}
			var st step
			for _, e := range row.ends {
				if e.refused == nil && e.refresh == refreshNotTried {
					tr.n++ // the loop counts an attempt as it ends
				}
				st = tr.decide(e)
			}
			w := row.want
			assert.Equal(t, w.next, st.next, "next")
			assert.Equal(t, w.class, st.class, "class")
			assert.Equal(t, w.action, st.action, "action")
			assert.Equal(t, w.recovery, st.recovery, "recorded recovery")
			if w.penalty == "" {
				assert.Nil(t, st.penalty, "penalty")
			} else if assert.NotNil(t, st.penalty, "penalty") {
				assert.Equal(t, w.penalty, st.penalty.Status, "penalty")
			}
			excluded := []string{}
			for _, a := range []string{"a1", "b1", "c1", "d1"} {
				if tr.exclude[a] {
					excluded = append(excluded, a)
				}
			}
			assert.Equal(t, append([]string{}, w.excluded...), excluded, "excluded accounts")
			switch st.next {
			case stepAttempt:
				p := tr.plan
				assert.Equal(t, w.force, p.force, "the next attempt's account")
				assert.Equal(t, w.planRecovery, p.recovery, "the next attempt's recovery")
				assert.Equal(t, w.released, p.released, "turn state released")
				assert.Equal(t, w.fallback, p.fallback, "fallback group")
				assert.Equal(t, cmpOr(w.model, orig.model), p.model, "model")
				assert.Equal(t, w.stripped, !strings.Contains(string(p.body), "REASONING-CIPHER") && strings.Contains(body, "REASONING-CIPHER"),
					"reasoning ciphertext stripped")
				if !w.stripped && !w.fallback {
					assert.JSONEq(t, body, string(p.body), "the request goes unchanged")
				}
			case stepEnd:
				if w.answer == "" {
					assert.Nil(t, st.answer, "no answer: the client has its terminal event, or went away")
				} else if assert.NotNil(t, st.answer, "an answer") {
					assert.Contains(t, []string{st.answer.err.Message, st.answer.err.Code, st.answer.err.Type}, w.answer, "the answer: %+v", st.answer.err)
				}
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
