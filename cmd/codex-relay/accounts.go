package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/codexrelay/codex-relay/internal/oauth"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web"
)

const accountsPurpose = `Manage the relay's upstream accounts through its admin API: ChatGPT logins
(from a Codex auth.json, or by the device-code login), OpenAI API keys and
other Responses-compatible providers.`

var accountVerbs = []string{"add", "import", "login", "list", "pause", "resume", "remove"}

func runAccounts(ctx context.Context, c cli, args []string) error {
	return runSubcommand(ctx, c, "accounts", accountsPurpose, map[string]subcommand{
		"add":    {"", "add one account (API key, or ChatGPT tokens from the environment)", runAccountsAdd},
		"import": {"FILE...", "import Codex auth.json files: one account per ChatGPT workspace", runAccountsImport},
		"login":  {"", "sign in with ChatGPT by device code and add the account", runAccountsLogin},
		"list":   {"", "list accounts with status, reset times and usage", runAccountsList},
		"pause":  {"ID|LABEL", "take an account out of service", runAccountsPause},
		"resume": {"ID|LABEL", "put a paused (or limited) account back into service", runAccountsResume},
		"remove": {"ID|LABEL", "delete an account and its bindings", runAccountsRemove},
	}, accountVerbs, args)
}

// The admin API's own types: what the CLI sends and reads cannot drift from
// what the API serves.
type (
	apiAccount   = web.AccountView
	apiWindow    = web.WindowView
	accountInput = web.AccountForm
)

func ptr[T any](v T) *T { return &v }

// optional returns a pointer to s, or nil when s is blank.
func optional(s string) *string {
	if s = strings.TrimSpace(s); s == "" {
		return nil
	}
	return &s
}

func listAccounts(ctx context.Context, api *apiClient) ([]apiAccount, []json.RawMessage, error) {
	var out struct {
		Accounts []json.RawMessage `json:"accounts"`
	}
	if err := api.do(ctx, http.MethodGet, "/accounts", nil, &out); err != nil {
		return nil, nil, err
	}
	accts := make([]apiAccount, len(out.Accounts))
	for i, raw := range out.Accounts {
		if err := json.Unmarshal(raw, &accts[i]); err != nil {
			return nil, nil, fmt.Errorf("list accounts: unexpected answer: %w", err)
		}
	}
	if out.Accounts == nil {
		out.Accounts = []json.RawMessage{}
	}
	return accts, out.Accounts, nil
}

// placement is where new accounts go: the settings of add, import and
// login shared by flags.
type placement struct {
	baseURL        string
	organization   string
	tags           string
	priority       int
	maxConcurrency int
	proxyURL       string
	update         bool
}

func (p *placement) register(fs *flag.FlagSet, c cli, withUpdate bool) {
	fs.StringVar(&p.baseURL, "base-url", "", "upstream base URL of the accounts (default: the kind's public URL)")
	fs.StringVar(&p.organization, "org", "", "organisation that issues the accounts' ciphertext (default: from the id token)")
	fs.StringVar(&p.tags, "tags", "", "comma-separated tags (client keys can be scoped to a tag)")
	fs.IntVar(&p.priority, "priority", 0, "priority, -1000..1000: higher is preferred")
	fs.IntVar(&p.maxConcurrency, "max-concurrency", 0, "requests in flight at most per account (0: no cap)")
	fs.StringVar(&p.proxyURL, "proxy-url", envOr(c, "CODEX_RELAY_ACCOUNT_PROXY_URL", ""), "outbound proxy of the accounts, http://, https:// or socks5://[user:password@]host:port: everything the relay sends for them goes through it (login: the sign-in too). The environment's CODEX_RELAY_ACCOUNT_PROXY_URL keeps a password off the command line")
	// The default shown by -help and flag errors comes from the
	// environment: never with its password.
	if fl := fs.Lookup("proxy-url"); fl.DefValue != "" {
		fl.DefValue = "$CODEX_RELAY_ACCOUNT_PROXY_URL"
	}
	if withUpdate {
		fs.BoolVar(&p.update, "update", false, "replace the tokens of accounts that already exist (and resume those needing a new login) instead of skipping them")
	}
}

func (p placement) apply(in *accountInput) {
	in.BaseURL = optional(p.baseURL)
	if o := optional(p.organization); o != nil {
		in.Organization = o
	}
	if tags := splitCSV(p.tags); len(tags) > 0 {
		in.Tags = &tags
	}
	if p.priority != 0 {
		in.Priority = ptr(p.priority)
	}
	if p.maxConcurrency != 0 {
		in.MaxConcurrency = ptr(p.maxConcurrency)
	}
	in.ProxyURL = optional(p.proxyURL)
}

// addImported adds the accounts an import or a login produced. An account
// matching an existing one (a ChatGPT workspace by its account id, never by
// email; an API key by its fingerprint label) is skipped, or with update
// has its tokens replaced. It reports what it did on w.
func addImported(ctx context.Context, api *apiClient, w io.Writer, imported []oauth.ImportedAccount, p placement) error {
	existing, _, err := listAccounts(ctx, api)
	if err != nil {
		return err
	}
	byKey := map[string]apiAccount{}
	for _, a := range existing {
		switch {
		case a.Kind == string(store.KindChatGPT) && a.AccountID != "":
			byKey["chatgpt:"+a.AccountID] = a
		case a.Kind == string(store.KindOpenAI):
			if fp, ok := strings.CutPrefix(a.Label, "openai key "); ok {
				byKey["openai:"+fp] = a
			}
		}
	}
	var added, skipped, updated int
	var errs []error
	for _, im := range imported {
		name := im.Label()
		if cur, ok := byKey[im.Key()]; ok {
			if !p.update {
				skipped++
				fmt.Fprintf(w, "skipped %s: already account %s (%s)\n", name, cur.ID, cur.Label)
				continue
			}
			if err := updateImported(ctx, api, cur, im, p); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			updated++
			fmt.Fprintf(w, "updated %s: new tokens for account %s\n", name, cur.ID)
			continue
		}
		in := accountInput{Label: ptr(name), Kind: ptr(string(im.Kind))}
		if im.Kind == store.KindChatGPT {
			c := im.Credentials
			in.AccessToken, in.RefreshToken, in.IDToken = optional(c.AccessToken), optional(c.RefreshToken), optional(c.IDToken)
			in.AccountID, in.Email, in.PlanType = ptr(im.ChatGPTAccountID), optional(im.Email), optional(im.PlanType)
			in.Organization = optional(im.Organization)
		} else {
			in.APIKey = ptr(im.Credentials.APIKey)
		}
		p.apply(&in)
		var created apiAccount
		if err := api.do(ctx, http.MethodPost, "/accounts", in, &created); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		byKey[im.Key()] = created
		added++
		fmt.Fprintf(w, "added %s as account %s\n", name, created.ID)
	}
	fmt.Fprintf(w, "%d added, %d updated, %d skipped\n", added, updated, skipped)
	return errors.Join(errs...)
}

// updateImported replaces an existing account's tokens (and identity) with
// a newer login's, and its proxy when one is given, and resumes it when it
// was waiting for a new login.
func updateImported(ctx context.Context, api *apiClient, cur apiAccount, im oauth.ImportedAccount, p placement) error {
	in := accountInput{ProxyURL: optional(p.proxyURL)}
	if im.Kind == store.KindChatGPT {
		c := im.Credentials
		in.AccessToken, in.RefreshToken, in.IDToken = ptr(c.AccessToken), ptr(c.RefreshToken), ptr(c.IDToken)
		in.Email, in.PlanType = optional(im.Email), optional(im.PlanType)
	} else {
		in.APIKey = ptr(im.Credentials.APIKey)
	}
	if err := api.do(ctx, http.MethodPatch, "/accounts/"+url.PathEscape(cur.ID), in, nil); err != nil {
		return err
	}
	if cur.Status == string(store.StatusReauthRequired) {
		return api.do(ctx, http.MethodPost, "/accounts/"+url.PathEscape(cur.ID)+"/resume", nil, nil)
	}
	return nil
}

const accountsAddPurpose = `Add one account. For an API key (kind openai or compatible) the key comes from
CODEX_RELAY_ACCOUNT_API_KEY or from -api-key-file (a file, or - for standard
input). For a ChatGPT account (kind chatgpt) the tokens come from
CODEX_RELAY_ACCOUNT_ACCESS_TOKEN, CODEX_RELAY_ACCOUNT_REFRESH_TOKEN and
CODEX_RELAY_ACCOUNT_ID_TOKEN; the workspace, email and plan are read from the
tokens unless -account-id is given. To add a Codex login, prefer
'accounts import' (auth.json) or 'accounts login' (device code).`

const accountsAddEnv = `  CODEX_RELAY_ACCOUNT_API_KEY         the API key of an openai or compatible account
  CODEX_RELAY_ACCOUNT_ACCESS_TOKEN    ChatGPT tokens of a chatgpt account
  CODEX_RELAY_ACCOUNT_REFRESH_TOKEN
  CODEX_RELAY_ACCOUNT_ID_TOKEN
`

func runAccountsAdd(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var p placement
	var kind, label, accountID, keyFile string
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", accountsAddPurpose, accountsAddEnv)
	af.register(fs, c)
	p.register(fs, c, false)
	fs.StringVar(&kind, "kind", "openai", "account kind: openai, compatible or chatgpt")
	fs.StringVar(&label, "label", "", "a human name for the account")
	fs.StringVar(&accountID, "account-id", "", "chatgpt: the ChatGPT-Account-Id (default: from the tokens)")
	fs.StringVar(&keyFile, "api-key-file", "", "read the API key from this file (- for standard input) instead of CODEX_RELAY_ACCOUNT_API_KEY")
	fs.BoolVar(&asJSON, "json", false, "print the new account as JSON")
	api, err := parseVerb(c, fs, &af, name, args)
	if err != nil {
		return err
	}
	in := accountInput{Kind: ptr(kind), Label: optional(label)}
	switch store.Kind(kind) {
	case store.KindChatGPT:
		env := func(k string) string { return strings.TrimSpace(c.getenv(k)) }
		im, err := oauth.AccountFromTokens(env("CODEX_RELAY_ACCOUNT_ID_TOKEN"), env("CODEX_RELAY_ACCOUNT_ACCESS_TOKEN"),
			env("CODEX_RELAY_ACCOUNT_REFRESH_TOKEN"), accountID)
		if err != nil {
			return fmt.Errorf("%s: %w (set CODEX_RELAY_ACCOUNT_ACCESS_TOKEN and _REFRESH_TOKEN, and -account-id or _ID_TOKEN)", name, err)
		}
		existing, _, err := listAccounts(ctx, api)
		if err != nil {
			return err
		}
		for _, a := range existing {
			if a.Kind == string(store.KindChatGPT) && a.AccountID == im.ChatGPTAccountID {
				return fmt.Errorf("%s: workspace %s is already account %s (%s); use 'accounts import -update' to replace its tokens", name, im.ChatGPTAccountID, a.ID, a.Label)
			}
		}
		cr := im.Credentials
		in.AccessToken, in.RefreshToken, in.IDToken = optional(cr.AccessToken), optional(cr.RefreshToken), optional(cr.IDToken)
		in.AccountID, in.Email, in.PlanType, in.Organization = ptr(im.ChatGPTAccountID), optional(im.Email), optional(im.PlanType), optional(im.Organization)
		if in.Label == nil {
			in.Label = ptr(im.Label())
		}
	case store.KindOpenAI, store.KindCompatible:
		key := strings.TrimSpace(c.getenv("CODEX_RELAY_ACCOUNT_API_KEY"))
		if keyFile != "" {
			var b []byte
			if keyFile == "-" {
				b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
			} else {
				b, err = os.ReadFile(keyFile)
			}
			if err != nil {
				return fmt.Errorf("%s: -api-key-file: %w", name, err)
			}
			key = strings.TrimSpace(string(b))
		}
		if key == "" {
			return fmt.Errorf("%s: no API key: set CODEX_RELAY_ACCOUNT_API_KEY or give -api-key-file", name)
		}
		in.APIKey = &key
	default:
		return fmt.Errorf("%s: -kind: want openai, compatible or chatgpt, got %q", name, kind)
	}
	p.apply(&in)
	var raw json.RawMessage
	if err := api.do(ctx, http.MethodPost, "/accounts", in, &raw); err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	var created apiAccount
	if err := json.Unmarshal(raw, &created); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "added %s as account %s (%s, %s)\n", created.Label, created.ID, created.Kind, created.BaseURL)
	return nil
}

const accountsImportPurpose = `Import Codex auth.json files ($CODEX_HOME/auth.json after 'codex login'; - reads
standard input). Each ChatGPT login is one account, keyed by its workspace
(ChatGPT account id): several workspaces under one email are several accounts,
and a workspace that already exists is skipped (or, with -update, gets the new
tokens). A file may hold one auth.json, a JSON array of them, or several one
after the other. A file with only OPENAI_API_KEY adds an openai account.`

func runAccountsImport(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var p placement
	fs := newVerbFlagSet(c, name, "FILE...", accountsImportPurpose, "")
	af.register(fs, c)
	p.register(fs, c, true)
	files, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		fs.Usage()
		return fmt.Errorf("%s: name at least one auth.json file", name)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	var imported []oauth.ImportedAccount
	index := map[string]int{}
	for _, f := range files {
		var data []byte
		if f == "-" {
			data, err = io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
		} else {
			data, err = os.ReadFile(f)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		accts, err := oauth.ParseAuthJSON(data)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", name, f, err)
		}
		for _, a := range accts {
			if i, ok := index[a.Key()]; ok {
				if a.LastRefresh.After(imported[i].LastRefresh) {
					imported[i] = a
				}
				continue
			}
			index[a.Key()] = len(imported)
			imported = append(imported, a)
		}
	}
	return addImported(ctx, api, c.stdout, imported, p)
}

const accountsLoginPurpose = `Sign in with ChatGPT by device code, as 'codex login --device-auth' does, and
add the account: open the link shown, enter the code, approve. Nothing is
written to disk; the tokens go to the relay, encrypted there. A workspace that
already exists is skipped (or, with -update, gets the new tokens).`

func runAccountsLogin(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var p placement
	var authURL string
	var timeout time.Duration
	fs := newVerbFlagSet(c, name, "", accountsLoginPurpose, "")
	af.register(fs, c)
	p.register(fs, c, true)
	fs.StringVar(&authURL, "auth-url", envOr(c, "CODEX_RELAY_AUTH_URL", oauth.DefaultIssuer),
		"the auth server's base URL (env CODEX_RELAY_AUTH_URL)")
	fs.DurationVar(&timeout, "timeout", 15*time.Minute, "how long to wait for the approval")
	api, err := parseVerb(c, fs, &af, name, args)
	if err != nil {
		return err
	}
	// The sign-in goes out the way the account's traffic will.
	proxy, err := store.ParseProxy(p.proxyURL)
	if err != nil {
		return fmt.Errorf("%s: -proxy-url: %s", name, strings.TrimPrefix(err.Error(), "proxy_url: "))
	}
	hc := &http.Client{Timeout: time.Minute}
	if !proxy.IsZero() {
		via, err := relay.NewUpstream().Via(proxy)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hc = &http.Client{Transport: via.Transport, Timeout: time.Minute}
	}
	// Check the relay answers before the user goes through the login.
	if _, _, err := listAccounts(ctx, api); err != nil {
		return err
	}
	login := oauth.DeviceLogin{HTTPClient: hc, Issuer: authURL, MaxWait: timeout}
	im, err := login.Run(ctx, func(dc oauth.DeviceCode) {
		fmt.Fprintf(c.stdout, "\nSign in with ChatGPT:\n\n  1. Open %s\n  2. Enter the code %s\n\n", dc.VerificationURL, dc.UserCode)
		fmt.Fprintf(c.stdout, "Waiting for the approval (up to %s; Ctrl-C to give up)...\n", timeout)
	})
	if err != nil {
		return proxy.Redact(err)
	}
	fmt.Fprintf(c.stdout, "Signed in as %s\n", im.Label())
	return addImported(ctx, api, c.stdout, []oauth.ImportedAccount{im}, p)
}

func runAccountsList(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", "List the accounts: status and why, until when, usage windows.", "")
	af.register(fs, c)
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	api, err := parseVerb(c, fs, &af, name, args)
	if err != nil {
		return err
	}
	accts, raw, err := listAccounts(ctx, api)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	if len(accts) == 0 {
		fmt.Fprintln(c.stdout, "No accounts. Add one with 'codex-relay accounts import', 'login' or 'add'.")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tLABEL\tWORKSPACE\tPLAN\tSTATUS\tUNTIL\t5H\tWEEK\tPRIO\tPROXY\tREASON")
	for _, a := range accts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.ID, a.Kind, clipText(a.Label, 40), dash(a.AccountID),
			dash(a.PlanType), a.Status, when(a.StatusUntil), percent(a.Usage.Primary), percent(a.Usage.Secondary), a.Priority,
			dash(a.ProxyURL), dash(clipText(a.StatusReason, 60)))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04")
}

func percent(w *apiWindow) string {
	if w == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", w.UsedPercent)
}

// runAccountAction runs one of pause, resume and remove on the account its
// argument names (by id or label).
func runAccountAction(ctx context.Context, c cli, name string, args []string, purpose string,
	act func(api *apiClient, id, reason string) (string, error)) error {
	var af apiFlags
	var reason string
	fs := newVerbFlagSet(c, name, "ID|LABEL", purpose+"\n\n"+accountRef.help(), "")
	af.register(fs, c)
	if strings.HasSuffix(name, "pause") {
		fs.StringVar(&reason, "reason", "", "why, shown with the account's status")
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("%s: give exactly one account ID or label", name)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	id, err := api.resolveOne(ctx, accountRef, mustExist, pos[0])
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	msg, err := act(api, id, reason)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, msg)
	return nil
}

func runAccountsPause(ctx context.Context, c cli, name string, args []string) error {
	return runAccountAction(ctx, c, name, args, "Take an account out of service until it is resumed.",
		func(api *apiClient, id, reason string) (string, error) {
			var body any
			if reason != "" {
				body = map[string]string{"reason": reason}
			}
			var a apiAccount
			if err := api.do(ctx, http.MethodPost, "/accounts/"+url.PathEscape(id)+"/pause", body, &a); err != nil {
				return "", err
			}
			return fmt.Sprintf("paused %s (%s): %s", a.ID, a.Label, a.StatusReason), nil
		})
}

func runAccountsResume(ctx context.Context, c cli, name string, args []string) error {
	return runAccountAction(ctx, c, name, args, "Put an account back into service.",
		func(api *apiClient, id, _ string) (string, error) {
			var a apiAccount
			if err := api.do(ctx, http.MethodPost, "/accounts/"+url.PathEscape(id)+"/resume", nil, &a); err != nil {
				return "", err
			}
			return fmt.Sprintf("resumed %s (%s): %s", a.ID, a.Label, a.Status), nil
		})
}

func runAccountsRemove(ctx context.Context, c cli, name string, args []string) error {
	return runAccountAction(ctx, c, name, args, "Delete an account, its credentials and every binding to it.",
		func(api *apiClient, id, _ string) (string, error) {
			if err := api.do(ctx, http.MethodDelete, "/accounts/"+url.PathEscape(id), nil, nil); err != nil {
				return "", err
			}
			return "removed " + id, nil
		})
}
