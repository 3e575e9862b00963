package relay

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func zstdBytes(t *testing.T, b []byte) []byte {
	enc, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

func gzipBytes(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	_, err := gz.Write(b)
	require.NoError(t, err)
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

func TestReadBody(t *testing.T) {
	t.Parallel()
	plain := []byte(`{"model":"m","input":[]}`)
	bomb := zstdBytes(t, bytes.Repeat([]byte("a"), 4<<20))
	cases := []struct {
		name     string
		body     []byte
		encoding string
		limit    int64
		want     []byte
		status   int
	}{
		{"plain", plain, "", 1 << 20, plain, 0},
		{"zstd", zstdBytes(t, plain), "zstd", 1 << 20, plain, 0},
		{"gzip", gzipBytes(t, plain), "GZIP", 1 << 20, plain, 0},
		{"too large raw", bytes.Repeat([]byte("x"), 2048), "", 1024, nil, http.StatusRequestEntityTooLarge},
		{"zstd bomb stops at the limit", bomb, "zstd", 1 << 20, nil, http.StatusRequestEntityTooLarge},
		{"broken zstd", []byte("not zstd at all"), "zstd", 1 << 20, nil, http.StatusBadRequest},
		{"broken gzip", []byte("not gzip"), "gzip", 1 << 20, nil, http.StatusBadRequest},
		{"unknown encoding", plain, "br", 1 << 20, nil, http.StatusUnsupportedMediaType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", bytes.NewReader(tc.body))
			if tc.encoding != "" {
				r.Header.Set("Content-Encoding", tc.encoding)
			}
			got, err := readBody(r, tc.limit)
			if tc.status == 0 {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			a := bodyError(err)
			assert.Equal(t, tc.status, a.status)
			assert.NotEmpty(t, a.err.Message)
			assert.False(t, strings.Contains(a.err.Message, "\x00"))
		})
	}
}
