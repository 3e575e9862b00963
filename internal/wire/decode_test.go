package wire

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestJSONTypeName(t *testing.T) {
	for v, want := range map[any]string{
		"": "a string", true: "a boolean", 1: "a number", int64(1): "a number", 1.5: "a number", uint8(1): "a number",
		&struct{}{}: "an object", struct{}{}: "an object",
	} {
		assert.Equal(t, want, JSONTypeName(reflect.TypeOf(v)), "%T", v)
	}
	assert.Equal(t, "an array", JSONTypeName(reflect.TypeFor[[]string]()))
	assert.Equal(t, "an object", JSONTypeName(reflect.TypeFor[map[string]any]()))
	assert.Equal(t, "a value of another type", JSONTypeName(reflect.TypeFor[any]()))
}
