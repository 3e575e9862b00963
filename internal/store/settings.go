package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Setting reads a named setting; ok is false when it was never set.
func (s *Store) Setting(ctx context.Context, name string) (value string, ok bool, err error) {
	err = s.get(ctx, &value, `SELECT value FROM settings WHERE name = ?`, name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read setting %s: %w", name, err)
	}
	return value, true, nil
}

// SetSetting writes a named setting, replacing any earlier value.
func (s *Store) SetSetting(ctx context.Context, name, value string) error {
	_, err := s.exec(ctx, `INSERT INTO settings (name, value, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`,
		name, value, s.now().UnixMilli())
	if err != nil {
		return fmt.Errorf("write setting %s: %w", name, err)
	}
	return nil
}

// SetSettingIfAbsent writes a setting only when it does not exist yet and
// reports whether it wrote. Two replicas racing agree on one value.
func (s *Store) SetSettingIfAbsent(ctx context.Context, name, value string) (bool, error) {
	res, err := s.exec(ctx, `INSERT INTO settings (name, value, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (name) DO NOTHING`, name, value, s.now().UnixMilli())
	if err != nil {
		return false, fmt.Errorf("write setting %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("write setting %s: %w", name, err)
	}
	return n == 1, nil
}
