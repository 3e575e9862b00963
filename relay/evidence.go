package relay

import (
	"fmt"

	"github.com/codexrelay/codex-relay/internal/store"
)

// hardSource names a kind of hard evidence: something only one account can
// continue, or an operator's decision that one account serves the thread.
type hardSource string

const (
	hardTurnState        hardSource = "turn_state"        // the client echoed a turn state an account issued
	hardPreviousResponse hardSource = "previous_response" // only the account that produced previous_response_id can continue it
	hardThreadPin        hardSource = "raw_thread"        // an operator's pin of the thread
	hardSessionPin       hardSource = "raw_session"       // an operator's pin of the session (or an imported raw row)
	hardObject           hardSource = "object"            // the object (a file, a stored response) the request names lives on one account
)

// describe says what a source is in words a client may read: no ids.
func (h hardSource) describe() string {
	switch h {
	case hardTurnState:
		return "the turn state it echoes"
	case hardPreviousResponse:
		return "its previous_response_id"
	case hardThreadPin, hardSessionPin:
		return "the account an operator pinned this conversation to"
	case hardObject:
		return "the file or stored response it references"
	}
	return string(h)
}

// hardOwner is the one account hard evidence names; the zero value is none.
type hardOwner struct {
	account string
	source  hardSource
}

// preferences are what bears on a request softly: the account to stay on
// when it can serve, in order.
type preferences struct {
	Lane    string // account of the thread's live lane: its upstream holds the chain
	Thread  string // account of the thread row
	Session string // account of the process-session row
	// Organization issued ciphertext in the thread's history; accounts of it
	// come first when the thread must be placed anew.
	Organization string
}

// evidenceInput is what a request presents and what the relay holds for
// its thread, read by the caller (store, owner index, lanes, continuity).
type evidenceInput struct {
	rows  []store.Binding
	ident Identity
	// turnStateOwner issued the client's turn state ("": none, unknown, or
	// released because that account failed this request before any work).
	turnStateOwner string
	// prevOwner produced previous_response_id and is the only account that
	// can continue it ("": none, or continuity can rebuild the request).
	prevOwner string
	// objectOwner holds the objects the request names or references (its
	// files, a stored response): only that account can read them ("": none).
	objectOwner string
	// lane is the account of the thread's live lane ("": none).
	lane         string
	organization string
}

// conflictError: what the client presents names two accounts; nothing may
// go upstream. Pins are the operator's, not the client's: a pin moves a
// thread, it conflicts only with a turn state issued elsewhere within the
// same turn.
type conflictError struct {
	A, B hardOwner
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("continuity evidence disagrees: %s names %s, %s names %s", e.A.source, e.A.account, e.B.source, e.B.account)
}

// weighEvidence turns a request's evidence into its one hard owner, if any,
// and its preferences. Pure.
//
// The client's own evidence is hard: a turn state ties the rest of a turn
// to the account that issued it, and a previous_response_id that continuity
// cannot rebuild can only be continued where it was produced; the two
// naming different accounts conflict. An operator's pin is hard too (a
// thread's pin overrides its session's) and overrides a
// previous_response_id elsewhere, so the thread moves at its next request
// (the client resends the full request when the new account cannot resolve
// the id); only a turn state issued elsewhere, mid-turn, conflicts with it.
// A live lane is the relay's own means, never evidence: it is the first
// preference, and an operator's decision or an unavailable account moves
// the thread off it.
func weighEvidence(in evidenceInput) (hardOwner, preferences, error) {
	prefs := preferences{Lane: in.lane, Organization: in.organization}
	var threadPin, sessionPin string
	for _, b := range in.rows {
		switch b.Kind {
		case store.BindThread:
			if b.Key == string(in.ident.Key) {
				prefs.Thread = b.AccountID
			}
		case store.BindSession:
			if b.Key != string(in.ident.Key) {
				prefs.Session = b.AccountID
			} else if prefs.Thread == "" {
				// A client without thread ids: its session key is its thread key.
				prefs.Thread = b.AccountID
			}
		case store.BindRawThread:
			threadPin = b.AccountID
		case store.BindRawSession:
			sessionPin = b.AccountID
		}
	}
	pin := hardOwner{account: sessionPin, source: hardSessionPin}
	if threadPin != "" {
		pin = hardOwner{account: threadPin, source: hardThreadPin}
	}
	ts := hardOwner{account: in.turnStateOwner, source: hardTurnState}
	prev := hardOwner{account: in.prevOwner, source: hardPreviousResponse}
	if obj := (hardOwner{account: in.objectOwner, source: hardObject}); obj.account != "" {
		// A referenced file can be read only where it lives: it outranks
		// a pin (which can move the thread, not the file) and conflicts
		// with a turn state or a previous_response_id issued elsewhere.
		switch {
		case ts.account != "" && ts.account != obj.account:
			return hardOwner{}, prefs, &conflictError{A: ts, B: obj}
		case prev.account != "" && prev.account != obj.account:
			return hardOwner{}, prefs, &conflictError{A: prev, B: obj}
		}
		return obj, prefs, nil
	}
	switch {
	case ts.account != "" && prev.account != "" && ts.account != prev.account:
		return hardOwner{}, prefs, &conflictError{A: ts, B: prev}
	case ts.account != "" && pin.account != "" && ts.account != pin.account:
		return hardOwner{}, prefs, &conflictError{A: ts, B: pin}
	case ts.account != "":
		return ts, prefs, nil
	case pin.account != "":
		return pin, prefs, nil
	case prev.account != "":
		return prev, prefs, nil
	}
	return hardOwner{}, prefs, nil
}
