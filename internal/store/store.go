// Package store keeps the relay's durable state (accounts, client keys,
// bindings, the request log, diagnostics, settings) in SQLite or PostgreSQL.
//
// One implementation on sqlx serves both drivers: SQLite through the pure-Go
// modernc.org/sqlite (the embedded default, one process) and PostgreSQL
// through lib/pq (required for several replicas). Queries are written with ?
// placeholders and rebound for the driver; the schema is the portable one in
// package migrations. A *Store is safe for concurrent use.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // PostgreSQL driver "postgres"
	"golang.org/x/sync/singleflight"
	_ "modernc.org/sqlite" // SQLite driver "sqlite"
)

// Dialect names the database flavour behind a Store.
type Dialect string

const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// Location is a parsed CODEX_RELAY_DATABASE_URL.
type Location struct {
	Dialect Dialect
	// DSN is what the driver opens.
	DSN string
	// Path is the SQLite database file; empty for PostgreSQL.
	Path string
}

// DefaultSQLitePath is where the database lives when none is configured.
const DefaultSQLitePath = "data/codex-relay.db"

// ParseLocation reads a database URL: "postgres://..." or "postgresql://..."
// selects PostgreSQL; "sqlite:PATH", "sqlite://PATH", "file:PATH" or a plain
// file path selects SQLite. An empty string means DefaultSQLitePath.
//
// A libpq key=value string ("host=db password=...") is refused: taken for a
// file path, it would create a file of that name and print it, password
// included, wherever the location is shown. Errors never quote the input,
// which may hold a password.
func ParseLocation(raw string) (Location, error) {
	raw = strings.TrimSpace(raw)
	lower := strings.ToLower(raw)
	switch {
	case raw == "":
		return sqliteLocation(DefaultSQLitePath)
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return postgresLocation(raw)
	case strings.HasPrefix(lower, "sqlite://"):
		return sqliteLocation(raw[len("sqlite://"):])
	case strings.HasPrefix(lower, "sqlite:"):
		return sqliteLocation(raw[len("sqlite:"):])
	case strings.HasPrefix(lower, "file:"):
		return sqliteLocation(raw[len("file:"):])
	case keywordDSN.MatchString(raw):
		return Location{}, errors.New("database url: key=value connection strings are not supported; " +
			"give a URL: postgres://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=... (sqlite:PATH for a file of that name)")
	case strings.Contains(raw, "://"):
		return Location{}, fmt.Errorf("database url: unsupported scheme%s (use postgres://, sqlite: or a file path)", schemeOf(raw))
	default:
		return sqliteLocation(raw)
	}
}

// keywordDSN matches a libpq key=value connection string by its keywords.
var keywordDSN = regexp.MustCompile(`(?i)(?:^|\s)(?:host|hostaddr|port|dbname|user|password|passfile|sslmode|sslpassword|` +
	`sslkey|sslcert|sslrootcert|service|connect_timeout|application_name|options|target_session_attrs)\s*=`)

// postgresLocation checks a PostgreSQL URL. url.Parse's errors quote the
// whole URL, password included, so none is passed on. A '#' is refused: the
// rest of the URL after it (typically of a password whose '#' was not
// percent-encoded) would be dropped as a fragment, silently.
func postgresLocation(raw string) (Location, error) {
	if strings.Contains(raw, "#") {
		return Location{}, errors.New("database url: unexpected '#' (percent-encode it as %23 in a user name or password)")
	}
	if _, err := url.Parse(raw); err != nil {
		return Location{}, errors.New("database url: not a valid URL (percent-encode any of @ : / ? # % in the user name and password)")
	}
	return Location{Dialect: Postgres, DSN: raw}, nil
}

// schemeOf names the scheme of a URL for an error message, or nothing when
// the URL does not parse.
func schemeOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return ""
	}
	return " " + strconv.Quote(u.Scheme)
}

func sqliteLocation(path string) (Location, error) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" {
		return Location{}, errors.New("database url: empty SQLite path")
	}
	// WAL lets readers run beside the single writer; IMMEDIATE transactions take
	// the write lock up front so a read-then-write transaction never fails
	// half-way with SQLITE_BUSY; busy_timeout makes writers queue instead of fail.
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return Location{Dialect: SQLite, Path: path, DSN: "file:" + path + "?" + q.Encode()}, nil
}

// redacted stands in for a secret, as in url.URL.Redacted.
const redacted = "xxxxx"

// redactURL hides the secrets of a database URL for messages, logs and
// pages: the user info's password, which url.URL.Redacted hides, and the
// values of secret query parameters (?password=, ?sslpassword=), which it
// does not. Any fragment is dropped. Anything but a hierarchical URL with a
// scheme is not shown at all: url.Parse takes a key=value string for a path.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return "<unparseable url>"
	}
	u.Fragment, u.RawFragment = "", ""
	u.RawQuery = redactQuery(u.RawQuery)
	return u.Redacted()
}

// redactQuery hides the values of secret parameters in a raw query and
// keeps the rest as written.
func redactQuery(raw string) string {
	if raw == "" {
		return raw
	}
	pairs := strings.Split(raw, "&")
	for i, p := range pairs {
		name, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		// A name that does not unescape is hidden too: whatever it means to
		// a driver, it cannot be told apart from a secret here.
		if n, err := url.QueryUnescape(name); err != nil || secretParam(n) {
			pairs[i] = name + "=" + redacted
		}
	}
	return strings.Join(pairs, "&")
}

// secretParam reports whether a connection parameter holds a secret: libpq's
// and lib/pq's password and sslpassword (the client key's passphrase),
// whatever their case. lib/pq ignores spaces around a name.
func secretParam(name string) bool {
	name = strings.TrimSpace(name)
	return strings.EqualFold(name, "password") || strings.EqualFold(name, "sslpassword")
}

// secrets lists the secret values of the location, as written in its URL
// and unescaped, for scrubbing driver messages.
func (l Location) secrets() []string {
	if l.Dialect != Postgres {
		return nil
	}
	u, err := url.Parse(l.DSN)
	if err != nil {
		return nil
	}
	var out []string
	if pw, ok := u.User.Password(); ok {
		out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
	}
	for name, values := range u.Query() {
		if secretParam(name) {
			for _, v := range values {
				out = append(out, v, url.QueryEscape(v))
			}
		}
	}
	return out
}

// scrub hides the location's secrets in the message of a driver error, so a
// driver that quotes its connection string cannot put a password in a log
// line or an answer. The error chain is kept for errors.Is and errors.As.
func (l Location) scrub(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, s := range l.secrets() {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	if msg == err.Error() {
		return err
	}
	return &scrubbedError{msg: msg, err: err}
}

// scrubbedError is an error whose message had secrets taken out.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// String describes the location without secrets.
func (l Location) String() string {
	if l.Dialect == SQLite {
		return "sqlite:" + l.Path
	}
	return redactURL(l.DSN)
}

// Store is the relay's database.
type Store struct {
	db      *sqlx.DB        // static after construction; safe for concurrent use
	pg      *boundConnector // PostgreSQL's connections (nil on SQLite); static after construction
	loc     Location        // static after construction
	sealer  *Sealer         // static after construction; nil without a secret key
	nowFunc func() time.Time
	stmts   stmtCache
	// flight shares the reads of callers that miss a cache entry at once.
	flight singleflight.Group
	accts  accountsCache
	keys   keysCache
	prices priceCache
	// writeTx lets one write (a transaction, or a statement of exec) at a
	// time begin on SQLite, in arrival order. SQLite has one writer anyway; left to its busy
	// handler, waiting transactions poll for the lock, and under load an
	// unlucky one can lose every round until its busy timeout.
	writeTx sync.Mutex
	// refused holds the error of the latest write that tells whether the
	// database takes writes (see noteWrite); nil once one went through.
	refused atomic.Pointer[error]
	// bindingReads and leaseWrites share one round trip among the
	// requests that read bindings, or lease lanes, at the same time.
	bindingReads batcher[BindingLookup, []Binding]
	leaseWrites  batcher[leaseAsk, leaseWon]
}

// Options configure Open.
type Options struct {
	// SecretKey encrypts credentials at rest; see NewSealer. Without it the
	// store can migrate and read everything but credentials (ErrNoSecretKey).
	SecretKey []byte
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Open connects to the database at loc. It does not migrate: call Migrate.
func Open(ctx context.Context, loc Location, opts Options) (*Store, error) {
	var sealer *Sealer
	if opts.SecretKey != nil {
		var err error
		if sealer, err = NewSealer(opts.SecretKey); err != nil {
			return nil, err
		}
	}
	if loc.Dialect == SQLite {
		if dir := filepath.Dir(loc.Path); dir != "" {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, fmt.Errorf("open database: create folder: %w", err)
			}
		}
	}
	var db *sqlx.DB
	var pg *boundConnector
	if loc.Dialect == Postgres {
		sdb, bc, err := openPostgres(loc.DSN)
		if err != nil {
			return nil, fmt.Errorf("open database: %w", loc.scrub(err))
		}
		db, pg = sqlx.NewDb(sdb, string(Postgres)), bc
	} else {
		var err error
		if db, err = sqlx.Open(string(loc.Dialect), loc.DSN); err != nil {
			return nil, fmt.Errorf("open database: %w", loc.scrub(err))
		}
	}
	if loc.Dialect == SQLite {
		// One writer at a time is SQLite's nature (writeTx); the rest of the
		// pool serves readers. With 4 connections a burst of new threads
		// queued for one to read its bindings (62 ms on average per first
		// turn, 200 at once); 8 cut the burst's added first-token time
		// from +111-118 ms p50 to +22-83 ms; 16 did no better.
		db.SetMaxOpenConns(8)
	} else {
		// As many kept idle as may be open: with fewer, a burst's returning
		// connections were closed and new ones opened behind them, each a new
		// PostgreSQL backend that prepares every statement again.
		db.SetMaxOpenConns(20)
		db.SetMaxIdleConns(20)
		db.SetConnMaxIdleTime(5 * time.Minute)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", loc, loc.scrub(err))
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s := &Store{db: db, pg: pg, loc: loc, sealer: sealer, nowFunc: now}
	s.bindingReads.run = s.readBindings
	s.leaseWrites.run = s.writeLeases
	return s, nil
}

// Close releases the prepared statements and the connection pool.
func (s *Store) Close() error {
	if s.pg != nil {
		s.pg.closing.Store(true)
	}
	s.stmts.close()
	return s.db.Close()
}

// Dialect reports which database this is.
func (s *Store) Dialect() Dialect { return s.loc.Dialect }

// OpenConnections is how many connections the store's pool holds now
// (on PostgreSQL, each a socket).
func (s *Store) OpenConnections() int { return s.db.Stats().OpenConnections }

// Location reports where the database is.
func (s *Store) Location() Location { return s.loc }

// Ping checks the database answers, within a short deadline.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return s.loc.scrub(s.db.PingContext(ctx))
}

func (s *Store) now() time.Time { return s.nowFunc() }

// noteWrite keeps the outcome of a write made on ctx that tells whether
// the database takes writes: the replica heartbeat, made whatever the
// traffic, a thread's lane lease, taken before an HTTP request is served,
// and the request log, written after every request. Reads can succeed where
// writes fail (a SQLite file gone read-only, a full disk), so only writes
// tell. A write cut by its context (queued past its deadline under load;
// each driver reports that in its own words) and a duplicate row tell
// nothing of the database and change nothing.
func (s *Store) noteWrite(ctx context.Context, err error) {
	switch {
	case err == nil:
		if s.refused.Load() != nil {
			s.refused.Store(nil)
		}
	case ctx.Err() != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), isUniqueViolation(err):
	default:
		s.noteRefused(err)
	}
}

// noteRefused records err as the latest write's refusal (see WritesRefused).
func (s *Store) noteRefused(err error) {
	err = s.loc.scrub(err)
	s.refused.Store(&err)
}

// WritesRefused reports the error of the latest write that the database
// refused, or nil when it took the latest one (or none was made yet). The
// relay admits no request while it is set, and /readyz fails: a request
// served then would leave no log row, no binding and no charge. The next
// such write that goes through (the heartbeat, every few seconds, at the
// latest) clears it.
func (s *Store) WritesRefused() error {
	if p := s.refused.Load(); p != nil {
		return *p
	}
	return nil
}

// q rebinds a query written with ? placeholders for the driver.
func (s *Store) q(query string) string { return s.db.Rebind(query) }
