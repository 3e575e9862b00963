package web

import "strings"

// The words the console explains in place: why a binding was made, what a
// lane kind is for. Both follow the relay's own values (relay/selection.go
// planBinding's sources, bridge.Info's kinds).

// bindingWhy says in words how a binding was set, from its source:
// "admission:<reason>" (the thread's first request placed it), "move:<reason>"
// (a later request moved it), or "pin". "" for a source it does not know.
func bindingWhy(source string) string {
	if source == "pin" {
		return "an operator's pin"
	}
	how, reason, ok := strings.Cut(source, ":")
	var first string
	switch {
	case ok && how == "admission":
		first = "placed by its first request: "
	case ok && how == "move":
		first = "moved by a later request: "
	default:
		return ""
	}
	because := map[string]string{
		"lane":              "its live lane was on this account",
		"thread":            "its own binding named this account",
		"session":           "its session's binding named this account",
		"balancer":          "the account with the most usage headroom",
		"recovery":          "a recovery retried it on this account",
		"turn_state":        "the turn state it echoed came from this account",
		"previous_response": "only this account could continue its previous response",
		"raw_thread":        "a pin of the thread",
		"raw_session":       "a pin of its session",
	}[reason]
	if because == "" {
		return ""
	}
	return first + because
}

// laneKindNote says what a lane of a kind is for ("" for a kind it does
// not know).
func laneKindNote(kind string) string {
	switch kind {
	case "direct":
		return "a client WebSocket's own lane"
	case "bridge":
		return "the thread's lane for its HTTP requests"
	case "bridge_fork":
		return "one request's lane while the thread's bridge lane was busy"
	}
	return ""
}
