package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/codexrelay/codex-relay/internal/budget"
)

// ClientKeyPrefix starts every relay client key, so a leaked one is easy to
// recognise and never mistaken for an upstream key.
const ClientKeyPrefix = "crk_"

// ClientKey is a relay key Codex authenticates with. Only a hash of the
// secret is stored; the secret is shown once, when the key is created.
type ClientKey struct {
	ID            string
	Name          string
	Prefix        string   // the first characters of the secret, for display
	ScopeAccounts []string // empty: every account (unless ScopeTag is set)
	ScopeTag      string   // accounts carrying this tag
	Models        []string // empty: every model
	ExpiresAt     time.Time
	CreatedAt     time.Time
	LastUsedAt    time.Time
	RevokedAt     time.Time
	RequestCount  int64
	// Limits are the key's budgets (see package budget); none: unlimited.
	Limits []budget.Limit
	// Policy is the key's model policy.
	Policy KeyPolicy
}

// KeyPolicy is what a key may ask of the upstream beyond its model
// allow-list.
type KeyPolicy struct {
	// ModelAliases maps a model name the key asks for to the model the
	// upstream gets ("fast" -> "gpt-5.1-codex-mini").
	ModelAliases map[string]string `json:"model_aliases,omitempty"`
	// MaxReasoningEffort caps reasoning.effort (minimal, low, medium, high,
	// xhigh); "" leaves it as asked.
	MaxReasoningEffort string `json:"max_reasoning_effort,omitempty"`
	// PriorityTier is what a request for the priority service tier gets:
	// "" or "allow" passes it on, "refuse" refuses the request, "downgrade"
	// sends it at the default tier.
	PriorityTier string `json:"priority_tier,omitempty"`
}

// IsZero reports a policy that changes nothing.
func (p KeyPolicy) IsZero() bool {
	return len(p.ModelAliases) == 0 && p.MaxReasoningEffort == "" && (p.PriorityTier == "" || p.PriorityTier == "allow")
}

// AllowsAccount reports whether the key's scope admits account a.
func (k ClientKey) AllowsAccount(a Account) bool {
	if len(k.ScopeAccounts) == 0 && k.ScopeTag == "" {
		return true
	}
	for _, id := range k.ScopeAccounts {
		if id == a.ID {
			return true
		}
	}
	if k.ScopeTag != "" {
		for _, t := range a.Tags {
			if t == k.ScopeTag {
				return true
			}
		}
	}
	return false
}

// Usable reports whether the key may authenticate at now.
func (k ClientKey) Usable(now time.Time) bool {
	return k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}

type clientKeyRow struct {
	ID            string `db:"id"`
	Name          string `db:"name"`
	Prefix        string `db:"prefix"`
	KeyHash       string `db:"key_hash"`
	ScopeAccounts string `db:"scope_accounts"`
	ScopeTag      string `db:"scope_tag"`
	Models        string `db:"models"`
	ExpiresAt     *int64 `db:"expires_at"`
	CreatedAt     int64  `db:"created_at"`
	LastUsedAt    *int64 `db:"last_used_at"`
	RevokedAt     *int64 `db:"revoked_at"`
	RequestCount  int64  `db:"request_count"`
	Limits        string `db:"limits"`
	Policy        string `db:"policy"`
}

func (r clientKeyRow) key() ClientKey {
	k := ClientKey{
		ID: r.ID, Name: r.Name, Prefix: r.Prefix,
		ScopeAccounts: splitList(r.ScopeAccounts), ScopeTag: r.ScopeTag, Models: splitList(r.Models),
		ExpiresAt: fromMillis(r.ExpiresAt), CreatedAt: time.UnixMilli(r.CreatedAt).UTC(),
		LastUsedAt: fromMillis(r.LastUsedAt), RevokedAt: fromMillis(r.RevokedAt), RequestCount: r.RequestCount,
	}
	// Both are written by this package from validated values; a row that
	// does not read is treated as having none (and logged by no one: the
	// write path cannot produce it).
	if r.Limits != "" {
		_ = json.Unmarshal([]byte(r.Limits), &k.Limits)
	}
	if r.Policy != "" {
		_ = json.Unmarshal([]byte(r.Policy), &k.Policy)
	}
	return k
}

// keyLimitsJSON and keyPolicyJSON are a key's limits and policy as stored
// ("" for none).
func keyLimitsJSON(ls []budget.Limit) string {
	if len(ls) == 0 {
		return ""
	}
	b, _ := json.Marshal(ls)
	return string(b)
}

func keyPolicyJSON(p KeyPolicy) string {
	if p.IsZero() {
		return ""
	}
	b, _ := json.Marshal(p)
	return string(b)
}

const clientKeyColumns = `id, name, prefix, key_hash, scope_accounts, scope_tag, models, expires_at,
	created_at, last_used_at, revoked_at, request_count, limits, policy`

// HashClientKey is the stored form of a client key secret. The secret holds
// 190 random bits, so a plain SHA-256 cannot be reversed or guessed.
func HashClientKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomToken returns n characters drawn uniformly from base62.
func randomToken(n int) string {
	b := make([]byte, n)
	max := big.NewInt(int64(len(base62)))
	for i := range b {
		v, err := rand.Int(rand.Reader, max)
		if err != nil {
			panic("crypto/rand failed: " + err.Error())
		}
		b[i] = base62[v.Int64()]
	}
	return string(b)
}

// NewSecret returns prefix followed by 32 random base62 characters.
func NewSecret(prefix string) string { return prefix + randomToken(32) }

// CreateClientKey makes a new key and returns it with its secret, which is
// not stored and cannot be read again.
func (s *Store) CreateClientKey(ctx context.Context, k ClientKey) (ClientKey, string, error) {
	now := s.now()
	secret := NewSecret(ClientKeyPrefix)
	k.ID = NewID("key", now)
	k.Prefix = secret[:len(ClientKeyPrefix)+6]
	if err := budget.ValidateAll(k.Limits); err != nil {
		return ClientKey{}, "", fmt.Errorf("create client key: %w", err)
	}
	_, err := s.exec(ctx, `INSERT INTO client_keys (id, name, prefix, key_hash, scope_accounts,
		scope_tag, models, expires_at, created_at, limits, policy) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, k.Prefix, HashClientKey(secret), joinList(k.ScopeAccounts), strings.TrimSpace(k.ScopeTag),
		joinList(k.Models), millis(k.ExpiresAt), now.UnixMilli(), keyLimitsJSON(k.Limits), keyPolicyJSON(k.Policy))
	if err != nil {
		return ClientKey{}, "", fmt.Errorf("create client key: %w", err)
	}
	s.keysChanged(ctx)
	created, err := s.ClientKey(ctx, k.ID)
	return created, secret, err
}

// ClientKey reads one key by id.
func (s *Store) ClientKey(ctx context.Context, id string) (ClientKey, error) {
	var r clientKeyRow
	err := s.get(ctx, &r, `SELECT `+clientKeyColumns+` FROM client_keys WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return ClientKey{}, fmt.Errorf("client key %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return ClientKey{}, fmt.Errorf("read client key: %w", err)
	}
	return r.key(), nil
}

// ClientKeys lists every key, revoked ones included, newest first.
func (s *Store) ClientKeys(ctx context.Context) ([]ClientKey, error) {
	var rows []clientKeyRow
	if err := s.selectAll(ctx, &rows, `SELECT `+clientKeyColumns+` FROM client_keys ORDER BY created_at DESC, id DESC`); err != nil {
		return nil, fmt.Errorf("list client keys: %w", err)
	}
	out := make([]ClientKey, len(rows))
	for i, r := range rows {
		out[i] = r.key()
	}
	return out, nil
}

// RevokeClientKey revokes a key at once; revoking twice keeps the first time.
func (s *Store) RevokeClientKey(ctx context.Context, id string) (ClientKey, error) {
	res, err := s.exec(ctx, `UPDATE client_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`,
		s.now().UnixMilli(), id)
	if err := affectedOne(res, err, "revoke client key", id); err != nil {
		return ClientKey{}, err
	}
	s.keysChanged(ctx)
	return s.ClientKey(ctx, id)
}

// UpdateClientKey changes a key's name, account scope, models, expiry,
// limits and policy to k's (its id names it; the secret, creation and use
// are kept). Every replica sees the change at once: an open WebSocket's
// next request is served under the new scope and limits.
func (s *Store) UpdateClientKey(ctx context.Context, k ClientKey) (ClientKey, error) {
	if err := budget.ValidateAll(k.Limits); err != nil {
		return ClientKey{}, fmt.Errorf("update client key: %w", err)
	}
	res, err := s.exec(ctx, `UPDATE client_keys SET name = ?, scope_accounts = ?, scope_tag = ?, models = ?, expires_at = ?,
		limits = ?, policy = ? WHERE id = ?`,
		k.Name, joinList(k.ScopeAccounts), strings.TrimSpace(k.ScopeTag), joinList(k.Models), millis(k.ExpiresAt),
		keyLimitsJSON(k.Limits), keyPolicyJSON(k.Policy), k.ID)
	if err := affectedOne(res, err, "update client key", k.ID); err != nil {
		return ClientKey{}, err
	}
	s.keysChanged(ctx)
	return s.ClientKey(ctx, k.ID)
}

// ErrKeyRejected means a presented client key is unknown, revoked or expired.
var ErrKeyRejected = errors.New("client key rejected")

// AuthenticateClientKey finds the usable key whose secret is presented.
// A key found is remembered by its secret's hash as CurrentClientKey
// remembers reads by id (every write to a key forgets it at once, on every
// replica); a secret that matches no key is looked up every time, so a key
// works the moment it is created.
func (s *Store) AuthenticateClientKey(ctx context.Context, secret string) (ClientKey, error) {
	if !strings.HasPrefix(secret, ClientKeyPrefix) {
		return ClientKey{}, ErrKeyRejected
	}
	hash := HashClientKey(secret)
	k, err := s.rememberedKey(ctx, byHash(hash), func(ctx context.Context) (ClientKey, error) {
		var r clientKeyRow
		err := s.get(ctx, &r, `SELECT `+clientKeyColumns+` FROM client_keys WHERE key_hash = ?`, hash)
		if errors.Is(err, sql.ErrNoRows) {
			return ClientKey{}, ErrKeyRejected
		}
		if err != nil {
			return ClientKey{}, fmt.Errorf("authenticate client key: %w", err)
		}
		return r.key(), nil
	})
	if err != nil {
		return ClientKey{}, err
	}
	if !k.Usable(s.now()) {
		return ClientKey{}, ErrKeyRejected
	}
	return k, nil
}

// rememberedKey returns the key the cache keeps under entry (an id, or
// byHash of a secret's hash), or reads it (one read for the callers that
// miss it at once) and keeps it. A read that fails is not kept.
func (s *Store) rememberedKey(ctx context.Context, entry string, read func(context.Context) (ClientKey, error)) (ClientKey, error) {
	now := s.now()
	k, gen, ok := s.keys.cached(entry, now)
	if ok {
		return k, nil
	}
	return shared(ctx, &s.flight, flightKey("key", gen, entry), func(ctx context.Context) (ClientKey, error) {
		k, err := read(ctx)
		if err != nil {
			return ClientKey{}, err
		}
		s.keys.keep(entry, k, gen, now)
		return k, nil
	})
}

// byHash is the key cache's entry for a key found by its secret's hash
// (ids never begin with '#').
func byHash(hash string) string { return "#" + hash }

// KeysEverCreated reports whether a client key was ever created, revoked
// and expired ones included. Keyless mode (loopback clients served without
// a key) is a choice made once, by creating none: revoking or expiring the
// last key never re-opens it. Once true it is remembered, since keys are
// never deleted; "none yet" is reused for keysTTL (a key created through
// any replica ends it at once: see keysChanged).
func (s *Store) KeysEverCreated(ctx context.Context) (bool, error) {
	now := s.now()
	if ever, known := s.keys.everCreated(now); known {
		return ever, nil
	}
	var n int
	if err := s.get(ctx, &n, `SELECT COUNT(*) FROM client_keys`); err != nil {
		return false, fmt.Errorf("count client keys: %w", err)
	}
	s.keys.sawKeys(n > 0, now)
	return n > 0, nil
}

// CurrentClientKey reads a key by id as it stands now, for a client already
// authenticated with it (an open WebSocket checks its key on every
// request). Reads are reused for keysTTL; every write to a key drops them
// at once, on every replica (announced like account writes).
func (s *Store) CurrentClientKey(ctx context.Context, id string) (ClientKey, error) {
	return s.rememberedKey(ctx, id, func(ctx context.Context) (ClientKey, error) { return s.ClientKey(ctx, id) })
}

// AddClientKeyUse records requests made with keys: uses maps a key id to
// how many, all made by at (its last use). One transaction for them all,
// updating the keys in the order of their ids: two replicas' transactions
// lock the keys they share in the same order, so they never deadlock (a
// transaction PostgreSQL aborted for a deadlock would lose its counts).
func (s *Store) AddClientKeyUse(ctx context.Context, uses map[string]int64, at time.Time) error {
	if len(uses) == 0 {
		return nil
	}
	const q = `UPDATE client_keys SET last_used_at = ?, request_count = request_count + ? WHERE id = ?`
	s.warm(ctx, q)
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		exec := s.execIn(tx)
		for _, id := range slices.Sorted(maps.Keys(uses)) {
			if _, err := exec(ctx, q, at.UnixMilli(), uses[id], id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record client key use: %w", err)
	}
	return nil
}
