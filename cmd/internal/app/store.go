package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// migrateTimeout bounds applying the migrations at open: under a lock
// another replica may hold while it migrates.
const migrateTimeout = 3 * time.Minute

// OpenStore opens the database at loc with the secret key that encrypts
// credentials (nil: the store opens without one, and cannot read or write
// them) and applies its migrations, logging the ones it applied.
func OpenStore(ctx context.Context, loc store.Location, secret []byte, log *slog.Logger) (*store.Store, error) {
	st, err := store.Open(ctx, loc, store.Options{SecretKey: secret})
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	applied, err := st.Migrate(mctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("database migrated", "database", loc.String(), "applied", applied)
	}
	return st, nil
}
