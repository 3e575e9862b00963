package bridge

import "errors"

var errNotObject = errors.New("bridge: request body is not a JSON object")

// ErrClosed is returned by a Pool that was closed.
var ErrClosed = errors.New("bridge: pool closed")

// ErrNoCapacity is returned when an account's lane cap stayed full for the
// whole wait.
var ErrNoCapacity = errors.New("bridge: no lane capacity on the account within the deadline")
