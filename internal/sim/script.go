package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// directives are the [[sim:...]] instructions found in the last user
// message of a request. directiveTable lists them.
type directives struct {
	tools  []toolDirective
	words  int
	events int
	delay  time.Duration
	gap    time.Duration
	seal   bool
}

type toolDirective struct {
	name string
	args string // JSON for function tools, raw text for custom tools
}

const directiveOpen = "[[sim:"

// parseDirectives extracts the directives of text and returns the text with
// them removed. An unknown or malformed directive is an error, so a typo in
// a test prompt fails loudly instead of silently doing nothing.
func parseDirectives(text string) (directives, string, error) {
	var d directives
	var rest strings.Builder
	for {
		i := strings.Index(text, directiveOpen)
		if i < 0 {
			rest.WriteString(text)
			break
		}
		rest.WriteString(text[:i])
		body := text[i+len(directiveOpen):]
		name, args, n, err := splitDirective(body)
		if err != nil {
			return directives{}, "", err
		}
		text = body[n:]
		if err := d.apply(name, args); err != nil {
			return directives{}, "", err
		}
	}
	return d, rest.String(), nil
}

// splitDirective reads "name args]]" from the start of s and returns the
// name, the trimmed arguments and how many bytes it consumed. A tool
// directive's JSON arguments are read as one JSON value, so they may contain
// "]]".
func splitDirective(s string) (name, args string, n int, err error) {
	end := strings.IndexAny(s, " \t\n]")
	if end <= 0 {
		return "", "", 0, fmt.Errorf("sim directive: missing name in %q", clip(directiveOpen+s, 40))
	}
	name = s[:end]
	pos := end
	if name == "tool" {
		// tool NAME [JSON | raw text]
		p := pos + len(s[pos:]) - len(strings.TrimLeft(s[pos:], " \t\n"))
		nameEnd := strings.IndexAny(s[p:], " \t\n]")
		if nameEnd <= 0 {
			return "", "", 0, fmt.Errorf("sim directive tool: missing tool name")
		}
		tool := s[p : p+nameEnd]
		p += nameEnd
		q := p + len(s[p:]) - len(strings.TrimLeft(s[p:], " \t\n"))
		if strings.HasPrefix(s[q:], "{") {
			dec := json.NewDecoder(strings.NewReader(s[q:]))
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return "", "", 0, fmt.Errorf("sim directive tool %s: arguments are not JSON: %w", tool, err)
			}
			q += int(dec.InputOffset())
			r := q + len(s[q:]) - len(strings.TrimLeft(s[q:], " \t\n"))
			if !strings.HasPrefix(s[r:], "]]") {
				return "", "", 0, fmt.Errorf("sim directive tool %s: missing ]] after the arguments", tool)
			}
			var compact bytes.Buffer
			_ = json.Compact(&compact, v)
			return name, tool + " " + compact.String(), r + 2, nil
		}
		closeAt := strings.Index(s[p:], "]]")
		if closeAt < 0 {
			return "", "", 0, fmt.Errorf("sim directive tool %s: missing ]]", tool)
		}
		return name, strings.TrimSpace(tool + " " + strings.TrimSpace(s[p:p+closeAt])), p + closeAt + 2, nil
	}
	closeAt := strings.Index(s[pos:], "]]")
	if closeAt < 0 {
		return "", "", 0, fmt.Errorf("sim directive %s: missing ]]", name)
	}
	return name, strings.TrimSpace(s[pos : pos+closeAt]), pos + closeAt + 2, nil
}

// Directive is one [[sim:...]] directive a prompt may contain: its syntax,
// what it does and a prompt that uses it. Directives lists them all; the
// parser knows no other, and sim --help is written from the list.
type Directive struct {
	Name    string // the word after "sim:"
	Args    string // its arguments' syntax; "" when it takes none
	Doc     string // what it makes the sim do
	Example string // a prompt using it
	apply   func(d *directives, args string) error
}

// Syntax is the directive as a prompt writes it, with its arguments'
// syntax: [[sim:words N]].
func (d Directive) Syntax() string {
	if d.Args == "" {
		return directiveOpen + d.Name + "]]"
	}
	return directiveOpen + d.Name + " " + d.Args + "]]"
}

var directiveTable = []Directive{
	{Name: "tool", Args: "NAME [ARGS]",
		Doc: "call the tool NAME: a function call whose arguments are ARGS, a JSON object (default {}), " +
			"or, for a tool the request offers as \"custom\", a custom tool call whose input is the text ARGS; " +
			"NS.NAME calls function NAME of the namespace tool NS (image_gen.imagegen). " +
			"Repeat it for several calls in one response. The answer to the request that brings the tools' outputs " +
			"is \"Tool results:\" and each output",
		Example: `list the files [[sim:tool exec_command {"cmd":"ls -la"}]]`,
		apply: func(d *directives, args string) error {
			tool, targs, _ := strings.Cut(args, " ")
			d.tools = append(d.tools, toolDirective{name: tool, args: strings.TrimSpace(targs)})
			return nil
		}},
	{Name: "words", Args: "N", Doc: "answer with N words (1 to 1000000) instead of quoting the prompt",
		Example: "write an essay [[sim:words 500]]",
		apply:   countDirective("words", func(d *directives, n int) { d.words = n })},
	{Name: "events", Args: "N", Doc: "stream the answer in N output_text.delta events (1 to 1000000; default a delta per word, at most 16)",
		Example: "[[sim:words 40]] [[sim:events 40]] one word per event",
		apply:   countDirective("events", func(d *directives, n int) { d.events = n })},
	{Name: "delay", Args: "DURATION", Doc: "wait DURATION (a Go duration up to 10m) before the first event",
		Example: "answer slowly [[sim:delay 2s]]",
		apply:   durationDirective("delay", func(d *directives, v time.Duration) { d.delay = v })},
	{Name: "gap", Args: "DURATION", Doc: "wait DURATION (up to 10m) between events",
		Example: "[[sim:words 20]] [[sim:gap 100ms]] a slow stream",
		apply:   durationDirective("gap", func(d *directives, v time.Duration) { d.gap = v })},
	{Name: "seal", Doc: "give this answer's message and tool calls their own encrypted_content, " +
		"as accounts with seal-messages and seal-tool-calls do: ciphertext a relay cannot strip",
		Example: "[[sim:seal]] a sealed answer",
		apply: func(d *directives, args string) error {
			if args != "" {
				return fmt.Errorf("sim directive seal takes no arguments")
			}
			d.seal = true
			return nil
		}},
}

// Directives returns every directive the sim's script knows, in the order
// its help lists them.
func Directives() []Directive { return slices.Clone(directiveTable) }

func countDirective(name string, set func(*directives, int)) func(*directives, string) error {
	return func(d *directives, args string) error {
		n, err := strconv.Atoi(args)
		if err != nil || n < 1 || n > 1_000_000 {
			return fmt.Errorf("sim directive %s: want a count from 1 to 1000000, got %q", name, args)
		}
		set(d, n)
		return nil
	}
}

func durationDirective(name string, set func(*directives, time.Duration)) func(*directives, string) error {
	return func(d *directives, args string) error {
		v, err := time.ParseDuration(args)
		if err != nil || v < 0 || v > 10*time.Minute {
			return fmt.Errorf("sim directive %s: want a duration up to 10m, got %q", name, args)
		}
		set(d, v)
		return nil
	}
}

func (d *directives) apply(name, args string) error {
	for _, dir := range directiveTable {
		if dir.Name == name {
			return dir.apply(d, args)
		}
	}
	return fmt.Errorf("sim directive: unknown directive %q", name)
}

// plannedCall is one tool call the response will make.
type plannedCall struct {
	custom    bool   // a custom (freeform) tool: input instead of JSON arguments
	namespace string // the namespace tool the function is in, or ""
	name      string
	args      string
}

// outputPlan is what a response will contain, decided from the request
// alone (the account adds sealing). It is plain data.
type outputPlan struct {
	prewarm    bool
	compaction bool
	text       string
	calls      []plannedCall
	deltas     int
	delay, gap time.Duration
	seal       bool
}

// planOutput decides the response to req:
//   - generate:false: a prewarm, no output;
//   - input ending in compaction_trigger: one compaction item;
//   - tool outputs (with call ids) after the last user message: a final
//     answer quoting them, so a test can see that the tool ran;
//   - [[sim:tool ...]] directives in the last user message: those calls;
//   - otherwise an answer: [[sim:words N]] words, or a short reply that
//     quotes the prompt.
func planOutput(req *responseRequest) (outputPlan, error) {
	if !req.generates() {
		return outputPlan{prewarm: true}, nil
	}
	if n := len(req.Input); n > 0 && req.Input[n-1].Type == "compaction_trigger" {
		return outputPlan{compaction: true}, nil
	}
	lastUser := -1
	for i := len(req.Input) - 1; i >= 0; i-- {
		if it := req.Input[i]; it.Type == "message" && it.Role == "user" {
			lastUser = i
			break
		}
	}
	var prompt string
	var d directives
	if lastUser >= 0 {
		var err error
		d, prompt, err = parseDirectives(req.Input[lastUser].text())
		if err != nil {
			return outputPlan{}, err
		}
	}
	p := outputPlan{delay: d.delay, gap: d.gap, seal: d.seal}

	var outputs []string
	for _, it := range req.Input[lastUser+1:] {
		if (it.Type == "function_call_output" || it.Type == "custom_tool_call_output") && it.CallID != "" {
			outputs = append(outputs, strings.TrimSpace(it.outputText()))
		}
	}
	switch {
	case len(outputs) > 0:
		var b strings.Builder
		b.WriteString("Tool results:")
		for _, o := range outputs {
			b.WriteString("\n")
			b.WriteString(o)
		}
		p.text = b.String()
	case len(d.tools) > 0:
		for _, td := range d.tools {
			call := plannedCall{name: td.name, args: td.args}
			if ns, fn, ok := strings.Cut(td.name, "."); ok && req.namespaced(ns, fn) {
				call.namespace, call.name = ns, fn
			}
			call.custom = call.namespace == "" && req.toolType(td.name) == "custom"
			if !call.custom {
				if call.args == "" {
					call.args = "{}"
				}
				if !json.Valid([]byte(call.args)) {
					return outputPlan{}, fmt.Errorf("sim directive tool %s: arguments of a function tool must be JSON", td.name)
				}
			}
			p.calls = append(p.calls, call)
		}
		return p, nil
	case d.words > 0:
		p.text = wordsText(d.words)
	default:
		p.text = defaultReply(prompt)
	}
	p.deltas = d.events
	if p.deltas == 0 {
		p.deltas = min(len(strings.Fields(p.text)), 16)
	}
	for utf8.RuneCountInString(p.text) < p.deltas {
		p.text += " sim"
	}
	p.deltas = max(p.deltas, 1)
	return p, nil
}

// toolType returns the type ("function", "custom", ...) under which the
// request offers the named tool, or "" when it does not offer it.
func (r *responseRequest) toolType(name string) string {
	for _, t := range r.Tools {
		if t.Name == name {
			return t.Type
		}
	}
	return ""
}

// namespaced reports whether the request offers function fn inside the
// namespace tool ns: a directive names it "ns.fn" (image_gen.imagegen).
func (r *responseRequest) namespaced(ns, fn string) bool {
	for _, t := range r.Tools {
		if t.Type == "namespace" && t.Name == ns {
			for _, in := range t.Tools {
				if in.Name == fn {
					return true
				}
			}
		}
	}
	return false
}

var vocabulary = strings.Fields(`alpha bravo charlie delta echo foxtrot golf hotel india juliet
	kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu`)

// wordsText returns n words, the same for the same n.
func wordsText(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[i%len(vocabulary)])
	}
	return b.String()
}

// defaultReply is the answer to a plain prompt: stable, and quoting the
// prompt (directives removed) so a test can tell turns apart.
func defaultReply(prompt string) string {
	prompt = strings.Join(strings.Fields(prompt), " ")
	if prompt == "" {
		return "Simulated reply."
	}
	return fmt.Sprintf("Simulated reply to: %s", clip(prompt, 80))
}

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "..."
}

// splitText cuts s into n pieces of about equal rune length, n <= runes.
func splitText(s string, n int) []string {
	r := []rune(s)
	if n <= 1 || len(r) <= 1 {
		return []string{s}
	}
	n = min(n, len(r))
	out := make([]string, 0, n)
	for i := range n {
		lo, hi := i*len(r)/n, (i+1)*len(r)/n
		out = append(out, string(r[lo:hi]))
	}
	return out
}
