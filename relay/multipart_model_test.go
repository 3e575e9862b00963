package relay

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func multipartOf(t *testing.T, fields ...[2]string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range fields {
		if f[0] == "image" {
			fw, err := mw.CreateFormFile("image", "a.png")
			require.NoError(t, err)
			_, _ = io.WriteString(fw, f[1])
			continue
		}
		require.NoError(t, mw.WriteField(f[0], f[1]))
	}
	require.NoError(t, mw.Close())
	return buf.Bytes(), mw.Boundary()
}

// The watch passes an allowed body on byte for byte, however it is read;
// a refused one fails before its last bytes (the closing delimiter) are
// passed, so what went on is never a whole body.
func TestModelWatch(t *testing.T) {
	t.Parallel()
	allowOnly := func(want string) func(string) error {
		return func(m string) error {
			if m == want {
				return nil
			}
			return refuse(http.StatusForbidden, "model_not_allowed", "no")
		}
	}
	big := strings.Repeat("p", 100_000)
	for _, tc := range []struct {
		name    string
		fields  [][2]string
		reader  func(io.Reader) io.Reader
		allowed bool
	}{
		{"model first", [][2]string{{"model", "m1"}, {"image", big}}, nil, true},
		{"model last, one byte a read", [][2]string{{"image", big}, {"prompt", "x"}, {"model", "m1"}}, iotest.OneByteReader, true},
		{"model last, half reads", [][2]string{{"image", big}, {"model", " m1 "}}, iotest.HalfReader, true},
		{"a model not allowed", [][2]string{{"image", big}, {"model", "m2"}}, nil, false},
		{"a model not allowed, one byte a read", [][2]string{{"model", "m2"}, {"image", "x"}}, iotest.OneByteReader, false},
		{"no model", [][2]string{{"image", big}}, nil, false},
		{"a model too long", [][2]string{{"model", strings.Repeat("m", maxModelField+1)}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body, boundary := multipartOf(t, tc.fields...)
			var src io.Reader = bytes.NewReader(body)
			if tc.reader != nil {
				src = tc.reader(src)
			}
			w := watchModel(src, boundary, allowOnly("m1"))
			defer w.close()
			got, err := io.ReadAll(w)
			if tc.allowed {
				require.NoError(t, err)
				assert.Equal(t, body, got, "the body passes on unchanged")
				assert.NoError(t, w.refused())
				return
			}
			var ae *requestError
			require.True(t, errors.As(err, &ae), "a refusal: %v", err)
			assert.Equal(t, error(ae), w.refused())
			assert.Less(t, len(got), len(body)-len(boundary)-4, "the closing delimiter was kept back")
			assert.True(t, bytes.HasPrefix(body, got))
		})
	}
	w := watchModel(strings.NewReader("not multipart at all"), "b", allowOnly("m1"))
	_, err := io.ReadAll(w)
	assert.ErrorContains(t, err, "not valid multipart")
}
