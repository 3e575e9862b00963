// Package continuity is the thread-scoped replay and tool-continuity cache,
// and the request surgery that rebuilding a conversation needs.
//
// Codex over WebSocket sends, after its first request on a connection, only
// the new input items and the previous_response_id of the connection's last
// response. An upstream connection or account that did not produce that
// response does not know it, so when the relay must move a request it
// rebuilds the full request: the whole history (every earlier input item and
// every output item the upstream produced) followed by the new items, without
// previous_response_id. A Cache keeps what that takes, per thread key and
// client key scope, in memory and bounded: the histories of the thread's
// recent responses, the account that produced each, the tool calls still
// waiting for output, and the organisations whose ciphertext the history
// holds (only accounts of the issuing organisation can read it).
//
// Items are opaque JSON objects, kept and passed on byte for byte: unknown
// types and fields go through untouched. The package looks inside an item
// only for type, call_id, file_id, encrypted_content and content parts, and
// for a message's role when a compaction decides what the thread keeps
// (CompactedHistory).
// Request bodies are rewritten the same way: RequestFields reads a body,
// WithFullInput replaces its input and drops previous_response_id, and every
// other byte stays as the client sent it.
//
// The package imports nothing of the relay; the relay hands it keys, items
// and a clock.
package continuity
