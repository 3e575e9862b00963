package sim

import (
	"encoding/json"
	"strings"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// responseBuilder renders one response as its sequence of server events.
// It is used by one request at a time.
type responseBuilder struct {
	id        string
	model     string
	createdAt int64
	seq       int
	events    [][]byte
	output    []any
}

type object = map[string]any

func (b *responseBuilder) emit(ev object) {
	ev["sequence_number"] = b.seq
	b.seq++
	data, err := json.Marshal(ev)
	if err != nil {
		panic(err) // only plain values go in
	}
	b.events = append(b.events, data)
}

func (b *responseBuilder) response(status string) object {
	output := b.output
	if output == nil {
		output = []any{}
	}
	return object{
		"id": b.id, "object": "response", "created_at": b.createdAt,
		"status": status, "model": b.model, "output": output,
	}
}

func (b *responseBuilder) created() {
	r := b.response("in_progress")
	r["output"] = []any{}
	b.emit(object{"type": wire.EventResponseCreated, "response": r})
}

// item emits output_item.added with the item as it starts, then the events
// of between, then output_item.done with the finished item.
func (b *responseBuilder) item(started, done object, between func(index int)) {
	index := len(b.output)
	b.emit(object{"type": wire.EventOutputItemAdded, "output_index": index, "item": started})
	if between != nil {
		between(index)
	}
	b.emit(object{"type": wire.EventOutputItemDone, "output_index": index, "item": done})
	b.output = append(b.output, done)
}

func (b *responseBuilder) completed(usage object) {
	r := b.response("completed")
	if usage != nil {
		r["usage"] = usage
	}
	b.emit(object{"type": wire.EventResponseCompleted, "response": r})
}

func (b *responseBuilder) failed(e wire.Error) {
	r := b.response("failed")
	errObj := object{"code": e.Code, "message": e.Message}
	if e.Type != "" {
		errObj["type"] = e.Type
	}
	if e.ResetsAt > 0 {
		errObj["resets_at"], errObj["resets_in_seconds"] = e.ResetsAt, e.ResetsInSeconds
	}
	if e.PlanType != "" {
		errObj["plan_type"] = e.PlanType
	}
	r["error"] = errObj
	b.emit(object{"type": wire.EventResponseFailed, "response": r})
}

// usageObject is the usage of a response in the Responses API layout.
func usageObject(input, cached, output, reasoning int) object {
	return object{
		"input_tokens":          input,
		"input_tokens_details":  object{"cached_tokens": cached},
		"output_tokens":         output,
		"output_tokens_details": object{"reasoning_tokens": reasoning},
		"total_tokens":          input + output,
	}
}

// renderInput is what renderResponse needs besides the plan.
type renderInput struct {
	id, model    string
	createdAt    int64
	org          string
	sealMessages bool
	sealCalls    bool
	inputTokens  int
	cachedTokens int
	// failure, when set, makes the response fail in-stream: after
	// response.created, or after failAfter events of the normal response
	// (so output may already have been sent).
	failure   *wire.Error
	failAfter int
	// historyText is the text compaction summarises.
	historyText string
}

const reasoningTokens = 16

// renderResponse returns the events of the response that p describes, and
// its output token count. Every reasoning and compaction item carries
// ciphertext bound to in.org.
func (s *Server) renderResponse(p outputPlan, in renderInput) ([][]byte, int) {
	if in.failure != nil && in.failAfter > 1 {
		normal := in
		normal.failure = nil
		events, _ := s.renderResponse(p, normal)
		fb := &responseBuilder{id: in.id, model: in.model, createdAt: in.createdAt}
		fb.failed(*in.failure)
		n := min(in.failAfter, len(events)-1) // never the normal terminal event
		return append(events[:n:n], fb.events[len(fb.events)-1]), 0
	}
	b := &responseBuilder{id: in.id, model: in.model, createdAt: in.createdAt}
	b.created()
	switch {
	case in.failure != nil:
		b.failed(*in.failure)
		return b.events, 0
	case p.prewarm:
		b.completed(usageObject(in.inputTokens, in.cachedTokens, 0, 0))
		return b.events, 0
	case p.compaction:
		item := object{"type": "compaction", "id": "cmp_" + randomHex(12),
			"encrypted_content": s.sealer.seal(in.org, CipherCompaction, []byte(in.historyText))}
		b.item(item, item, nil)
		out := 32
		b.completed(usageObject(in.inputTokens, in.cachedTokens, out, 0))
		return b.events, out
	}

	rsID := "rs_" + randomHex(12)
	summary := "Planning the reply."
	b.item(
		object{"type": "reasoning", "id": rsID, "summary": []any{}},
		object{"type": "reasoning", "id": rsID,
			"summary":           []any{object{"type": "summary_text", "text": summary}},
			"encrypted_content": s.sealer.seal(in.org, CipherReasoning, []byte("reasoning for "+in.id))},
		nil)
	out := reasoningTokens

	for _, c := range p.calls {
		callID := "call_" + randomHex(12)
		if c.custom {
			id := "ctc_" + randomHex(12)
			done := object{"type": "custom_tool_call", "id": id, "call_id": callID, "name": c.name,
				"input": c.args, "status": "completed"}
			if in.sealCalls {
				done["encrypted_content"] = s.sealer.seal(in.org, CipherToolCall, []byte(c.args))
			}
			b.item(object{"type": "custom_tool_call", "id": id, "call_id": callID, "name": c.name,
				"input": "", "status": "in_progress"}, done, func(index int) {
				b.emit(object{"type": wire.EventCustomToolCallInputDelta, "item_id": id, "output_index": index, "delta": c.args})
			})
		} else {
			id := "fc_" + randomHex(12)
			done := object{"type": "function_call", "id": id, "call_id": callID, "name": c.name,
				"arguments": c.args, "status": "completed"}
			added := object{"type": "function_call", "id": id, "call_id": callID, "name": c.name,
				"arguments": "", "status": "in_progress"}
			if c.namespace != "" {
				done["namespace"], added["namespace"] = c.namespace, c.namespace
			}
			if in.sealCalls {
				done["encrypted_content"] = s.sealer.seal(in.org, CipherToolCall, []byte(c.args))
			}
			b.item(added, done, func(index int) {
				b.emit(object{"type": wire.EventFunctionCallArgumentsDelta, "item_id": id, "output_index": index, "delta": c.args})
				b.emit(object{"type": wire.EventFunctionCallArgumentsDone, "item_id": id, "output_index": index, "arguments": c.args})
			})
		}
		out += len(c.args)/4 + 1
	}

	if p.text != "" {
		id := "msg_" + randomHex(12)
		part := object{"type": "output_text", "text": p.text, "annotations": []any{}}
		done := object{"type": "message", "id": id, "role": "assistant", "status": "completed", "content": []any{part}}
		if in.sealMessages {
			done["encrypted_content"] = s.sealer.seal(in.org, CipherMessage, []byte(p.text))
		}
		b.item(object{"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []any{}}, done,
			func(index int) {
				ids := object{"item_id": id, "output_index": index, "content_index": 0}
				with := func(extra object) object {
					for k, v := range ids {
						extra[k] = v
					}
					return extra
				}
				b.emit(with(object{"type": wire.EventContentPartAdded,
					"part": object{"type": "output_text", "text": "", "annotations": []any{}}}))
				for _, chunk := range splitText(p.text, p.deltas) {
					b.emit(with(object{"type": wire.EventOutputTextDelta, "delta": chunk}))
				}
				b.emit(with(object{"type": wire.EventOutputTextDone, "text": p.text}))
				b.emit(with(object{"type": wire.EventContentPartDone, "part": part}))
			})
		out += len(strings.Fields(p.text))
	}
	b.completed(usageObject(in.inputTokens, in.cachedTokens, out, reasoningTokens))
	return b.events, out
}
