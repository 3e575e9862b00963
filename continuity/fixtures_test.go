package continuity

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// jstr returns s as a JSON string token.
func jstr(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

func msg(role, text string) json.RawMessage {
	typ := "input_text"
	if role == "assistant" {
		typ = "output_text"
	}
	return raw(fmt.Sprintf(`{"type":"message","role":%s,"content":[{"type":%s,"text":%s}]}`, jstr(role), jstr(typ), jstr(text)))
}

func reasoning(id, cipher string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"reasoning","id":%s,"summary":[{"type":"summary_text","text":"thinking"}],"encrypted_content":%s}`, jstr(id), jstr(cipher)))
}

func funcCall(callID, args string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"function_call","id":"fc_%s","name":"exec_command","arguments":%s,"call_id":%s}`, callID, jstr(args), jstr(callID)))
}

func funcOutput(callID, out string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"function_call_output","call_id":%s,"output":%s}`, jstr(callID), jstr(out)))
}

func customCall(callID string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"custom_tool_call","id":"ctc_%s","name":"apply_patch","input":"*** Begin Patch","call_id":%s}`, callID, jstr(callID)))
}

func customOutput(callID string) json.RawMessage {
	return raw(fmt.Sprintf(`{"type":"custom_tool_call_output","call_id":%s,"output":"Done"}`, jstr(callID)))
}

// goalObjective is Codex's goal context item: a function_call_output with no
// call_id.
func goalObjective() json.RawMessage {
	return raw(`{"type":"function_call_output","name":"goal_objective","output":"finish the report"}`)
}

func items(xs ...json.RawMessage) []json.RawMessage { return xs }

func concat(parts ...[]json.RawMessage) []json.RawMessage {
	var out []json.RawMessage
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// strs turns items into strings, for readable comparisons.
func strs(xs []json.RawMessage) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = string(x)
	}
	return out
}

// fakeClock is an injected clock; safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time // guarded by mu
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// realisticHistory returns n items shaped like a Codex thread after some tool
// use: a large developer message, user turns, and rounds of reasoning (with
// ciphertext), function calls with their outputs, and assistant messages.
func realisticHistory(n int) []json.RawMessage {
	out := []json.RawMessage{
		msg("developer", strings.Repeat("You are Codex, a coding agent. Follow the instructions. ", 200)),
		msg("user", "<environment_context><cwd>/work/repo</cwd><shell>bash</shell></environment_context>"),
		msg("user", "Fix the failing test in relay/selection_test.go and explain the cause."),
	}
	for i := 0; len(out) < n; i++ {
		callID := fmt.Sprintf("call_%04d", i)
		round := []json.RawMessage{
			reasoning(fmt.Sprintf("rs_%04d", i), strings.Repeat("gAAAAABo", 200)),
			funcCall(callID, `{"cmd":"go test ./relay/ -run TestSelect","workdir":"/work/repo"}`),
			funcOutput(callID, strings.Repeat("=== RUN   TestSelect\n--- PASS: TestSelect (0.00s)\n", 40)),
			msg("assistant", "The test now passes; the cause was a stale binding row."),
		}
		for _, it := range round {
			if len(out) < n {
				out = append(out, it)
			}
		}
	}
	return out
}

// codexBody returns a Codex-shaped request body around input.
func codexBody(input []json.RawMessage, previous string) []byte {
	in := "[" + strings.Join(strs(input), ",") + "]" // item bytes kept exactly
	prev := ""
	if previous != "" {
		prev = `,"previous_response_id":` + jstr(previous)
	}
	return []byte(`{"model":"gpt-5.5-codex","instructions":"","input":` + string(in) + `,"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}}],"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"medium","summary":"auto"},"store":false,"stream":true,"include":["reasoning.encrypted_content"],"prompt_cache_key":"019a0000-0000-7000-8000-000000000001"` + prev + `,"client_metadata":{"x-codex-turn-metadata":"{}"}}`)
}
