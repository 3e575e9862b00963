package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// defaultRelayURL is where the admin commands find the relay.
const defaultRelayURL = "http://127.0.0.1:2455"

// apiClient calls the relay's admin REST API (/api/v1) with a personal
// token or the admin token.
type apiClient struct {
	base  string // the relay's base URL, without a trailing slash
	token string // CODEX_RELAY_API_TOKEN, else CODEX_RELAY_ADMIN_TOKEN; never a flag
	hc    *http.Client
}

// apiError is an error answer of the API; its text is the API's message.
type apiError struct {
	Status  int
	Code    string
	Message string
	Field   string
}

func (e *apiError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("the relay answered HTTP %d", e.Status)
	}
	return e.Message
}

// newAPIClient checks the relay URL and reads the admin token from the
// environment.
// parseVerb parses a verb's flags (interleaved with no positional
// arguments) and returns a client of the admin API at af.url.
func parseVerb(c cli, fs *flag.FlagSet, af *apiFlags, name string, args []string) (*apiClient, error) {
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, fmt.Errorf("%s: unexpected arguments %q", name, pos)
	}
	return newAPIClient(c, af.url)
}

func newAPIClient(c cli, rawURL string) (*apiClient, error) {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-url: want the relay's base URL such as %s, got %q", defaultRelayURL, rawURL)
	}
	// A person's own token first: what they do is audited as them, with
	// their role. The admin token is the break-glass owner's.
	token := strings.TrimSpace(c.getenv("CODEX_RELAY_API_TOKEN"))
	if token == "" {
		token = strings.TrimSpace(c.getenv("CODEX_RELAY_ADMIN_TOKEN"))
	}
	if token == "" {
		return nil, errors.New("CODEX_RELAY_ADMIN_TOKEN is not set, nor CODEX_RELAY_API_TOKEN: export a personal token of yours (crp_…) as CODEX_RELAY_API_TOKEN, or the relay's admin token (printed at its first start, or the one you configured)")
	}
	return &apiClient{base: strings.TrimRight(u.String(), "/"), token: token, hc: &http.Client{Timeout: time.Minute}}, nil
}

// do sends one request to /api/v1{path} with in as its JSON body (nil: no
// body) and decodes a 2xx answer into out (nil: discarded).
func (a *apiClient) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+"/api/v1"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the relay at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return answerError(resp.StatusCode, raw)
	}
	if out == nil || len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: unexpected answer: %w", method, path, err)
	}
	return nil
}

// answerError is the error an answer of status (not 2xx) with body raw
// says: the API's message when it gave one.
func answerError(status int, raw []byte) error {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		return &apiError{Status: status, Code: e.Error.Code, Message: e.Error.Message, Field: e.Error.Field}
	}
	return &apiError{Status: status}
}

// apiFlags are the flags every admin command shares.
type apiFlags struct {
	url string
}

func (f *apiFlags) register(fs *flag.FlagSet, c cli) {
	fs.StringVar(&f.url, "url", envOr(c, "CODEX_RELAY_URL", defaultRelayURL),
		"the relay's base URL (env CODEX_RELAY_URL)")
}

// subcommand is one verb of an admin command (accounts add, keys list, ...).
type subcommand struct {
	args    string // positional arguments, for the usage line
	summary string
	run     func(ctx context.Context, c cli, name string, args []string) error
}

// runSubcommand dispatches args[0] among subs; -h or no verb prints the
// verbs of the command.
func runSubcommand(ctx context.Context, c cli, command, purpose string, subs map[string]subcommand, order []string, args []string) error {
	usage := func() {
		fmt.Fprintf(c.stderr, "Usage: codex-relay %s <verb> [flags]\n\n%s\n\nVerbs:\n", command, purpose)
		for _, n := range order {
			fmt.Fprintf(c.stderr, "  %-16s %s\n", strings.TrimSpace(n+" "+subs[n].args), subs[n].summary)
		}
		fmt.Fprintf(c.stderr, "\nRun 'codex-relay %s <verb> --help' for the flags of one verb.\n", command)
		fmt.Fprint(c.stderr, adminEnvNote)
	}
	if len(args) == 0 {
		usage()
		return fmt.Errorf("%s: missing verb (one of %s)", command, strings.Join(order, ", "))
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage()
		return flag.ErrHelp
	}
	sub, ok := subs[args[0]]
	if !ok {
		usage()
		return fmt.Errorf("%s: unknown verb %q (one of %s)", command, args[0], strings.Join(order, ", "))
	}
	return sub.run(ctx, c, command+" "+args[0], args[1:])
}

// adminEnvNote is the part of every admin command's help about secrets.
const adminEnvNote = `
Environment only (secrets are never flags):
  CODEX_RELAY_API_TOKEN     a personal token (crp_…), sent as Authorization: Bearer;
                            the command acts as its user, with its role
  CODEX_RELAY_ADMIN_TOKEN   the relay's admin token, when CODEX_RELAY_API_TOKEN is unset
`

// newVerbFlagSet returns the flag set of one verb, whose -help shows its
// usage line, purpose, flags and the admin token note.
func newVerbFlagSet(c cli, name, args, purpose string, extraEnv string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		if args != "" {
			args = " " + args
		}
		fmt.Fprintf(c.stderr, "Usage: codex-relay %s [flags]%s\n\n%s\n\nFlags:\n", name, args, purpose)
		fs.PrintDefaults()
		fmt.Fprint(c.stderr, adminEnvNote)
		fmt.Fprint(c.stderr, extraEnv)
	}
	return fs
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments ("pause ID -reason x" as well as "pause -reason x
// ID"), and returns the positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// splitCSV splits a comma-separated flag value, dropping blanks.
func splitCSV(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// printJSON writes v indented.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
