package deploy

import (
	"fmt"
	"os"
	"strings"
	"unicode"
)

// directive is one nginx configuration directive and its block, if any.
type directive struct {
	name  string
	args  []string
	block []directive
	line  int
}

// parseNginx parses nginx's configuration syntax: directives with arguments
// ending in ";" or a "{ ... }" block, "#" comments, quoted arguments.
func parseNginx(path string) ([]directive, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type token struct {
		s    string
		line int
	}
	var toks []token
	line := 1
	src := []rune(string(b))
	for i := 0; i < len(src); i++ {
		r := src[i]
		switch {
		case r == '\n':
			line++
		case unicode.IsSpace(r):
		case r == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			i--
		case r == ';' || r == '{' || r == '}':
			toks = append(toks, token{string(r), line})
		case r == '\'' || r == '"':
			j := i + 1
			for j < len(src) && src[j] != r {
				j++
			}
			if j == len(src) {
				return nil, fmt.Errorf("line %d: unterminated quote", line)
			}
			toks = append(toks, token{"\x00" + string(src[i+1:j]), line})
			i = j
		default:
			j := i
			for j < len(src) && !unicode.IsSpace(src[j]) && !strings.ContainsRune(";{}#", src[j]) {
				j++
			}
			toks = append(toks, token{string(src[i:j]), line})
			i = j - 1
		}
	}
	var parse func(depth int) ([]directive, error)
	pos := 0
	parse = func(depth int) ([]directive, error) {
		var out []directive
		for pos < len(toks) {
			t := toks[pos]
			if t.s == "}" {
				if depth == 0 {
					return nil, fmt.Errorf("line %d: unexpected }", t.line)
				}
				pos++
				return out, nil
			}
			d := directive{name: t.s, line: t.line}
			pos++
			for {
				if pos >= len(toks) {
					return nil, fmt.Errorf("line %d: %s does not end", d.line, d.name)
				}
				a := toks[pos]
				pos++
				if a.s == ";" {
					break
				}
				if a.s == "{" {
					blk, err := parse(depth + 1)
					if err != nil {
						return nil, err
					}
					d.block = blk
					break
				}
				d.args = append(d.args, strings.TrimPrefix(a.s, "\x00"))
			}
			out = append(out, d)
		}
		if depth > 0 {
			return nil, fmt.Errorf("a block does not end")
		}
		return out, nil
	}
	return parse(0)
}

// find returns the directives named name among ds.
func find(ds []directive, name string) []directive {
	var out []directive
	for _, d := range ds {
		if d.name == name {
			out = append(out, d)
		}
	}
	return out
}

// one returns the single directive named name among ds, with whether there
// was exactly one.
func one(ds []directive, name string) (directive, bool) {
	f := find(ds, name)
	if len(f) != 1 {
		return directive{}, false
	}
	return f[0], true
}
