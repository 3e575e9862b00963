package sim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDirectives(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		in       string
		want     directives
		wantRest string
		wantErr  string
	}{
		{name: "none", in: "just text", wantRest: "just text"},
		{name: "tool with JSON", in: `do [[sim:tool exec_command {"cmd": "echo hi"}]] now`,
			want: directives{tools: []toolDirective{{"exec_command", `{"cmd":"echo hi"}`}}}, wantRest: "do  now"},
		{name: "JSON may hold ]]", in: `[[sim:tool exec_command {"cmd":"echo [[x]]"} ]]`,
			want: directives{tools: []toolDirective{{"exec_command", `{"cmd":"echo [[x]]"}`}}}},
		{name: "raw tool input", in: "[[sim:tool apply_patch *** Begin Patch ]]",
			want: directives{tools: []toolDirective{{"apply_patch", "*** Begin Patch"}}}},
		{name: "tool without arguments", in: "[[sim:tool list_dir]]", want: directives{tools: []toolDirective{{"list_dir", ""}}}},
		{name: "several", in: "[[sim:words 12]][[sim:events 3]] [[sim:delay 200ms]] [[sim:gap 10ms]] [[sim:seal]]",
			want: directives{words: 12, events: 3, delay: 200 * time.Millisecond, gap: 10 * time.Millisecond, seal: true}, wantRest: "   "},
		{name: "tools repeat", in: `[[sim:tool a {}]][[sim:tool b {"x":1}]]`,
			want: directives{tools: []toolDirective{{"a", "{}"}, {"b", `{"x":1}`}}}},
		{name: "unknown", in: "[[sim:explode]]", wantErr: "unknown directive"},
		{name: "bad count", in: "[[sim:words many]]", wantErr: "want a count"},
		{name: "zero count", in: "[[sim:events 0]]", wantErr: "want a count"},
		{name: "bad duration", in: "[[sim:delay soon]]", wantErr: "want a duration"},
		{name: "unclosed", in: "[[sim:words 3", wantErr: "missing ]]"},
		{name: "broken JSON", in: `[[sim:tool x {"a":]]`, wantErr: "not JSON"},
		{name: "JSON then junk", in: `[[sim:tool x {"a":1} junk]]`, wantErr: "missing ]]"},
		{name: "empty name", in: "[[sim: ]]", wantErr: "missing name"},
		{name: "seal takes nothing", in: "[[sim:seal yes]]", wantErr: "no arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, rest, err := parseDirectives(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantRest, rest)
		})
	}
}

// req builds a request from JSON input items and tools.
func req(t *testing.T, generate *bool, items ...string) *responseRequest {
	t.Helper()
	b := `{"model":"m","tools":[{"type":"function","name":"exec_command"},{"type":"custom","name":"apply_patch"},` +
		`{"type":"namespace","name":"image_gen","tools":[{"type":"function","name":"imagegen"}]}],"input":[` +
		strings.Join(items, ",") + `]}`
	r, err := parseResponseRequest([]byte(b))
	require.NoError(t, err)
	r.Generate = generate
	return r
}

func user(text string) string {
	b, _ := json.Marshal(text)
	return `{"type":"message","role":"user","content":[{"type":"input_text","text":` + string(b) + `}]}`
}

func TestPlanOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		req     *responseRequest
		check   func(t *testing.T, p outputPlan)
		wantErr bool
	}{
		{"prewarm", req(t, new(false), user("[[sim:words 3]]")), func(t *testing.T, p outputPlan) {
			assert.True(t, p.prewarm)
			assert.Empty(t, p.text)
		}, false},
		{"compaction trigger last", req(t, nil, user("x"), `{"type":"compaction_trigger"}`), func(t *testing.T, p outputPlan) {
			assert.True(t, p.compaction)
		}, false},
		{"plain", req(t, nil, user("first"), `{"type":"message","role":"assistant","content":[]}`, user("  what   now? ")), func(t *testing.T, p outputPlan) {
			assert.Equal(t, "Simulated reply to: what now?", p.text)
			assert.Equal(t, 5, p.deltas, "a delta per word")
		}, false},
		{"no user message", req(t, nil), func(t *testing.T, p outputPlan) {
			assert.Equal(t, "Simulated reply.", p.text)
		}, false},
		{"long prompt is clipped", req(t, nil, user(strings.Repeat("y", 200))), func(t *testing.T, p outputPlan) {
			assert.Equal(t, "Simulated reply to: "+strings.Repeat("y", 80)+"...", p.text)
		}, false},
		{"words and events", req(t, nil, user("[[sim:words 30]][[sim:events 100]]")), func(t *testing.T, p outputPlan) {
			assert.Equal(t, 100, p.deltas)
			assert.GreaterOrEqual(t, len([]rune(p.text)), 100, "lengthened to have a character per event")
			assert.True(t, strings.HasPrefix(p.text, wordsText(30)))
		}, false},
		{"function and custom tools", req(t, nil, user(`[[sim:tool exec_command {"cmd":"ls"}]][[sim:tool apply_patch x]][[sim:tool unknown_tool]]`)),
			func(t *testing.T, p outputPlan) {
				assert.Equal(t, []plannedCall{{name: "exec_command", args: `{"cmd":"ls"}`}, {custom: true, name: "apply_patch", args: "x"},
					{name: "unknown_tool", args: "{}"}}, p.calls)
				assert.Empty(t, p.text)
			}, false},
		{"a function in a namespace tool", req(t, nil, user(`[[sim:tool image_gen.imagegen {"prompt":"a cat"}]][[sim:tool image_gen.other]][[sim:tool nope.imagegen]]`)),
			func(t *testing.T, p outputPlan) {
				assert.Equal(t, []plannedCall{{namespace: "image_gen", name: "imagegen", args: `{"prompt":"a cat"}`},
					{name: "image_gen.other", args: "{}"}, {name: "nope.imagegen", args: "{}"}}, p.calls,
					"only a function the namespace holds is called in it; anything else is called by its plain name")
			}, false},
		{"function tool needs JSON", req(t, nil, user(`[[sim:tool exec_command ls -la]]`)), nil, true},
		{"tool outputs after the last user message", req(t, nil, user(`[[sim:tool exec_command {}]]`),
			`{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{}"}`,
			`{"type":"function_call_output","call_id":"c1","output":"  result one \n"}`),
			func(t *testing.T, p outputPlan) {
				assert.Empty(t, p.calls, "the follow-up answers, it does not call again")
				assert.Equal(t, "Tool results:\nresult one", p.text)
			}, false},
		{"an image in a tool output", req(t, nil, user(`[[sim:tool image_gen.imagegen {}]]`),
			`{"type":"function_call","call_id":"c1","namespace":"image_gen","name":"imagegen","arguments":"{}"}`,
			`{"type":"function_call_output","call_id":"c1","output":[{"type":"input_image","image_url":"data:image/png;base64,AA=="},{"type":"input_text","text":"saved"}]}`),
			func(t *testing.T, p outputPlan) {
				assert.Equal(t, "Tool results:\nsaved\n[input_image]", p.text)
			}, false},
		{"outputs before the last user message are history", req(t, nil,
			`{"type":"function_call_output","call_id":"c1","output":"old"}`, user("new question")),
			func(t *testing.T, p outputPlan) {
				assert.Equal(t, "Simulated reply to: new question", p.text)
			}, false},
		{"bad directive", req(t, nil, user("[[sim:nope]]")), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := planOutput(tt.req)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			tt.check(t, p)
		})
	}
}

func TestSplitText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    string
		n    int
		want []string
	}{
		{"abcdef", 3, []string{"ab", "cd", "ef"}},
		{"abcdefg", 3, []string{"ab", "cd", "efg"}},
		{"héllo", 5, []string{"h", "é", "l", "l", "o"}},
		{"ab", 5, []string{"a", "b"}},
		{"abc", 1, []string{"abc"}},
		{"", 3, []string{""}},
	} {
		got := splitText(tt.s, tt.n)
		assert.Equal(t, tt.want, got)
		assert.Equal(t, tt.s, strings.Join(got, ""))
	}
}

func FuzzParseDirectives(f *testing.F) {
	for _, s := range []string{`[[sim:tool a {"x":"]]"}]]`, "[[sim:words 3]]", "[[sim:", "[[sim:tool", "[[sim:tool a {", "x [[sim:gap 1ms]] y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, rest, err := parseDirectives(s)
		if err != nil {
			return
		}
		if strings.Contains(rest, directiveOpen) {
			t.Fatalf("directive left in %q", rest)
		}
		for _, tool := range d.tools {
			if tool.name == "" {
				t.Fatalf("tool without name from %q", s)
			}
		}
	})
}

// Each directive of the table has its syntax, what it does and an example
// that the parser reads, and that uses it.
func TestDirectiveExamples(t *testing.T) {
	t.Parallel()
	require.NotEmpty(t, Directives())
	for _, d := range Directives() {
		assert.NotEmpty(t, d.Doc, d.Name)
		assert.True(t, strings.HasPrefix(d.Syntax(), "[[sim:"+d.Name), d.Name)
		assert.Contains(t, d.Example, "[[sim:"+d.Name, "the example of %s uses it", d.Name)
		got, _, err := parseDirectives(d.Example)
		require.NoError(t, err, "example of %s: %s", d.Name, d.Example)
		assert.NotEqual(t, directives{}, got, d.Name)
	}
	_, _, err := parseDirectives("[[sim:explode]]")
	assert.ErrorContains(t, err, "unknown directive", "the parser knows only the table's")
}
