package app

import "crypto/sha256"

// The purposes keys are derived from the secret key for (see derivedKey).
const (
	sessionKeyPurpose = "codex-relay console sessions v1"
	hopKeyPurpose     = "codex-relay replica hop v1"
)

// derivedKey derives a key for one purpose from the secret key, so every
// replica (sharing the secret) derives the same: console sessions survive a
// restart and hold on every replica, and replicas accept each other's
// forwarded requests. Nil without a secret.
func derivedKey(secret []byte, purpose string) []byte {
	if secret == nil {
		return nil
	}
	h := sha256.New()
	h.Write([]byte(purpose + "\x00"))
	h.Write(secret)
	return h.Sum(nil)
}
