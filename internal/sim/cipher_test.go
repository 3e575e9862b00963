package sim

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestSealer(t *testing.T) {
	t.Parallel()
	s := sealer{secret: []byte("secret")}
	ct := s.seal("org-x", CipherReasoning, []byte("thoughts"))
	require.True(t, strings.HasPrefix(ct, cipherPrefix))

	tamper := func(ct string) string {
		b := []byte(ct)
		i := len(cipherPrefix) + 20
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	tests := []struct {
		name   string
		sealer sealer
		org    string
		kind   CipherKind
		ct     string
		wantOK bool
	}{
		{"same organisation", s, "org-x", CipherReasoning, ct, true},
		{"other organisation", s, "org-y", CipherReasoning, ct, false},
		{"other kind", s, "org-x", CipherCompaction, ct, false},
		{"tampered", s, "org-x", CipherReasoning, tamper(ct), false},
		{"truncated", s, "org-x", CipherReasoning, ct[:len(ct)-4], false},
		{"other sim secret", sealer{secret: []byte("other")}, "org-x", CipherReasoning, ct, false},
		{"not the sim's format", s, "org-x", CipherReasoning, "gAAAAABfoo", false},
		{"bad base64", s, "org-x", CipherReasoning, cipherPrefix + "!!!", false},
		{"too short", s, "org-x", CipherReasoning, cipherPrefix + "AAAA", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			plain, err := tt.sealer.open(tt.org, tt.kind, tt.ct)
			if tt.wantOK {
				require.NoError(t, err)
				assert.Equal(t, "thoughts", string(plain))
			} else {
				assert.ErrorIs(t, err, errCiphertext)
			}
		})
	}
	assert.NotEqual(t, ct, s.seal("org-x", CipherReasoning, []byte("thoughts")), "a fresh nonce every time")
}

// TestOrganisationBoundCiphertext pins what a relay meets when a history
// moves between accounts: reasoning and compaction ciphertext of another
// organisation (or tampered) fails with invalid_encrypted_content, and
// ciphertext the relay cannot strip fails without a code, "could not be
// decrypted".
func TestOrganisationBoundCiphertext(t *testing.T) {
	t.Parallel()
	accts := testAccounts()
	accts[0].SealMessages = true  // a1 emits encrypted message bodies
	accts[0].SealToolCalls = true // and encrypted tool-call arguments
	upstream := newSim(t, Config{Accounts: accts})

	// A turn on a1 (org-x) produces a reasoning item and a sealed message.
	_, evs, err := clientFor(t, upstream, "a1").turn(prompt(t, "hello"))
	require.NoError(t, err)
	items := outputItems(evs)
	require.Len(t, items, 2)
	reasoning, message := items[0], items[1]
	require.NotEmpty(t, reasoning["encrypted_content"])
	require.NotEmpty(t, message["encrypted_content"], "SealMessages: the message carries its own ciphertext")
	_, evs, err = clientFor(t, upstream, "a1").turn(prompt(t, `[[sim:tool exec_command {"cmd":"true"}]]`))
	require.NoError(t, err)
	call := outputItems(evs)[1]
	require.NotEmpty(t, call["encrypted_content"], "SealToolCalls: the call carries its own ciphertext")

	tampered := func(item map[string]any) map[string]any {
		c := map[string]any{}
		for k, v := range item {
			c[k] = v
		}
		ct := c["encrypted_content"].(string)
		c["encrypted_content"] = ct[:len(ct)-3] + "AAA"
		return c
	}
	strip := func(item map[string]any) map[string]any {
		c := map[string]any{}
		for k, v := range item {
			if k != "encrypted_content" {
				c[k] = v
			}
		}
		return c
	}
	history := func(extra ...map[string]any) []byte {
		input := []any{devMsg("x"), userMsg("hello")}
		for _, it := range extra {
			input = append(input, it)
		}
		return body(t, append(input, userMsg("next")), nil)
	}
	tests := []struct {
		name        string
		account     string
		body        []byte
		wantStatus  int
		wantCode    string
		wantMessage string
	}{
		{"reasoning, same account", "a1", history(reasoning), 200, "", ""},
		{"reasoning, same organisation", "a2", history(reasoning), 200, "", ""},
		{"reasoning, same organisation over the API", "k1", history(reasoning), 200, "", ""},
		{"reasoning, other organisation", "b1", history(reasoning), 400, wire.CodeInvalidEncryptedContent, "could not be verified"},
		{"reasoning, tampered", "a1", history(tampered(reasoning)), 400, wire.CodeInvalidEncryptedContent, "could not be verified"},
		{"reasoning stripped, other organisation", "b1", history(strip(reasoning)), 200, "", ""},
		{"sealed message, same organisation", "a2", history(reasoning, message), 200, "", ""},
		{"sealed message, other organisation", "b1", history(strip(reasoning), message), 400, "", "could not be decrypted"},
		{"sealed message, tampered", "a1", history(tampered(message)), 400, "", "could not be decrypted"},
		{"sealed tool call, other organisation", "b1", history(call), 400, "", "could not be decrypted"},
		{"sealed tool call, same organisation", "a2", history(call), 200, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := clientFor(t, upstream, tt.account).turn(tt.body)
			if tt.wantStatus == 200 {
				require.NoError(t, err)
				return
			}
			status, e := errorOf(t, err)
			assert.Equal(t, tt.wantStatus, status)
			assert.Equal(t, tt.wantCode, e.Code)
			assert.Equal(t, wire.TypeInvalidRequest, e.Type)
			assert.Contains(t, e.Message, tt.wantMessage)
		})
	}
}

func TestSealDirective(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	_, evs, err := clientFor(t, upstream, "b1").turn(prompt(t, "[[sim:seal]] secret answer"))
	require.NoError(t, err)
	msg := outputItems(evs)[1]
	ct, _ := msg["encrypted_content"].(string)
	require.NotEmpty(t, ct)
	plain, err := upstream.Decrypt("org-y", CipherMessage, ct)
	require.NoError(t, err)
	assert.Equal(t, answerText(evs), plain)

	_, _, err = clientFor(t, upstream, "a1").turn(body(t, []any{userMsg("x"), msg, userMsg("y")}, nil))
	status, e := errorOf(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Empty(t, e.Code)
	assert.Contains(t, e.Message, "could not be decrypted")
}

func TestEncryptedContentHelper(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{})
	foreign := map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{},
		"encrypted_content": upstream.EncryptedContent("org-y", CipherReasoning, "b's thoughts")}
	_, _, err := clientFor(t, upstream, "b1").turn(body(t, []any{userMsg("x"), foreign, userMsg("y")}, nil))
	require.NoError(t, err)
	_, _, err = clientFor(t, upstream, "a1").turn(body(t, []any{userMsg("x"), foreign, userMsg("y")}, nil))
	_, e := errorOf(t, err)
	assert.Equal(t, wire.CodeInvalidEncryptedContent, e.Code)
	assert.Contains(t, e.Message, "rs_1")

	// A fixed CipherSecret keeps ciphertext valid across sims.
	one := newSim(t, Config{CipherSecret: []byte("k")})
	two := newSim(t, Config{CipherSecret: []byte("k")})
	_, err = two.Decrypt("org-x", CipherReasoning, one.EncryptedContent("org-x", CipherReasoning, "p"))
	assert.NoError(t, err)
}
