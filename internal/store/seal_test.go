package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSealer(t *testing.T) {
	t.Parallel()
	_, err := NewSealer([]byte("short"))
	require.Error(t, err, "a short secret key is refused")
	s, err := NewSealer([]byte("0123456789abcdef0123"))
	require.NoError(t, err)
	sealed, err := s.Seal([]byte("token"), []byte("row-1"))
	require.NoError(t, err)
	again, err := s.Seal([]byte("token"), []byte("row-1"))
	require.NoError(t, err)
	assert.NotEqual(t, sealed, again, "every seal has its own nonce")

	pt, err := s.Open(sealed, []byte("row-1"))
	require.NoError(t, err)
	assert.Equal(t, "token", string(pt))
	_, err = s.Open(sealed, []byte("row-2"))
	assert.ErrorIs(t, err, ErrUnseal)
	tampered := []byte(sealed)
	tampered[len(tampered)-3] ^= 1
	_, err = s.Open(string(tampered), []byte("row-1"))
	assert.ErrorIs(t, err, ErrUnseal)
	_, err = s.Open("not base64!", nil)
	assert.ErrorIs(t, err, ErrUnseal)
}

func TestNewIDSortsByTimeAndIsUnique(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_800_000_000_000)
	seen := map[string]bool{}
	prev := ""
	for i := range 1000 {
		id := NewID("x", base.Add(time.Duration(i)*time.Millisecond))
		assert.Len(t, id, 2+26)
		assert.False(t, seen[id])
		seen[id] = true
		assert.Greater(t, id, prev, "ids sort by creation time")
		prev = id
	}
}
