package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// MinSecretKeyLen is the shortest secret key accepted, in bytes.
const MinSecretKeyLen = 16

// Sealer encrypts small secrets (account credentials) with AES-256-GCM under
// a key derived from the relay's secret key. Each sealed value carries its own
// random nonce and a version byte; the row id is bound in as associated data,
// so a ciphertext copied onto another row does not open.
type Sealer struct {
	aead cipher.AEAD // static after construction
}

const sealVersion = 1

// NewSealer derives the AES key as SHA-256 over a fixed label and the secret
// key, so any sufficiently long secret (random bytes, base64, a passphrase)
// gives a full-strength key.
func NewSealer(secret []byte) (*Sealer, error) {
	if len(secret) < MinSecretKeyLen {
		return nil, fmt.Errorf("secret key: need at least %d bytes, got %d", MinSecretKeyLen, len(secret))
	}
	h := sha256.New()
	h.Write([]byte("codex-relay credentials v1\x00"))
	h.Write(secret)
	block, err := aes.NewCipher(h.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext bound to aad and returns base64 text.
func (s *Sealer) Seal(plaintext, aad []byte) (string, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	out := make([]byte, 0, 1+len(nonce)+len(plaintext)+s.aead.Overhead())
	out = append(out, sealVersion)
	out = append(out, nonce...)
	out = s.aead.Seal(out, nonce, plaintext, aad)
	return base64.StdEncoding.EncodeToString(out), nil
}

// ErrUnseal means a sealed value could not be opened: wrong secret key,
// tampering, or a value moved from another row.
var ErrUnseal = errors.New("credentials could not be decrypted (wrong CODEX_RELAY_SECRET_KEY?)")

// Open decrypts a value made by Seal with the same aad.
func (s *Sealer) Open(sealed string, aad []byte) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil {
		return nil, ErrUnseal
	}
	ns := s.aead.NonceSize()
	if len(raw) < 1+ns+s.aead.Overhead() || raw[0] != sealVersion {
		return nil, ErrUnseal
	}
	pt, err := s.aead.Open(nil, raw[1:1+ns], raw[1+ns:], aad)
	if err != nil {
		return nil, ErrUnseal
	}
	return pt, nil
}
