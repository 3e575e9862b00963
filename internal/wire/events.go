package wire

// Server event types, as they appear in the "type" field of each SSE data line
// or WebSocket text frame. See PROTOCOL.md for which of them Codex acts upon.
const (
	EventResponseCreated            = "response.created"
	EventResponseInProgress         = "response.in_progress"
	EventOutputItemAdded            = "response.output_item.added"
	EventOutputItemDone             = "response.output_item.done"
	EventContentPartAdded           = "response.content_part.added"
	EventContentPartDone            = "response.content_part.done"
	EventOutputTextDelta            = "response.output_text.delta"
	EventOutputTextDone             = "response.output_text.done"
	EventFunctionCallArgumentsDelta = "response.function_call_arguments.delta"
	EventFunctionCallArgumentsDone  = "response.function_call_arguments.done"
	EventCustomToolCallInputDelta   = "response.custom_tool_call_input.delta"
	EventReasoningSummaryTextDelta  = "response.reasoning_summary_text.delta"
	EventResponseCompleted          = "response.completed"
	EventResponseFailed             = "response.failed"
	EventResponseIncomplete         = "response.incomplete"
	EventResponseMetadata           = "response.metadata"
	EventError                      = "error"
	EventRateLimits                 = "codex.rate_limits"
)

// MessageResponseCreate is the type of the one message a client sends over a
// Responses WebSocket: a response request, with the fields of a POST body.
const MessageResponseCreate = "response.create"

// MessageResponseProcessed is a client's acknowledgement over the
// WebSocket that it processed a response; it has no answer. The relay
// passes it, like any client message type it does not know, to the
// connection's upstream lane.
const MessageResponseProcessed = "response.processed"

// IsTerminal reports whether an event of type t ends a response request:
// after it the server sends nothing more for that request.
func IsTerminal(t string) bool {
	switch t {
	case EventResponseCompleted, EventResponseFailed, EventResponseIncomplete, EventError:
		return true
	}
	return false
}
