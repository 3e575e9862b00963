package sim

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// CipherKind is what a piece of ciphertext encrypts. It is bound into the
// ciphertext, so a reasoning blob pasted into a compaction item is rejected
// as tampered.
type CipherKind string

const (
	CipherReasoning  CipherKind = "reasoning"
	CipherCompaction CipherKind = "compaction"
	CipherMessage    CipherKind = "message"
	CipherToolCall   CipherKind = "tool_call"
)

// cipherPrefix marks the sim's ciphertext; the version byte follows inside.
const cipherPrefix = "sim1."

var errCiphertext = errors.New("ciphertext does not verify for this organisation")

// sealer encrypts and authenticates content for one organisation at a time,
// with AES-256-GCM under a key derived from the sim's secret and the
// organisation's name: an account of another organisation derives another
// key, and any changed byte fails the tag. Static after construction; safe
// for concurrent use.
type sealer struct {
	secret []byte
}

func (s sealer) aead(org string) cipher.AEAD {
	mac := hmac.New(sha256.New, s.secret)
	mac.Write([]byte("codex-relay sim organisation key\x00"))
	mac.Write([]byte(org))
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// seal encrypts plaintext for org as the given kind of content.
func (s sealer) seal(org string, kind CipherKind, plaintext []byte) string {
	aead := s.aead(org)
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails
	out := aead.Seal(nonce, nonce, plaintext, []byte(kind))
	return cipherPrefix + base64.RawURLEncoding.EncodeToString(out)
}

// open decrypts ciphertext that org issued as the given kind. Anything else
// (another organisation's, another kind's, a changed byte, not the sim's
// format) fails.
func (s sealer) open(org string, kind CipherKind, ciphertext string) ([]byte, error) {
	raw, ok := strings.CutPrefix(ciphertext, cipherPrefix)
	if !ok {
		return nil, errCiphertext
	}
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return nil, errCiphertext
	}
	aead := s.aead(org)
	if len(b) < aead.NonceSize()+aead.Overhead() {
		return nil, errCiphertext
	}
	nonce, body := b[:aead.NonceSize()], b[aead.NonceSize():]
	plain, err := aead.Open(nil, nonce, body, []byte(kind))
	if err != nil {
		return nil, errCiphertext
	}
	return plain, nil
}

// EncryptedContent returns ciphertext of the given kind that accounts of
// organisation org accept, as the sim itself emits it. Tests use it to build
// histories that carry another organisation's ciphertext.
func (s *Server) EncryptedContent(org string, kind CipherKind, plaintext string) string {
	return s.sealer.seal(org, kind, []byte(plaintext))
}

// Decrypt returns the plaintext of ciphertext that organisation org issued
// as the given kind, or an error when an account of org would reject it.
func (s *Server) Decrypt(org string, kind CipherKind, ciphertext string) (string, error) {
	b, err := s.sealer.open(org, kind, ciphertext)
	return string(b), err
}
