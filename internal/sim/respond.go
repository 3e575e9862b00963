package sim

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// call is one response request as the transport-neutral core sees it.
type call struct {
	transport Transport
	account   string
	req       *responseRequest
	ref       recordRef
	// prev resolves previous_response_id to the context tokens of the
	// response it names; nil finds nothing (over HTTP, store:false means
	// no response is ever known).
	prev func(id string) (int, bool)
	// compact is the legacy POST .../responses/compact route.
	compact bool
}

// verdict is what the sim answers to a call: an error answer, or a stream
// of events (possibly faulty).
type verdict struct {
	// Error answer, when err is set; objErr, when set too, is the same
	// error in the API's object shape (param and code null), for HTTP.
	status int
	err    *wire.Error
	objErr *apiError

	account    string
	rateLimits wire.RateLimits
	planType   string
	org        string

	// Stream.
	events        [][]byte
	responseID    string
	contextTokens int
	fault         faultAnswer
	delay, gap    time.Duration
	// compactOutput is the output of the legacy compact route.
	compactOutput []any
}

func (v *verdict) fail(status int, e wire.Error) verdict {
	v.status, v.err = status, &e
	return *v
}

// decide checks a response request (faults, previous response, ciphertext,
// directives) and renders its answer.
func (s *Server) decide(c call) verdict {
	now := s.cfg.Now()
	req := c.req
	s.mu.Lock()
	st, ok := s.accounts[c.account]
	if !ok {
		s.mu.Unlock()
		return (&verdict{}).fail(http.StatusUnauthorized, wire.Error{Type: wire.TypeInvalidRequest,
			Code: wire.CodeInvalidAPIKey, Message: "The account of this token was removed."})
	}
	st.requests++
	acct := st.acct
	v := verdict{account: acct.ID, rateLimits: st.rateLimits(), planType: acct.PlanType, org: acct.Organization}
	primaryReset := st.primaryReset
	route := RouteResponses
	if c.compact {
		route = RouteCompact
	}
	fault, fired := s.faults.check(faultSite{account: acct.ID, transport: c.transport, route: route, prewarm: !req.generates()})
	s.mu.Unlock()

	v.fault = faultAnswer{cutAfter: -1, stallAt: -1}
	if fired {
		c.ref.update(func(r *Record) { r.Fault = fault.Kind })
		v.fault = answerFor(fault, acct.PlanType, primaryReset, now)
		if v.fault.status != 0 && !v.fault.inStream {
			if fault.Kind == FaultUsageLimit || fault.Kind == FaultSharingCap {
				p := *v.rateLimits.Primary
				p.UsedPercent = 100
				v.rateLimits.Primary = &p
			}
			return v.fail(v.fault.status, v.fault.err)
		}
	}

	// A file the input names must be one of this account's: a relay
	// that sends a thread to another account is caught here.
	if id, missing := s.missingFile(acct.ID, req.fileIDs); missing {
		e := noSuchFile(id)
		v.objErr = &e
		return v.fail(http.StatusNotFound, wire.Error{Type: e.Type, Param: "id", Message: e.Message})
	}
	prevTokens := 0
	if id := req.PreviousResponseID; id != "" {
		var found bool
		if c.prev != nil {
			prevTokens, found = c.prev(id)
		}
		if !found {
			return v.fail(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodePreviousResponseNotFound,
				Param: "previous_response_id", Message: fmt.Sprintf("Previous response with id '%s' not found.", id)})
		}
	}
	if e := s.verifyCiphertext(acct.Organization, req.Input); e != nil {
		return v.fail(http.StatusBadRequest, *e)
	}
	plan, err := planOutput(req)
	if err != nil {
		return v.fail(http.StatusBadRequest, wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()})
	}
	if c.compact {
		plan = outputPlan{compaction: true}
	}
	v.delay, v.gap = plan.delay, plan.gap

	inputTokens := prevTokens + max(1, req.inputBytes/4)
	cached := s.promptCacheHit(acct.ID, req.PromptCacheKey, inputTokens)
	v.responseID = "resp_" + randomHex(12)
	in := renderInput{
		id: v.responseID, model: req.Model, createdAt: now.Unix(), org: acct.Organization,
		sealMessages: acct.SealMessages || plan.seal, sealCalls: acct.SealToolCalls || plan.seal,
		inputTokens: inputTokens, cachedTokens: cached,
	}
	if plan.compaction {
		in.historyText = historyText(req.Input)
	}
	if v.fault.inStream {
		in.failure, in.failAfter = &v.fault.err, v.fault.failAfter
	}
	events, out := s.renderResponse(plan, in)
	v.events = events
	v.contextTokens = inputTokens + out
	if c.compact {
		v.compactOutput = s.compactOutput(req.Input, acct.Organization, in.historyText)
	}
	return v
}

// noteUndelivered adds the usage of ref's response, whose completion
// could not be written, to the undelivered sums.
func (s *Server) noteUndelivered(ref recordRef) {
	var key string
	var u *RecordUsage
	ref.update(func(r *Record) {
		key = r.PromptCacheKey
		if r.Usage != nil {
			c := *r.Usage
			u = &c
		}
	})
	if u == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.undelivered == nil {
		s.undelivered = map[string]RecordUsage{}
	}
	sum := s.undelivered[key]
	sum.InputTokens += u.InputTokens
	sum.CachedTokens += u.CachedTokens
	sum.OutputTokens += u.OutputTokens
	sum.ReasoningTokens += u.ReasoningTokens
	sum.TotalTokens += u.TotalTokens
	s.undelivered[key] = sum
}

// Undelivered returns, by prompt_cache_key, the usage of the responses the
// sim completed and counted (in their records) but whose completion it
// could not write, their client gone: usage an upstream counts that no
// relay can have seen.
func (s *Server) Undelivered() map[string]RecordUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.undelivered)
}

// completed notes a completed response: it spends the account's usage.
func (s *Server) completed(account string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.accounts[account]; ok && st.acct.UsagePerRequest > 0 {
		st.primaryUsed = min(100, st.primaryUsed+st.acct.UsagePerRequest)
		st.secondaryUsed = min(100, st.secondaryUsed+st.acct.UsagePerRequest)
	}
}

// promptCacheHit models the upstream prompt cache: a request with the same
// prompt_cache_key on the same account reads as cached the prefix it shares
// with the previous one (taken as the shorter of the two).
func (s *Server) promptCacheHit(account, key string, tokens int) int {
	if key == "" {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := cacheKey{account, key}
	prev, ok := s.promptCache[k]
	if !ok && len(s.promptCache) >= maxPromptCacheEntries {
		s.promptCache = map[cacheKey]int{}
	}
	s.promptCache[k] = tokens
	if !ok {
		return 0
	}
	return min(prev, tokens)
}

// verifyCiphertext checks every encrypted_content of the input against the
// account's organisation. Reasoning and compaction ciphertext a relay can
// strip: it fails with invalid_encrypted_content. Ciphertext it cannot strip
// (an encrypted message body, encrypted tool-call arguments) fails as a 400
// without a code whose message says it "could not be decrypted".
func (s *Server) verifyCiphertext(org string, items []inputItem) *wire.Error {
	for _, it := range items {
		if it.EncryptedContent == nil || *it.EncryptedContent == "" {
			continue
		}
		var kind CipherKind
		switch it.Type {
		case "reasoning":
			kind = CipherReasoning
		case "compaction":
			kind = CipherCompaction
		case "message":
			kind = CipherMessage
		case "function_call", "custom_tool_call":
			kind = CipherToolCall
		default:
			continue
		}
		if _, err := s.sealer.open(org, kind, *it.EncryptedContent); err == nil {
			continue
		}
		if kind == CipherReasoning || kind == CipherCompaction {
			return &wire.Error{Type: wire.TypeInvalidRequest, Code: wire.CodeInvalidEncryptedContent, Param: "input",
				Message: fmt.Sprintf("The encrypted content for item %s could not be verified.", itemName(it))}
		}
		return &wire.Error{Type: wire.TypeInvalidRequest,
			Message: fmt.Sprintf("The encrypted content of item %s could not be decrypted.", itemName(it))}
	}
	return nil
}

func itemName(it inputItem) string {
	if it.ID != "" {
		return it.ID
	}
	return it.Type
}

// historyText is what a compaction summarises: the user messages.
func historyText(items []inputItem) string {
	var b strings.Builder
	for _, it := range items {
		if it.Type == "message" && it.Role == "user" {
			b.WriteString(clip(it.text(), 512))
			b.WriteString("\n")
		}
	}
	return clip(b.String(), 8192)
}

// compactOutput is the answer of the legacy compact route: the user
// messages kept as they were, then one compaction item.
func (s *Server) compactOutput(items []inputItem, org, history string) []any {
	var out []any
	for _, it := range items {
		if it.Type == "message" && it.Role == "user" {
			out = append(out, object{"type": "message", "role": "user",
				"content": []any{object{"type": "input_text", "text": it.text()}}})
		}
	}
	return append(out, object{"type": "compaction", "id": "cmp_" + randomHex(12),
		"encrypted_content": s.sealer.seal(org, CipherCompaction, []byte(history))})
}

// sink is where a stream's events go: SSE over HTTP, or text frames.
type sink interface {
	send(ctx context.Context, data []byte) error
}

// stream sends events through sk, honouring the verdict's delay and gap and
// its cut or stall fault, and returns the outcome. A stall waits for ctx. A
// cut or stall past the response's last event sends them all first. The
// gap paces the answer's events as a model paces tokens; the events that
// stand for HTTP headers over WebSocket (codex.rate_limits and
// response.metadata) come with the answer's start, as headers do, so the
// event after them follows without a gap. (Paced like tokens, they put a
// WebSocket answer's first token two gaps behind the same answer over HTTP.)
//
// The record is brought up to date before each event is sent, and finished
// before the terminal event (and the account's usage spent), so a client
// that has read an event finds it in the records.
func (s *Server) stream(ctx context.Context, sk sink, events [][]byte, v *verdict, ref recordRef) string {
	if !sleep(ctx, v.delay) {
		return OutcomeGone
	}
	for i, ev := range events {
		if i == v.fault.cutAfter {
			return OutcomeCut
		}
		if i == v.fault.stallAt {
			<-ctx.Done()
			return OutcomeStalled
		}
		if i > 0 && !headerEvent(events[i-1]) && !sleep(ctx, v.gap) {
			return OutcomeGone
		}
		typ, _ := wire.EventType(ev)
		ref.event(typ)
		sctx := ctx
		switch typ {
		case wire.EventResponseCompleted:
			ref.usage(ev) // before finish: a finished record may be taken at once (TakeFinished)
			ref.finish(http.StatusOK, OutcomeCompleted, s.cfg.Now())
			s.completed(v.account)
			// A response it finished (and counted) is delivered while the
			// connection carries it, even to a client that is going: one
			// that half-closed still reads it.
			sctx = context.WithoutCancel(ctx)
		case wire.EventResponseFailed:
			ref.finish(http.StatusOK, OutcomeFailed, s.cfg.Now())
		}
		if err := sk.send(sctx, ev); err != nil {
			if typ == wire.EventResponseCompleted {
				s.noteUndelivered(ref)
			}
			return OutcomeGone
		}
	}
	if v.fault.cutAfter >= len(events) {
		return OutcomeCut
	}
	if v.fault.stallAt >= len(events) {
		<-ctx.Done()
		return OutcomeStalled
	}
	last, _ := wire.EventType(events[len(events)-1])
	switch last {
	case wire.EventResponseCompleted:
		return OutcomeCompleted
	case wire.EventResponseFailed:
		return OutcomeFailed
	}
	return OutcomeOK
}

// headerEvent reports whether ev stands for HTTP headers over WebSocket.
func headerEvent(ev []byte) bool {
	typ, _ := wire.EventType(ev)
	return typ == wire.EventRateLimits || typ == wire.EventResponseMetadata
}

// sleep waits for d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
