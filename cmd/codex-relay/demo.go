package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web"
)

const demoPurpose = `Run the relay in front of the simulated upstream, ready for Codex: three accounts
in two organisations (two ChatGPT subscriptions and an API key), a SQLite database in a
temp folder, and a client key. Prints the Codex config block, the key and the API URL,
then serves until interrupted (the temp folder is removed then).`

// The demo's database when none is configured: demoDatabaseFile in a new
// folder, named after demoDirPattern, of the system's temp folder.
const (
	demoDirPattern   = "codex-relay-demo-*" // os.MkdirTemp's pattern: * is a random number
	demoDatabaseFile = "relay.db"
)

// demoDefaultDatabase is the demo's default database as its -help says it.
func demoDefaultDatabase() string {
	return "sqlite:" + filepath.Join(os.TempDir(), demoDirPattern, demoDatabaseFile)
}

func runDemo(ctx context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "demo", demoPurpose)
	var db dbFlags
	db.registerWithDefault(fs, c, demoDefaultDatabase()+", in a new temp folder (* a random number) removed at exit unless -keep")
	addr := fs.String("addr", envOr(c, "CODEX_RELAY_ADDR", DefaultAddr), "relay listen address (env CODEX_RELAY_ADDR)")
	simAddr := fs.String("sim-addr", envOr(c, "CODEX_RELAY_SIM_ADDR", "127.0.0.1:0"), "simulated upstream listen address (env CODEX_RELAY_SIM_ADDR); port 0 picks a free one")
	keep := fs.Bool("keep", false, "keep the temp folder (database and secret key) after exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected argument %q", fs.Arg(0))
	}
	log, err := newLogger(c.stderr, db.logFormat, db.logLevel)
	if err != nil {
		return err
	}

	upstream, stopSim, err := sim.Listen(sim.Config{Accounts: demoSimAccounts(), Logger: log.With("component", "sim")}, *simAddr, log)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer stopSim()

	if db.databaseURL == "" {
		dir, err := os.MkdirTemp("", demoDirPattern)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if !*keep {
			defer os.RemoveAll(dir)
		}
		db.databaseURL = "sqlite:" + filepath.Join(dir, demoDatabaseFile)
	}
	st, secret, admin, err := openRelayStore(ctx, c, db, log)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := addDemoAccounts(ctx, st, upstream); err != nil {
		return err
	}
	_, key, err := st.CreateClientKey(ctx, store.ClientKey{Name: "demo"})
	if err != nil {
		return err
	}
	return serveRelay(ctx, c, *addr, 5*time.Second, app.Options{Store: st, Secret: secret, AdminTokenHash: admin.hash, Logger: log, TokenURL: upstream.TokenURL(),
		AuthURL: upstream.URL}, func(a string) { // the console's sign-in against the sim too
		printDemoBanner(c, a, admin, key, upstream.URL, st.Location().String())
	})
}

// addDemoAccounts registers the sim's accounts with the relay (once: a
// database kept with -keep already has them).
func addDemoAccounts(ctx context.Context, st *store.Store, upstream *sim.Server) error {
	existing, err := st.Accounts(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, a := range existing {
		have[a.Label] = true
	}
	for _, sa := range upstream.Accounts() {
		a := sa.Account
		if have[a.Label] {
			continue
		}
		acc := store.Account{Label: a.Label, Organization: a.Organization, Email: a.Email, PlanType: a.PlanType}
		var cred store.Credentials
		if a.Kind == sim.KindOpenAI {
			acc.Kind, acc.BaseURL, cred.APIKey = store.KindOpenAI, upstream.OpenAIBaseURL(), a.AccessToken
		} else {
			acc.Kind, acc.BaseURL, acc.ChatGPTAccountID = store.KindChatGPT, upstream.CodexBaseURL(), a.ChatGPTAccountID
			cred.AccessToken, cred.RefreshToken = a.AccessToken, a.RefreshToken
		}
		if _, err := st.CreateAccount(ctx, acc, cred); err != nil {
			return fmt.Errorf("demo: add account %s: %w", a.ID, err)
		}
	}
	return nil
}

// printDemoBanner tells what to use the demo with, once it listens (after
// the start-up's log lines, so that it is what a person sees last): the
// relay, the console and the admin token to sign in with, the client key
// and the Codex configuration.
func printDemoBanner(c cli, addr string, admin adminToken, key, simURL, database string) {
	base := "http://" + addr
	token := admin.generated
	switch {
	case admin.fromEnv:
		token = "the value of CODEX_RELAY_ADMIN_TOKEN"
	case token == "":
		token = "the one printed at this database's first start (only its hash is kept)"
	}
	fmt.Fprintf(c.stdout, `
Codex Relay demo is running.

  relay        %s   (database %s)
  console      %s/admin/    (sign in with the admin token)
  admin token  %s
  admin API    %s/api/v1/   (Authorization: Bearer <admin token>)
  upstream     %s   (simulated: 3 accounts in 2 organisations)

Client key (shown once):
  export CODEX_RELAY_KEY=%s

Put this in $CODEX_HOME/config.toml (CODEX_HOME=~/.codex by default):

model = "gpt-5.5-codex"
%s
Then: codex exec --skip-git-repo-check "say hello"
Stop with Ctrl-C.
`, base, database, base, token, base, simURL, key, web.CodexConfig(base))
}
