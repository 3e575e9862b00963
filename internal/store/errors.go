package store

import (
	"errors"

	"github.com/lib/pq"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrNotFound is returned when a row that was asked for by id does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write would break a uniqueness rule.
var ErrConflict = errors.New("conflict")

// ErrNoSecretKey means the store was opened without a secret key and was
// asked to seal or open credentials.
var ErrNoSecretKey = errors.New("no secret key configured: credentials cannot be read or written")

// isUniqueViolation reports whether err is a unique or primary-key violation
// from either driver.
func isUniqueViolation(err error) bool {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		return pqErr.Code == "23505"
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		c := sqErr.Code()
		return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
