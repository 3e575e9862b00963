package store_test

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/migrations"
)

func TestParseLocation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in string
		dialect  store.Dialect
		path     string
		wantErr  bool
	}{
		{"empty is the default file", "", store.SQLite, store.DefaultSQLitePath, false},
		{"plain path", "/var/lib/relay.db", store.SQLite, "/var/lib/relay.db", false},
		{"relative path", "data/x.db", store.SQLite, "data/x.db", false},
		{"sqlite colon", "sqlite:/tmp/a.db", store.SQLite, "/tmp/a.db", false},
		{"sqlite slashes", "sqlite:///tmp/a.db", store.SQLite, "/tmp/a.db", false},
		{"file url drops query", "file:/tmp/a.db?mode=ro", store.SQLite, "/tmp/a.db", false},
		{"postgres", "postgres://u:p@127.0.0.1:5432/db?sslmode=disable", store.Postgres, "", false},
		{"postgresql upper", "POSTGRESQL://127.0.0.1/db", store.Postgres, "", false},
		{"mysql refused", "mysql://x", "", "", true},
		{"sqlite without path", "sqlite:", "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := store.ParseLocation(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.dialect, loc.Dialect)
			assert.Equal(t, tc.path, loc.Path)
		})
	}
	loc, err := store.ParseLocation("postgres://user:hunter2@db/x")
	require.NoError(t, err)
	assert.NotContains(t, loc.String(), "hunter2", "a location printed in logs must not show the password")
}

func TestMigrateIsIdempotentAndReady(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.URL(t)
			loc, err := store.ParseLocation(url)
			require.NoError(t, err)
			s, err := store.Open(ctx, loc, store.Options{SecretKey: storetest.SecretKey})
			require.NoError(t, err)
			defer s.Close()

			require.Error(t, s.Ready(ctx), "an unmigrated database is not ready")
			applied, err := s.Migrate(ctx)
			require.NoError(t, err)
			assert.NotEmpty(t, applied)
			require.NoError(t, s.Ready(ctx))
			again, err := s.Migrate(ctx)
			require.NoError(t, err)
			assert.Empty(t, again, "a second migration applies nothing")
			cur, latest, err := s.SchemaVersion(ctx)
			require.NoError(t, err)
			assert.Equal(t, latest, cur)
		})
	}
}

// Replicas that start together migrate one database at the same moment; the
// lock must make exactly one of them apply each migration and neither fail.
func TestConcurrentMigrationsDoNotRace(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.URL(t)
			loc, err := store.ParseLocation(url)
			require.NoError(t, err)
			const n = 4
			var wg sync.WaitGroup
			results := make([][]int64, n)
			errs := make([]error, n)
			for i := range n {
				s, err := store.Open(ctx, loc, store.Options{SecretKey: storetest.SecretKey})
				require.NoError(t, err)
				defer s.Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = s.Migrate(ctx)
				}()
			}
			wg.Wait()
			total := 0
			for i := range n {
				require.NoError(t, errs[i], "migrator %d", i)
				total += len(results[i])
			}
			// Counted by file: versions need not follow one another (a
			// branch may land 0012 before another's 0011).
			files, err := fs.Glob(migrations.FS, "*.sql")
			require.NoError(t, err)
			assert.Equal(t, len(files), total, "each migration applied exactly once across all migrators")
		})
	}
}

func TestAccounts(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		a, err := s.CreateAccount(ctx, store.Account{
			Kind: store.KindOpenAI, Label: "team key", BaseURL: "http://127.0.0.1:1/v1",
			Organization: "org-a", Tags: []string{"team", " blue "}, Priority: 5, MaxConcurrency: 3,
		}, store.Credentials{APIKey: "sk-live-secret"})
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(a.ID, "acc_"))
		assert.Equal(t, store.StatusActive, a.Status)
		assert.Equal(t, []string{"team", "blue"}, a.Tags)
		assert.Equal(t, 5, a.Priority)
		assert.False(t, a.CreatedAt.IsZero())

		c, err := s.Credentials(ctx, a.ID)
		require.NoError(t, err)
		assert.Equal(t, "sk-live-secret", c.APIKey)

		_, err = s.CreateAccount(ctx, store.Account{ID: a.ID, Kind: store.KindOpenAI, Label: "dup"}, store.Credentials{})
		assert.ErrorIs(t, err, store.ErrConflict)
		_, err = s.CreateAccount(ctx, store.Account{Kind: "bogus", Label: "x"}, store.Credentials{})
		assert.Error(t, err)

		label, prio := "renamed", 9
		a2, err := s.UpdateAccount(ctx, a.ID, store.AccountPatch{Label: &label, Priority: &prio})
		require.NoError(t, err)
		assert.Equal(t, "renamed", a2.Label)
		assert.Equal(t, 9, a2.Priority)
		assert.Equal(t, "org-a", a2.Organization, "fields not in the patch are kept")

		until := time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()
		a3, err := s.SetAccountStatus(ctx, a.ID, store.StatusRateLimited, "usage_limit_reached", until)
		require.NoError(t, err)
		assert.Equal(t, store.StatusRateLimited, a3.Status)
		assert.Equal(t, "usage_limit_reached", a3.StatusReason)
		assert.True(t, until.Equal(a3.StatusUntil), "want %v got %v", until, a3.StatusUntil)
		_, err = s.SetAccountStatus(ctx, a.ID, "sleeping", "", time.Time{})
		assert.Error(t, err)

		b, err := s.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "plus", ChatGPTAccountID: "ws-1"},
			store.Credentials{AccessToken: "at-1", RefreshToken: "rt-1", IDToken: "id-1"})
		require.NoError(t, err)
		exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
		require.NoError(t, s.SetCredentials(ctx, b.ID, store.Credentials{AccessToken: "at-2", RefreshToken: "rt-2"}, exp))
		cb, err := s.Credentials(ctx, b.ID)
		require.NoError(t, err)
		assert.Equal(t, store.Credentials{AccessToken: "at-2", RefreshToken: "rt-2"}, cb)

		all, err := s.Accounts(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)
		assert.Equal(t, a.ID, all[0].ID, "higher priority first")

		require.NoError(t, s.DeleteAccount(ctx, b.ID))
		_, err = s.Account(ctx, b.ID)
		assert.ErrorIs(t, err, store.ErrNotFound)
		assert.ErrorIs(t, s.DeleteAccount(ctx, b.ID), store.ErrNotFound)
		_, err = s.UpdateAccount(ctx, "acc_missing", store.AccountPatch{Label: &label})
		assert.ErrorIs(t, err, store.ErrNotFound)
	})
}

// Credentials are encrypted at rest: the raw column holds no token, a store
// opened with another secret key cannot read them, and a ciphertext moved to
// another row does not open.
func TestCredentialsEncryptedAtRest(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			url := b.URL(t)
			s := storetest.Open(t, url, store.Options{})
			a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: "a"},
				store.Credentials{AccessToken: "at-very-secret", RefreshToken: "rt-very-secret"})
			require.NoError(t, err)
			other, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "b"}, store.Credentials{APIKey: "sk-b"})
			require.NoError(t, err)

			loc, err := store.ParseLocation(url)
			require.NoError(t, err)
			raw, err := sqlx.Open(string(loc.Dialect), loc.DSN)
			require.NoError(t, err)
			defer raw.Close()
			var sealed string
			require.NoError(t, raw.Get(&sealed, raw.Rebind(`SELECT credentials FROM accounts WHERE id = ?`), a.ID))
			assert.NotContains(t, sealed, "very-secret")

			wrong := storetest.Open(t, url, store.Options{SecretKey: []byte("another secret key entirely....")})
			_, err = wrong.Credentials(ctx, a.ID)
			assert.ErrorIs(t, err, store.ErrUnseal)

			_, err = raw.Exec(raw.Rebind(`UPDATE accounts SET credentials = ? WHERE id = ?`), sealed, other.ID)
			require.NoError(t, err)
			_, err = s.Credentials(ctx, other.ID)
			assert.ErrorIs(t, err, store.ErrUnseal, "ciphertext is bound to its row")
		})
	}
}

func TestClientKeys(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		ever, err := s.KeysEverCreated(ctx)
		require.NoError(t, err)
		assert.False(t, ever, "keyless until a key is created")

		k, secret, err := s.CreateClientKey(ctx, store.ClientKey{Name: "laptop", ScopeAccounts: []string{"acc_1", "acc_2"}, Models: []string{"gpt-5.5-codex"}})
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(secret, store.ClientKeyPrefix))
		assert.Len(t, secret, len(store.ClientKeyPrefix)+32)
		assert.True(t, strings.HasPrefix(secret, k.Prefix))
		assert.Equal(t, []string{"acc_1", "acc_2"}, k.ScopeAccounts)

		got, err := s.AuthenticateClientKey(ctx, secret)
		require.NoError(t, err)
		assert.Equal(t, k.ID, got.ID)
		_, err = s.AuthenticateClientKey(ctx, secret+"x")
		assert.ErrorIs(t, err, store.ErrKeyRejected)
		_, err = s.AuthenticateClientKey(ctx, "sk-not-ours")
		assert.ErrorIs(t, err, store.ErrKeyRejected)

		used := time.Now().Truncate(time.Millisecond)
		require.NoError(t, s.AddClientKeyUse(ctx, map[string]int64{k.ID: 3}, used))
		require.NoError(t, s.AddClientKeyUse(ctx, map[string]int64{k.ID: 1}, used.Add(time.Second)))
		touched, err := s.ClientKey(ctx, k.ID)
		require.NoError(t, err)
		assert.EqualValues(t, 4, touched.RequestCount)
		assert.True(t, used.Add(time.Second).Equal(touched.LastUsedAt), "last used %v", touched.LastUsedAt)

		current, err := s.CurrentClientKey(ctx, k.ID)
		require.NoError(t, err)
		assert.True(t, current.Usable(time.Now()))
		changed := current
		changed.Name, changed.ScopeAccounts, changed.Models = "laptop, renamed", []string{"acc_2"}, nil
		changed.ExpiresAt = time.Now().Add(time.Hour).Truncate(time.Millisecond)
		updated, err := s.UpdateClientKey(ctx, changed)
		require.NoError(t, err)
		assert.Equal(t, "laptop, renamed", updated.Name)
		assert.Equal(t, []string{"acc_2"}, updated.ScopeAccounts)
		assert.Empty(t, updated.Models)
		assert.True(t, changed.ExpiresAt.Equal(updated.ExpiresAt))
		assert.Equal(t, k.Prefix, updated.Prefix, "the secret is kept")
		current, err = s.CurrentClientKey(ctx, k.ID)
		require.NoError(t, err)
		assert.Equal(t, []string{"acc_2"}, current.ScopeAccounts, "the cached read is dropped by the change")
		authed, err := s.AuthenticateClientKey(ctx, secret)
		require.NoError(t, err)
		assert.Equal(t, []string{"acc_2"}, authed.ScopeAccounts, "the key found by its secret is dropped by the change too")
		_, err = s.UpdateClientKey(ctx, store.ClientKey{ID: "key_missing", Name: "x"})
		assert.ErrorIs(t, err, store.ErrNotFound)
		revoked, err := s.RevokeClientKey(ctx, k.ID)
		require.NoError(t, err)
		assert.False(t, revoked.RevokedAt.IsZero())
		_, err = s.AuthenticateClientKey(ctx, secret)
		assert.ErrorIs(t, err, store.ErrKeyRejected, "a revoked key is refused at once")
		current, err = s.CurrentClientKey(ctx, k.ID)
		require.NoError(t, err)
		assert.False(t, current.Usable(time.Now()), "the cached read is dropped by the revocation")
		ever, err = s.KeysEverCreated(ctx)
		require.NoError(t, err)
		assert.True(t, ever, "revoking the last key never makes the relay keyless again")
		_, err = s.RevokeClientKey(ctx, "key_missing")
		assert.ErrorIs(t, err, store.ErrNotFound)

		_, expSecret, err := s.CreateClientKey(ctx, store.ClientKey{Name: "old", ExpiresAt: time.Now().Add(-time.Minute)})
		require.NoError(t, err)
		_, err = s.AuthenticateClientKey(ctx, expSecret)
		assert.ErrorIs(t, err, store.ErrKeyRejected, "an expired key is refused")

		_, _, err = s.CreateClientKey(ctx, store.ClientKey{Name: "live"})
		require.NoError(t, err)
		keys, err := s.ClientKeys(ctx)
		require.NoError(t, err)
		assert.Len(t, keys, 3)
	})
}

func TestClientKeyScope(t *testing.T) {
	t.Parallel()
	a := store.Account{ID: "acc_1", Tags: []string{"blue"}}
	cases := []struct {
		name string
		key  store.ClientKey
		want bool
	}{
		{"no scope admits all", store.ClientKey{}, true},
		{"listed", store.ClientKey{ScopeAccounts: []string{"acc_0", "acc_1"}}, true},
		{"not listed", store.ClientKey{ScopeAccounts: []string{"acc_0"}}, false},
		{"tag", store.ClientKey{ScopeTag: "blue"}, true},
		{"other tag", store.ClientKey{ScopeTag: "red"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.key.AllowsAccount(a)) })
	}
}

func TestSettings(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		_, ok, err := s.Setting(ctx, "x")
		require.NoError(t, err)
		assert.False(t, ok)
		wrote, err := s.SetSettingIfAbsent(ctx, "x", "1")
		require.NoError(t, err)
		assert.True(t, wrote)
		wrote, err = s.SetSettingIfAbsent(ctx, "x", "2")
		require.NoError(t, err)
		assert.False(t, wrote, "the first writer wins")
		require.NoError(t, s.SetSetting(ctx, "x", "3"))
		v, ok, err := s.Setting(ctx, "x")
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, "3", v)
	})
}
