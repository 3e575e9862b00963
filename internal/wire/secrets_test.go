package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMaskSecrets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Incorrect API key provided: Bearer sk-proj-abcdefghijkl1234.": "Incorrect API key provided: Bear***",
		"Incorrect API key provided: sk-abcdef123456. You can find":    "Incorrect API key provided: sk-a***. You can find",
		"token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig_x": "token eyJh***",
		"client crk_ABCdef123456 and admin cra_xyz789abc":              "client crk_*** and admin cra_***",
		"rate limit reached for gpt-5.5 in organization org-abc":       "rate limit reached for gpt-5.5 in organization org-abc",
		"the task-runner failed":                                       "the task-runner failed",
	} {
		assert.Equal(t, want, MaskSecretsString(in), in)
		assert.Equal(t, want, string(MaskSecrets([]byte(in))), in)
	}
}
