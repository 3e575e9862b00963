package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/codexrelay/codex-relay/internal/sim"
)

const simPurpose = `Run the simulated upstream: the ChatGPT Codex backend (/backend-api/codex/...,
/backend-api/wham/usage), the OpenAI Responses API (/v1/...) and the OAuth token
endpoint (/oauth/token), over HTTP/SSE and WebSocket, for many accounts at once.
Besides responses it serves, per account, the object routes Codex and the
OpenAI SDKs use: images, files (and the ChatGPT upload flow), stored and
background responses, embeddings, audio, memories, realtime (WebSocket and
calls) and the analytics sink; an object lives on the account that made it.
It is what the tests, the demo and the benchmarks talk to instead of OpenAI.

Accounts come from -accounts-file and/or -account flags; with none, three demo
accounts are served. Faults can be installed at start with -fault, and at run
time through the control API under /_sim/ (accounts, faults, records, reset).
The model is scripted by [[sim:...]] directives in the prompt: see "Prompt
script" below.

Account spec keys (comma-separated key=value):
  id, label, kind (chatgpt|openai), token, refresh, account-id, org, email, plan,
  primary, secondary (used percent), usage-per-request, token-ttl,
  revoke-old-token (durations), seal-messages, seal-tool-calls (flags)
  e.g. -account id=alice,kind=chatgpt,org=org-a,token=at-alice,refresh=rt-alice
Fault spec keys:
  kind (usage_limit, sharing_cap, rate_limit, insufficient_quota, unauthorized,
  payment_required, forbidden, server_error, overloaded, cut_stream, stall,
  refuse_websocket, websocket_max_age), account, transport (http|ws), after,
  times, status, events, retry-after, resets-in, max-age, in-stream, prewarm
  e.g. -fault kind=usage_limit,account=alice,after=2

The sim serves until interrupted, then closes every stream and connection.`

// simScriptHelp is the prompt script's part of sim --help, one entry per
// directive the sim's parser knows (sim.Directives).
func simScriptHelp() string {
	var b strings.Builder
	b.WriteString(`Prompt script:
  The model follows [[sim:...]] directives in the text of the request's last
  user message; they are cut out of the prompt before it is answered, and may
  be combined. Without one, a prompt is answered "Simulated reply to: PROMPT",
  the same whatever the account. After its last user message, a request that
  holds tool outputs (function_call_output or custom_tool_call_output with a
  call_id) is answered "Tool results:" and each output, so the tool is seen to
  have run. A request with generate:false (a WebSocket prewarm) gets no output;
  an input ending in {"type":"compaction_trigger"} one compaction item. An
  unknown or malformed directive is answered 400, so a typo fails loudly; to
  make requests fail otherwise, install a fault (-fault, or the control API).
`)
	for _, d := range sim.Directives() {
		fmt.Fprintf(&b, "\n  %s\n", d.Syntax())
		for _, line := range wrapText(d.Doc, 72) {
			fmt.Fprintf(&b, "      %s\n", line)
		}
		fmt.Fprintf(&b, "      e.g. %s\n", d.Example)
	}
	return strings.TrimRight(b.String(), "\n")
}

// wrapText breaks s into lines of at most width bytes, at spaces (a longer
// word gets a line of its own).
func wrapText(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// simOptions is what the sim command was asked to do.
type simOptions struct {
	addr         string
	accountsFile string
	accounts     stringList
	faults       stringList
	cipherSecret string
	models       string
	stateless    bool
	compression  string
}

func runSim(ctx context.Context, c cli, args []string) error {
	var o simOptions
	fs := newFlagSet(c, "sim", simPurpose+"\n\n"+simScriptHelp())
	fs.StringVar(&o.addr, "addr", envOr(c, "CODEX_RELAY_SIM_ADDR", "127.0.0.1:2456"),
		"listen address (env CODEX_RELAY_SIM_ADDR); port 0 picks a free port")
	fs.StringVar(&o.accountsFile, "accounts-file", envOr(c, "CODEX_RELAY_SIM_ACCOUNTS", ""),
		`JSON file with {"accounts":[...],"faults":[...]} or a list of accounts (env CODEX_RELAY_SIM_ACCOUNTS)`)
	fs.Var(&o.accounts, "account", "an account spec; repeatable (keys above)")
	fs.Var(&o.faults, "fault", "a fault installed at start; repeatable (keys above)")
	fs.StringVar(&o.cipherSecret, "cipher-secret", envOr(c, "CODEX_RELAY_SIM_CIPHER_SECRET", ""),
		"secret behind every organisation's ciphertext, to keep it valid across restarts (env CODEX_RELAY_SIM_CIPHER_SECRET); default random")
	fs.StringVar(&o.models, "models", envOr(c, "CODEX_RELAY_SIM_MODELS", ""),
		"comma-separated model slugs the models routes report (env CODEX_RELAY_SIM_MODELS); default gpt-5.5-codex,gpt-5.4,gpt-5.4-mini")
	fs.BoolVar(&o.stateless, "stateless", false, "WebSocket connections keep no response chains: every previous_response_id is not found, as on upstreams that serve each request on its own")
	fs.StringVar(&o.compression, "ws-compression", "pooled", "how WebSocket clients offering permessage-deflate are answered: pooled (no context takeover), takeover (context takeover, as offered) or off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}
	cfg, err := o.config()
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	upstream, stop, err := sim.Listen(cfg, o.addr, slog.New(slog.NewTextHandler(c.stderr, nil)))
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	printSimBanner(c.stdout, upstream)
	<-ctx.Done()
	stop() // closes the sim first: stalled streams and WebSockets end, then the server shuts down
	fmt.Fprintln(c.stdout, "sim: stopped")
	return nil
}

// config turns the options into the sim's configuration.
func (o simOptions) config() (sim.Config, error) {
	var cfg sim.Config
	if o.accountsFile != "" {
		cf, err := sim.LoadConfigFile(o.accountsFile)
		if err != nil {
			return cfg, err
		}
		cfg.Accounts, cfg.Faults = cf.Accounts, cf.Faults
	}
	for _, spec := range o.accounts {
		a, err := sim.ParseAccountSpec(spec)
		if err != nil {
			return cfg, err
		}
		cfg.Accounts = append(cfg.Accounts, a)
	}
	if len(cfg.Accounts) == 0 {
		cfg.Accounts = demoSimAccounts()
	}
	for _, spec := range o.faults {
		f, err := sim.ParseFaultSpec(spec)
		if err != nil {
			return cfg, err
		}
		cfg.Faults = append(cfg.Faults, f)
	}
	if o.cipherSecret != "" {
		cfg.CipherSecret = []byte(o.cipherSecret)
	}
	cfg.Stateless = o.stateless
	cfg.WSCompression = o.compression
	for _, m := range strings.Split(o.models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.Models = append(cfg.Models, m)
		}
	}
	return cfg, nil
}

// demoSimAccounts are served when no account is configured: two ChatGPT
// accounts in different organisations and an API key sharing the first's.
func demoSimAccounts() []sim.Account {
	return []sim.Account{
		{ID: "alice", Label: "Alice (ChatGPT Plus)", Kind: sim.KindChatGPT, Organization: "org-a",
			AccessToken: "sim-at-alice", RefreshToken: "sim-rt-alice", ChatGPTAccountID: "acct-alice"},
		{ID: "bob", Label: "Bob (ChatGPT Pro)", Kind: sim.KindChatGPT, Organization: "org-b", PlanType: "pro",
			AccessToken: "sim-at-bob", RefreshToken: "sim-rt-bob", ChatGPTAccountID: "acct-bob"},
		{ID: "carol", Label: "Carol (API key)", Kind: sim.KindOpenAI, Organization: "org-a",
			AccessToken: "sk-sim-carol"},
	}
}

func printSimBanner(w io.Writer, upstream *sim.Server) {
	fmt.Fprintf(w, "codex-relay sim listening on %s\n", upstream.URL)
	fmt.Fprintf(w, "  ChatGPT Codex backend  %s   (usage %s)\n", upstream.CodexBaseURL(), upstream.UsageURL())
	fmt.Fprintf(w, "  OpenAI Responses API   %s\n", upstream.OpenAIBaseURL())
	fmt.Fprintf(w, "  OAuth token endpoint   %s\n", upstream.TokenURL())
	fmt.Fprintf(w, "  control API            %s/\n", upstream.ControlURL())
	fmt.Fprintln(w, "accounts:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tKIND\tORGANISATION\tACCESS TOKEN\tREFRESH TOKEN\tCHATGPT-ACCOUNT-ID\tLABEL")
	for _, st := range upstream.Accounts() {
		a := st.Account
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Organization, a.AccessToken,
			orDash(a.RefreshToken), orDash(a.ChatGPTAccountID), a.Label)
	}
	_ = tw.Flush()
	if faults := upstream.Faults(); len(faults) > 0 {
		fmt.Fprintln(w, "faults:")
		for _, f := range faults {
			fmt.Fprintf(w, "  #%d %s account=%s after=%d times=%d\n", f.ID, f.Kind, orDash(f.Account), f.After, f.Times)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
