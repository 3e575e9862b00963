package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/codexrelay/codex-relay/migrations"
)

// migrationLockID is the PostgreSQL advisory lock that serialises replicas
// migrating the same database ("codexrly" in ASCII).
const migrationLockID int64 = 0x636f646578726c79

func (s *Store) provider(locked bool) (*goose.Provider, error) {
	dialect := goose.DialectSQLite3
	var opts []goose.ProviderOption
	if s.loc.Dialect == Postgres {
		dialect = goose.DialectPostgres
		if locked {
			l, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 120))
			if err != nil {
				return nil, err
			}
			opts = append(opts, goose.WithSessionLocker(l))
		}
	}
	opts = append(opts, goose.WithDisableGlobalRegistry(true))
	return goose.NewProvider(dialect, s.db.DB, migrations.FS, opts...)
}

// Migrate applies every pending migration under a lock, so replicas starting
// together do not race: a PostgreSQL advisory lock, or for SQLite an exclusive
// file lock beside the database file. It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]int64, error) {
	if s.loc.Dialect == SQLite {
		unlock, err := lockFile(ctx, s.loc.Path+".migrate-lock")
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		defer unlock()
	}
	p, err := s.provider(true)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// SchemaVersion reports the applied and the latest known migration versions.
func (s *Store) SchemaVersion(ctx context.Context) (current, latest int64, err error) {
	p, err := s.provider(false)
	if err != nil {
		return 0, 0, err
	}
	return p.GetVersions(ctx)
}

// Ready reports whether the database answers, takes writes (its latest
// write went through: see WritesRefused) and every migration is applied.
func (s *Store) Ready(ctx context.Context) error {
	if err := s.Ping(ctx); err != nil {
		return &NotReadyError{Reason: "database unreachable", Err: err}
	}
	if err := s.WritesRefused(); err != nil {
		return &NotReadyError{Reason: "database refuses writes", Err: err}
	}
	cur, latest, err := s.SchemaVersion(ctx)
	if err != nil {
		return &NotReadyError{Reason: "database schema version unreadable", Err: err}
	}
	if cur < latest {
		return &NotReadyError{Reason: fmt.Sprintf("migrations pending: at version %d of %d", cur, latest)}
	}
	return nil
}

// NotReadyError is why the store cannot serve: Reason in words that name
// no address, user or path (an unauthenticated /readyz shows it), Err the
// cause with its details (for the log).
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *NotReadyError) Unwrap() error { return e.Err }

// lockFile takes an exclusive advisory lock on path, waiting until ctx ends.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-deadline.C:
			f.Close()
			return nil, fmt.Errorf("lock %s: still held by another process after 2m", path)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
