package wire

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestErrorBodyShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body ErrorBody
		want string
	}{
		{
			"usage limit",
			ErrorBody{Error{Type: TypeUsageLimitReached, Message: "limit", PlanType: "plus", ResetsAt: 1700000000, ResetsInSeconds: 60}},
			`{"error":{"type":"usage_limit_reached","message":"limit","plan_type":"plus","resets_at":1700000000,"resets_in_seconds":60}}`,
		},
		{
			"coded",
			ErrorBody{Error{Type: TypeInvalidRequest, Code: CodeInvalidEncryptedContent, Message: "m"}},
			`{"error":{"type":"invalid_request_error","code":"invalid_encrypted_content","message":"m"}}`,
		},
		{
			"no code",
			ErrorBody{Error{Type: TypeInvalidRequest, Message: "could not be decrypted"}},
			`{"error":{"type":"invalid_request_error","message":"could not be decrypted"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tt.body)
			require.NoError(t, err)
			assert.JSONEq(t, tt.want, string(b))
			back, ok := ParseErrorBody(b)
			require.True(t, ok)
			assert.Equal(t, tt.body.Error, back)
		})
	}
}

func TestParseErrorBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		in     string
		want   Error
		wantOK bool
	}{
		{"real upstream nulls", `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`, Error{Type: TypeInvalidRequest, Message: "bad"}, true},
		{"numeric code ignored", `{"error":{"message":"x","code":429}}`, Error{Message: "x"}, true},
		{"float reset", `{"error":{"type":"usage_limit_reached","resets_at":1.7e9}}`, Error{Type: TypeUsageLimitReached, ResetsAt: 1700000000}, true},
		{"string error is not this shape", `{"error":"invalid_grant"}`, Error{}, false},
		{"no error", `{"detail":"x"}`, Error{}, false},
		{"not json", `<html>`, Error{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ParseErrorBody([]byte(tt.in))
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestErrorEvent(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("X-Codex-Primary-Used-Percent", "100")
	ev := NewErrorEvent(http.StatusTooManyRequests, Error{Type: TypeUsageLimitReached, Message: "m", ResetsAt: 5}, h)
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"m","resets_at":5},"headers":{"x-codex-primary-used-percent":"100"}}`, string(b))
	typ, ok := EventType(b)
	require.True(t, ok)
	assert.Equal(t, EventError, typ)

	back, ok := ParseErrorEvent(b)
	require.True(t, ok)
	assert.Equal(t, ev, back)

	noHeaders, err := json.Marshal(NewErrorEvent(400, Error{Code: CodePreviousResponseNotFound, Message: "m"}, nil))
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"error","status":400,"error":{"code":"previous_response_not_found","message":"m"}}`, string(noHeaders))

	_, ok = ParseErrorEvent([]byte(`{"type":"response.failed","error":{}}`))
	assert.False(t, ok)
}

func TestErrorAsError(t *testing.T) {
	t.Parallel()
	var err error = &Error{Type: TypeInvalidRequest, Code: CodeInvalidEncryptedContent, Message: "nope"}
	assert.Equal(t, "upstream error invalid_request_error invalid_encrypted_content: nope", err.Error())
	assert.Equal(t, "upstream error", (&Error{}).Error())
}
