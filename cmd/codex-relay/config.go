package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web"
)

// dbFlags are the flags every command that opens the database shares.
type dbFlags struct {
	databaseURL string
	logFormat   string
	logLevel    string
}

func (f *dbFlags) register(fs *flag.FlagSet, c cli) {
	f.registerWithDefault(fs, c, "sqlite:"+store.DefaultSQLitePath)
}

// registerWithDefault registers the flags, the database's help naming def
// as the database used when none is configured.
func (f *dbFlags) registerWithDefault(fs *flag.FlagSet, c cli, def string) {
	fs.StringVar(&f.databaseURL, "database-url", envOr(c, "CODEX_RELAY_DATABASE_URL", ""),
		"database: a SQLite file path, sqlite:PATH, or postgres://... (env CODEX_RELAY_DATABASE_URL; default "+def+")")
	// The default shown by -help and flag errors comes from the environment:
	// never with its password.
	if fl := fs.Lookup("database-url"); fl.DefValue != "" {
		if loc, err := store.ParseLocation(fl.DefValue); err == nil {
			fl.DefValue = loc.String()
		} else {
			fl.DefValue = "$CODEX_RELAY_DATABASE_URL"
		}
	}
	fs.StringVar(&f.logFormat, "log-format", envOr(c, "CODEX_RELAY_LOG_FORMAT", "auto"),
		"log format: auto (text on a terminal, JSON otherwise), text or json (env CODEX_RELAY_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", envOr(c, "CODEX_RELAY_LOG_LEVEL", "info"),
		"log level: debug, info, warn or error (env CODEX_RELAY_LOG_LEVEL)")
}

// newLogger builds the process logger on w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "auto":
		if isTerminal(w) {
			return slog.New(slog.NewTextHandler(w, opts)), nil
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format: want auto, text or json, got %q", format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// secretKeyFile is the name of the generated key file beside a SQLite database.
const secretKeyFile = "secret.key"

// resolveSecretKey returns the credentials key: CODEX_RELAY_SECRET_KEY when
// set; otherwise, for SQLite, the key file beside the database, created with
// 32 random bytes and mode 0600 on first start. PostgreSQL needs the variable,
// because every replica must hold the same key.
func resolveSecretKey(c cli, loc store.Location, log *slog.Logger) ([]byte, error) {
	if v := c.getenv("CODEX_RELAY_SECRET_KEY"); v != "" {
		if len(v) < store.MinSecretKeyLen {
			return nil, fmt.Errorf("CODEX_RELAY_SECRET_KEY: need at least %d characters (try: openssl rand -base64 32)", store.MinSecretKeyLen)
		}
		return []byte(v), nil
	}
	if loc.Dialect != store.SQLite {
		return nil, errors.New("CODEX_RELAY_SECRET_KEY is required with PostgreSQL: every replica must encrypt credentials with the same key (try: openssl rand -base64 32)")
	}
	path := filepath.Join(filepath.Dir(loc.Path), secretKeyFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
			log.Warn("secret key file is readable by others; chmod 600 it", "path", path)
		}
		key := strings.TrimSpace(string(b))
		if len(key) < store.MinSecretKeyLen {
			return nil, fmt.Errorf("secret key file %s: too short", path)
		}
		return []byte(key), nil
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("secret key file: %w", err)
		}
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		key := base64.StdEncoding.EncodeToString(raw[:])
		// O_EXCL: two processes starting at once must not both write a key.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return resolveSecretKey(c, loc, log)
		}
		if err != nil {
			return nil, fmt.Errorf("secret key file: %w", err)
		}
		if _, err := f.WriteString(key + "\n"); err != nil {
			f.Close()
			return nil, fmt.Errorf("secret key file: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("secret key file: %w", err)
		}
		log.Info("generated a secret key for credentials; back it up with the database", "path", path)
		return []byte(key), nil
	default:
		return nil, fmt.Errorf("secret key file: %w", err)
	}
}

// adminTokenSetting holds the SHA-256 (hex) of a generated admin token.
const adminTokenSetting = "admin_token_sha256"

// AdminTokenPrefix starts generated admin tokens.
const adminTokenPrefix = "cra_"

// adminToken is the admin token the relay checks: its hash, and where the
// token itself is to be had.
type adminToken struct {
	hash      [32]byte
	generated string // the token, when this start generated it (and printed it)
	fromEnv   bool   // the token is CODEX_RELAY_ADMIN_TOKEN
}

// minAdminTokenLen is the shortest admin token an operator may choose: the
// API and the console limit guesses per address, not in total.
const minAdminTokenLen = 16

// checkAdminToken refuses an operator-chosen admin token (the variable, its
// _FILE or admin_token in the configuration file) shorter than
// minAdminTokenLen.
func checkAdminToken(c cli) error {
	if v := c.getenv("CODEX_RELAY_ADMIN_TOKEN"); v != "" && len(v) < minAdminTokenLen {
		return fmt.Errorf("CODEX_RELAY_ADMIN_TOKEN (or CODEX_RELAY_ADMIN_TOKEN_FILE, or admin_token in the configuration file) "+
			"has %d characters: it needs at least %d (try: openssl rand -base64 32), or unset it to have one generated", len(v), minAdminTokenLen)
	}
	return nil
}

// resolveAdminToken returns the token the API checks: CODEX_RELAY_ADMIN_TOKEN
// when set (checkAdminToken has passed it); else the token generated on an
// earlier start (only its hash is kept); else a new token, which is printed
// once to stdout (never logged).
func resolveAdminToken(ctx context.Context, c cli, st *store.Store) (adminToken, error) {
	if v := c.getenv("CODEX_RELAY_ADMIN_TOKEN"); v != "" {
		return adminToken{hash: web.HashAdminToken(v), fromEnv: true}, nil
	}
	for range 2 {
		if stored, ok, err := st.Setting(ctx, adminTokenSetting); err != nil {
			return adminToken{}, err
		} else if ok {
			var t adminToken
			b, err := hex.DecodeString(stored)
			if err != nil || len(b) != len(t.hash) {
				return t, fmt.Errorf("setting %s is corrupt; set CODEX_RELAY_ADMIN_TOKEN", adminTokenSetting)
			}
			copy(t.hash[:], b)
			return t, nil
		}
		token := store.NewSecret(adminTokenPrefix)
		h := web.HashAdminToken(token)
		wrote, err := st.SetSettingIfAbsent(ctx, adminTokenSetting, hex.EncodeToString(h[:]))
		if err != nil {
			return adminToken{}, err
		}
		if wrote {
			fmt.Fprintf(c.stdout, "\nAdmin token (shown once, stored only as a hash): %s\n", token)
			fmt.Fprintf(c.stdout, "Use it as \"Authorization: Bearer <token>\" on /api/v1 and to sign in at /admin/.\n")
			fmt.Fprintf(c.stdout, "Set CODEX_RELAY_ADMIN_TOKEN to choose your own instead.\n\n")
			return adminToken{hash: h, generated: token}, nil
		}
		// Another replica generated one first: read it on the next pass.
	}
	return adminToken{}, errors.New("admin token: could not read or create it")
}

// openStore parses the database location, resolves the secret key (unless
// withoutSecret) and opens and migrates the store.
func openStore(ctx context.Context, c cli, f dbFlags, log *slog.Logger, withoutSecret bool) (*store.Store, error) {
	st, _, err := openStoreWithKey(ctx, c, f, log, withoutSecret)
	return st, err
}

// openRelayStore is what serve and demo start from: the store opened and
// migrated with its secret key, and the admin token (generated and printed
// once when none is set). A chosen admin token that is too short stops them
// before the store is opened.
func openRelayStore(ctx context.Context, c cli, f dbFlags, log *slog.Logger) (*store.Store, []byte, adminToken, error) {
	if err := checkAdminToken(c); err != nil {
		return nil, nil, adminToken{}, err
	}
	st, secret, err := openStoreWithKey(ctx, c, f, log, false)
	if err != nil {
		return nil, nil, adminToken{}, err
	}
	admin, err := resolveAdminToken(ctx, c, st)
	if err != nil {
		st.Close()
		return nil, nil, adminToken{}, err
	}
	return st, secret, admin, nil
}

// openStoreWithKey is openStore that also returns the secret key.
func openStoreWithKey(ctx context.Context, c cli, f dbFlags, log *slog.Logger, withoutSecret bool) (*store.Store, []byte, error) {
	loc, err := store.ParseLocation(f.databaseURL)
	if err != nil {
		return nil, nil, err
	}
	var key []byte
	if !withoutSecret {
		if key, err = resolveSecretKey(c, loc, log); err != nil {
			return nil, nil, err
		}
	}
	st, err := app.OpenStore(ctx, loc, key, log)
	if err != nil {
		return nil, nil, err
	}
	return st, key, nil
}
