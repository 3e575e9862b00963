// Command codex-relay runs Codex Relay: a pool of upstream accounts behind one
// Responses endpoint that Codex talks to as it talks to OpenAI.
//
// Every subcommand reads its configuration from flags and CODEX_RELAY_*
// settings (environment variables, the files their _FILE variables name, or a
// -config file; see configure) here, in cmd/, and passes plain values down.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	_ "time/tzdata" // CODEX_RELAY_TIMEZONE works on hosts and images without a zone database
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], cli{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv})
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "codex-relay:", err)
		os.Exit(1)
	}
}

// cli is what a subcommand may touch of the process: its output streams and
// its environment. Tests pass their own.
type cli struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// listening, when set, is told the address serve listens on (tests).
	listening func(addr string)
}

// command is one subcommand of codex-relay.
type command struct {
	summary string
	run     func(ctx context.Context, c cli, args []string) error
}

// commands lists every subcommand; "serve" is the default.
func commands() map[string]command {
	return map[string]command{
		"serve":       {"run the relay (the default when no subcommand is given)", runServe},
		"migrate":     {"apply the database migrations and exit", runMigrate},
		"sim":         {"run the simulated upstream (ChatGPT backend and OpenAI Responses API)", runSim},
		"demo":        {"run the relay in front of the simulated upstream, ready for Codex", runDemo},
		"accounts":    {"manage upstream accounts through the admin API (add, import, login, list, pause, resume, remove)", runAccounts},
		"keys":        {"manage client keys through the admin API (create, list, revoke)", runKeys},
		"bindings":    {"list or reset bindings through the admin API (which account serves which thread)", runBindings},
		"usage":       {"report requests, tokens, cost and errors by key, account, model, thread, day or hour (admin API)", runUsage},
		"bench":       {"measure what the relay adds over the simulated upstream (latency, throughput, allocations)", runBench},
		"version":     {"print the version, commit and Go version (-json)", runVersion},
		"healthcheck": {"exit 0 when the relay on this host answers /healthz (the container image's HEALTHCHECK)", runHealthcheck},
	}
}

func run(ctx context.Context, args []string, c cli) error {
	args, c, err := configure(args, c)
	if err != nil {
		return err
	}
	cmds := commands()
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
		return cmds["serve"].run(ctx, c, args)
	}
	name := args[0]
	switch name {
	case "-h", "--help", "-help", "help":
		usage(c.stdout, cmds)
		return nil
	}
	cmd, ok := cmds[name]
	if !ok {
		usage(c.stderr, cmds)
		return fmt.Errorf("unknown command %q", name)
	}
	return cmd.run(ctx, c, args[1:])
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "Usage: codex-relay [command] [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every command takes -config FILE (or CODEX_RELAY_CONFIG): a YAML file whose keys are the")
	fmt.Fprintln(w, "CODEX_RELAY_* variables in lower case without the prefix (database_url: ...). Each variable may")
	fmt.Fprintln(w, "also name a file holding its value with a _FILE suffix (CODEX_RELAY_SECRET_KEY_FILE=/run/secrets/key).")
	fmt.Fprintln(w, "Precedence: flag > environment > *_FILE > config file > default.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'codex-relay <command> --help' for the flags of one command.")
}

// newFlagSet returns a flag set whose -help output names the command, its
// purpose and every flag with its environment variable and default.
func newFlagSet(c cli, name, purpose string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "Usage: codex-relay %s [flags]\n\n%s\n\nFlags:\n", name, purpose)
		fs.PrintDefaults()
		fmt.Fprint(c.stderr, configNote)
	}
	return fs
}

// configNote ends every command's -help: the settings every flag's default
// comes from (see configure).
const configNote = `  -config FILE
    	a YAML file of settings, keyed by the variables' names in lower case without
    	CODEX_RELAY_ (env CODEX_RELAY_CONFIG); any variable may instead name a file
    	holding its value with a _FILE suffix. Precedence: flag > environment >
    	*_FILE > config file > default
`

// withEnvNotes adds the secrets that are read only from the environment
// (never flags, so they do not show in process listings) to a usage text.
func withEnvNotes(usage func(), c cli) func() {
	return func() {
		usage()
		fmt.Fprint(c.stderr, `
Environment, *_FILE or config file only (secrets are never flags):
  CODEX_RELAY_ADMIN_TOKEN   admin API and console token (16+ characters); when unset one is
                            generated, printed once and kept (hashed) in the database
  CODEX_RELAY_SECRET_KEY    key that encrypts account credentials at rest (16+ characters);
                            when unset with SQLite, a key file secret.key is generated beside
                            the database (mode 0600); required with PostgreSQL
`)
	}
}

// envOr returns the setting key (from the environment, its _FILE or the
// configuration file, as configure resolved it) when it is set and not blank,
// else def.
func envOr(c cli, key, def string) string {
	if v := strings.TrimSpace(c.getenv(key)); v != "" {
		return v
	}
	return def
}
