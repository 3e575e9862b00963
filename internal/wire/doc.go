// Package wire holds the pieces of the OpenAI Responses wire format that every
// part of Codex Relay shares: the names of server events and of the headers
// Codex reads, the SSE codec, a cheap way to learn an event's type from its raw
// bytes, and the two error shapes (the HTTP error body and the WebSocket error
// event).
//
// It is a leaf: it imports only the standard library, and nothing in it keeps
// state, so every function is safe for concurrent use. Values that are decoded
// from the outside world (SSE streams, error bodies, event bytes) are bounded
// or parsed leniently, because they come from upstreams the relay does not
// control.
package wire
