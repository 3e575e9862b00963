package wire

import "regexp"

// secretShaped matches what a credential looks like in text an upstream
// wrote back: an OpenAI API key (sk-..., sk-proj-...), the relay's own
// client and admin keys (crk_, cra_), a JWT (a ChatGPT access or ID token),
// and whatever follows "Bearer ".
var secretShaped = regexp.MustCompile(`(?i)\b(?:bearer\s+\S+|sk-[a-z0-9_\-]{6,}|cr[ak]_[a-z0-9]{6,}|eyJ[a-z0-9_\-]{8,}\.[a-z0-9_\-]{8,}\.[a-z0-9_\-]*)`)

// MaskSecrets replaces every credential-shaped run in b (see secretShaped)
// with its first four characters and "***". b itself is returned when it
// holds none, so a clean error body costs one scan.
func MaskSecrets(b []byte) []byte {
	if !secretShaped.Match(b) {
		return b
	}
	return secretShaped.ReplaceAllFunc(b, func(m []byte) []byte {
		out := make([]byte, 0, 7)
		return append(append(out, m[:min(4, len(m))]...), "***"...)
	})
}

// MaskSecretsString is MaskSecrets for a string.
func MaskSecretsString(s string) string {
	if !secretShaped.MatchString(s) {
		return s
	}
	return string(MaskSecrets([]byte(s)))
}
