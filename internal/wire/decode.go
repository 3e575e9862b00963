package wire

import "reflect"

// JSONTypeName names the JSON type a Go value of type t is decoded from,
// as a client reads it ("a string", "a number", "an object", ...): for an
// error that says what a field should have been, never a Go type.
func JSONTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "an object"
	}
	return "a value of another type"
}
