package chat

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// Meta is what every chat answer of one request carries: its id
// (chatcmpl-...), creation time (unix seconds) and model.
type Meta struct {
	ID      string
	Created int64
	Model   string
}

// response is the part of a Responses response object a chat answer is
// made of.
type response struct {
	ID                string       `json:"id"`
	Model             string       `json:"model"`
	Status            string       `json:"status"`
	Output            []outputItem `json:"output"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Usage *wire.Usage `json:"usage"`
}

type outputItem struct {
	Type      string `json:"type"`
	Role      string `json:"role"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Content   []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	} `json:"content"`
}

// Usage is a chat answer's usage object.
type Usage struct {
	PromptTokens            int64        `json:"prompt_tokens"`
	CompletionTokens        int64        `json:"completion_tokens"`
	TotalTokens             int64        `json:"total_tokens"`
	PromptTokensDetails     promptDetail `json:"prompt_tokens_details"`
	CompletionTokensDetails outputDetail `json:"completion_tokens_details"`
}

type promptDetail struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type outputDetail struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// chatUsage is a Responses usage object as a chat answer's.
func chatUsage(u *wire.Usage) *Usage {
	if u == nil {
		return nil
	}
	out := &Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.Total()}
	out.PromptTokensDetails.CachedTokens = u.Cached()
	out.CompletionTokensDetails.ReasoningTokens = u.Reasoning()
	return out
}

// ToolCall is one tool call of a chat message.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a tool call's function and its JSON arguments.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type completionMessage struct {
	Role        string     `json:"role"`
	Content     *string    `json:"content"`
	Refusal     *string    `json:"refusal"`
	ToolCalls   []ToolCall `json:"tool_calls,omitempty"`
	Annotations []any      `json:"annotations"`
}

type completionChoice struct {
	Index        int               `json:"index"`
	Message      completionMessage `json:"message"`
	Logprobs     any               `json:"logprobs"`
	FinishReason string            `json:"finish_reason"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	Usage             *Usage             `json:"usage,omitempty"`
	ServiceTier       string             `json:"service_tier,omitempty"`
	SystemFingerprint any                `json:"system_fingerprint"`
}

// Completion turns a finished Responses response object (completed or
// incomplete) into a chat completion: the text of its messages as the
// content, its function calls as tool_calls, the finish reason, and the
// usage. The model is the response's, else m's.
func Completion(m Meta, resp []byte) ([]byte, error) {
	var r response
	if err := json.Unmarshal(resp, &r); err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	msg := completionMessage{Role: "assistant", Annotations: []any{}}
	var text, refusal strings.Builder
	hasText, hasRefusal := false, false
	for _, it := range r.Output {
		switch it.Type {
		case "message":
			for _, c := range it.Content {
				switch c.Type {
				case "output_text":
					text.WriteString(c.Text)
					hasText = true
				case "refusal":
					refusal.WriteString(c.Refusal)
					hasRefusal = true
				}
			}
		case "function_call":
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: it.CallID, Type: "function", Function: FunctionCall{Name: it.Name, Arguments: it.Arguments}})
		}
	}
	if hasText || len(msg.ToolCalls) == 0 {
		s := text.String()
		msg.Content = &s
	}
	if hasRefusal {
		s := refusal.String()
		msg.Refusal = &s
	}
	out := completion{ID: m.ID, Object: "chat.completion", Created: m.Created, Model: cmp.Or(r.Model, m.Model),
		Choices: []completionChoice{{Message: msg, FinishReason: finishReason(r, len(msg.ToolCalls) > 0)}},
		Usage:   chatUsage(r.Usage)}
	return marshal(out)
}

// finishReason is why a response ended, in chat's words: tool_calls when
// it called tools, length when it ran out of output tokens, content_filter
// when a filter cut it, else stop.
func finishReason(r response, calls bool) string {
	if r.Status == "incomplete" {
		if d := r.IncompleteDetails; d != nil && d.Reason == "content_filter" {
			return "content_filter"
		}
		return "length"
	}
	if calls {
		return "tool_calls"
	}
	return "stop"
}
