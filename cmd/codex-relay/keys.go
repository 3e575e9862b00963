package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/codexrelay/codex-relay/internal/codexauth"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web"
)

const keysPurpose = `Manage client keys: the keys Codex sends to the relay (Authorization: Bearer
crk_...). Each key may be limited to some accounts (a list, or a tag), to some
models, and to a lifetime. A revoked or expired key is refused at once.`

var keyVerbs = []string{"create", "list", "limits", "revoke", "codex-auth"}

func runKeys(ctx context.Context, c cli, args []string) error {
	return runSubcommand(ctx, c, "keys", keysPurpose, map[string]subcommand{
		"create": {"", "create a key; it is shown once", runKeysCreate},
		"list":   {"", "list keys with scope, expiry and use", runKeysList},
		"limits": {"ID|NAME", "show a key's limits with their use, or set them", runKeysLimits},
		"revoke": {"ID|NAME", "revoke a key at once", runKeysRevoke},
		"codex-auth": {"", "print the auth.json that signs Codex in \"with ChatGPT\" through the relay with a key",
			runKeysCodexAuth},
	}, keyVerbs, args)
}

// limitsSpec is how the command line writes a key's limits: comma-separated
// METRIC/WINDOW=MAX, or concurrent=MAX.
const limitsSpec = `comma-separated limits METRIC/WINDOW=MAX (metric requests, tokens or cost_usd; window minute, 5h, day, week or month) or concurrent=MAX, e.g. "tokens/5h=2000000,cost_usd/month=50,concurrent=2"`

// parseLimits reads a limits spec (see limitsSpec) as the console reads
// its limits box, one limit per comma; the API validates what it says.
func parseLimits(spec string) ([]web.LimitForm, error) {
	return web.ParseLimitLines(strings.ReplaceAll(spec, ",", "\n"))
}

const keysLimitsPurpose = `Show a client key's limits: each with its use in its window now, what requests
in flight reserve, and when it resets. With -set, replace them; with -clear,
remove them (the key is then unlimited). A key at a limit is refused with 429
usage_limit_reached and the reset time, which Codex shows as "try again at".`

func runKeysLimits(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var set string
	var clear, asJSON bool
	fs := newVerbFlagSet(c, name, "ID|NAME", keysLimitsPurpose+"\n\n"+keyRef.help(), "")
	af.register(fs, c)
	fs.StringVar(&set, "set", "", "replace the key's limits: "+limitsSpec)
	fs.BoolVar(&clear, "clear", false, "remove every limit of the key")
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("%s: give exactly one key ID or name", name)
	}
	if set != "" && clear {
		return fmt.Errorf("%s: give -set or -clear, not both", name)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	id, err := api.resolveOne(ctx, keyRef, mustExist, pos[0])
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	path := "/keys/" + url.PathEscape(id)
	var raw json.RawMessage
	switch {
	case set != "" || clear:
		limits := []web.LimitForm{}
		if set != "" {
			if limits, err = parseLimits(set); err != nil {
				return fmt.Errorf("%s: -set: %w", name, err)
			}
		}
		err = api.do(ctx, http.MethodPatch, path, web.KeyPatch{Limits: &limits}, &raw)
	default:
		err = api.do(ctx, http.MethodGet, path, nil, &raw)
	}
	if err != nil {
		return err
	}
	var k apiKey
	if err := json.Unmarshal(raw, &k); err != nil {
		return fmt.Errorf("%s: unexpected answer: %w", name, err)
	}
	warnKey(c, k)
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	if len(k.Limits) == 0 {
		fmt.Fprintf(c.stdout, "Key %s (%s) has no limits. Set some with 'codex-relay keys limits %s -set \"tokens/5h=2000000\"'.\n", k.ID, k.Name, k.ID)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tUSED\tMAX\tIN FLIGHT\tUSE\tRESETS")
	for _, l := range k.Limits {
		limit := l.Metric
		if l.Window != "" {
			limit += "/" + l.Window
		}
		use := "-"
		if l.Max > 0 {
			use = strconv.FormatFloat(100*(l.Used+l.Reserved)/l.Max, 'f', 1, 64) + "%"
		}
		resets := "-"
		if l.ResetsAt != nil {
			resets = time.Unix(*l.ResetsAt, 0).Local().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", limit, formatFigure(l.Used), formatFigure(l.Max), formatFigure(l.Reserved), use, resets)
	}
	return tw.Flush()
}

// formatFigure prints a limit's figure: whole numbers as such, dollars to
// the cent or finer.
func formatFigure(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// The admin API's own types for client keys.
type (
	apiKey   = web.KeyView
	keyInput = web.KeyForm
)

const keysCreatePurpose = `Create a client key for Codex. The key is printed once, with the Codex
configuration that uses it; the relay keeps only its hash.`

func runKeysCreate(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var in keyInput
	var accounts, models string
	var expiresIn time.Duration
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", keysCreatePurpose, "")
	af.register(fs, c)
	fs.StringVar(&in.Name, "name", "", "who or what uses the key (required)")
	fs.StringVar(&accounts, "accounts", "", "comma-separated accounts (ids or labels) the key may use (default: every account)")
	fs.StringVar(&in.AccountTag, "tag", "", "the key may use the accounts with this tag")
	fs.StringVar(&models, "models", "", "comma-separated models the key may ask for (default: any)")
	fs.DurationVar(&expiresIn, "expires-in", 0, "lifetime, e.g. 720h (default: no expiry)")
	var limits string
	fs.StringVar(&limits, "limits", "", "the key's limits (default: none): "+limitsSpec)
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON (with the key) instead of text")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", name, pos)
	}
	if strings.TrimSpace(in.Name) == "" {
		fs.Usage()
		return fmt.Errorf("%s: -name is required", name)
	}
	if expiresIn < 0 {
		return fmt.Errorf("%s: -expires-in must be positive", name)
	}
	if expiresIn > 0 {
		in.ExpiresIn = expiresIn.String()
	}
	in.Models = splitCSV(models)
	if limits != "" {
		if in.Limits, err = parseLimits(limits); err != nil {
			return fmt.Errorf("%s: -limits: %w", name, err)
		}
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	if in.AccountIDs, err = api.resolve(ctx, accountRef, mustExist, splitCSV(accounts)...); err != nil {
		return fmt.Errorf("%s: -accounts: %w", name, err)
	}
	var raw json.RawMessage
	if err := api.do(ctx, http.MethodPost, "/keys", in, &raw); err != nil {
		return err
	}
	var k apiKey
	if err := json.Unmarshal(raw, &k); err != nil {
		return err
	}
	warnKey(c, k)
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	fmt.Fprintf(c.stdout, "Created client key %s (%s), scope: %s.\n", k.ID, k.Name, keyScope(k))
	fmt.Fprintf(c.stdout, `
The key, shown once (the relay keeps only its hash):

  export CODEX_RELAY_KEY=%s

Put this in $CODEX_HOME/config.toml (CODEX_HOME=~/.codex by default):

%s`, k.Key, web.CodexConfig(api.base))
	return nil
}

// warnKey prints the API's warnings about a key to stderr, where they reach
// the operator whatever stdout is piped to.
func warnKey(c cli, k apiKey) {
	for _, w := range k.Warnings {
		fmt.Fprintf(c.stderr, "warning: key %s (%s): %s\n", k.ID, k.Name, w)
	}
}

// listKeys returns the client keys, decoded and as the API wrote them.
func listKeys(ctx context.Context, api *apiClient) ([]apiKey, []json.RawMessage, error) {
	var out struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := api.do(ctx, http.MethodGet, "/keys", nil, &out); err != nil {
		return nil, nil, err
	}
	keys := make([]apiKey, len(out.Keys))
	for i, raw := range out.Keys {
		if err := json.Unmarshal(raw, &keys[i]); err != nil {
			return nil, nil, fmt.Errorf("list keys: unexpected answer: %w", err)
		}
	}
	if out.Keys == nil {
		out.Keys = []json.RawMessage{}
	}
	return keys, out.Keys, nil
}

// keyScope describes what a key may use.
func keyScope(k apiKey) string {
	var parts []string
	switch {
	case len(k.AccountIDs) > 0:
		parts = append(parts, "accounts "+strings.Join(k.AccountIDs, ","))
	case k.AccountTag != "":
		parts = append(parts, "accounts tagged "+k.AccountTag)
	default:
		parts = append(parts, "all accounts")
	}
	if len(k.Models) > 0 {
		parts = append(parts, "models "+strings.Join(k.Models, ","))
	}
	if k.ExpiresAt != nil {
		parts = append(parts, "expires "+k.ExpiresAt.Local().Format("2006-01-02 15:04"))
	}
	return strings.Join(parts, ", ")
}

func runKeysList(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", "List client keys (never their secrets): scope, expiry, use, revocation.", "")
	af.register(fs, c)
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	api, err := parseVerb(c, fs, &af, name, args)
	if err != nil {
		return err
	}
	keys, raw, err := listKeys(ctx, api)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	if len(keys) == 0 {
		fmt.Fprintln(c.stdout, "No client keys. Create one with 'codex-relay keys create -name NAME'.")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tSCOPE\tMODELS\tEXPIRES\tREQUESTS\tLAST USED\tSTATE")
	for _, k := range keys {
		scope := "all"
		switch {
		case len(k.AccountIDs) > 0:
			scope = strings.Join(k.AccountIDs, ",")
		case k.AccountTag != "":
			scope = "tag:" + k.AccountTag
		}
		state := "active"
		switch {
		case k.RevokedAt != nil:
			state = "revoked"
		case k.ExpiresAt != nil && !k.ExpiresAt.After(time.Now()):
			state = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s…\t%s\t%s\t%s\t%d\t%s\t%s\n", k.ID, clipText(k.Name, 30), k.Prefix, clipText(scope, 40),
			dash(strings.Join(k.Models, ",")), when(k.ExpiresAt), k.RequestCount, when(k.LastUsedAt), state)
	}
	return tw.Flush()
}

func runKeysRevoke(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	fs := newVerbFlagSet(c, name, "ID|NAME", "Revoke a client key: requests with it are refused at once.\n\n"+keyRef.help(), "")
	af.register(fs, c)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("%s: give exactly one key ID or name", name)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	id, err := api.resolveOne(ctx, keyRef, mustExist, pos[0])
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	var k apiKey
	if err := api.do(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, &k); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "revoked %s (%s)\n", k.ID, k.Name)
	return nil
}

const keysCodexAuthPurpose = `Print the auth.json (for ~/.codex/auth.json) that signs Codex in "with
ChatGPT" where its ChatGPT is the relay: the access token is the client key in
CODEX_RELAY_KEY, the ID token an unsigned one Codex only reads. With it, and the
README's ChatGPT sign-in block in config.toml (requires_openai_auth, the relay's
chatgpt_base_url over HTTPS), Codex offers its image tool and its /status card
shows the key's limits. Nothing is sent anywhere: the command only writes.`

func runKeysCodexAuth(_ context.Context, c cli, name string, args []string) error {
	// Not an admin API verb: no -url, no admin token.
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "Usage: codex-relay %s\n\n%s\n\nEnvironment:\n  CODEX_RELAY_KEY   the client key (crk_...) Codex is to send\n",
			name, keysCodexAuthPurpose)
	}
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	key := strings.TrimSpace(c.getenv("CODEX_RELAY_KEY"))
	if !strings.HasPrefix(key, store.ClientKeyPrefix) {
		return fmt.Errorf("%s: set CODEX_RELAY_KEY to the client key (%s...) Codex is to send", name, store.ClientKeyPrefix)
	}
	out, err := codexauth.AuthJSON(key, time.Now())
	if err != nil {
		return err
	}
	_, err = c.stdout.Write(out)
	return err
}
