package relay

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// How a request was recognised as a compaction (PROTOCOL.md, "Compaction
// and goals"), as its attempt records name it.
const (
	compactionTrigger = "compaction_trigger" // its input ends with {"type":"compaction_trigger"}
	compactionKind    = "request_kind"       // its turn metadata says request_kind "compaction"
	compactionRoute   = "legacy_route"       // POST .../responses/compact
)

// compactionOf says how a request is a compaction ("" when it is not): the
// legacy compact route, an input ending in compaction_trigger, or turn
// metadata whose request_kind is "compaction" (Codex sends it in the body's
// client_metadata on both transports, and over HTTP in the
// x-codex-turn-metadata header too; a WebSocket's handshake header is its
// first request's, so only the message's own metadata counts there).
//
// A compaction is never an ordinary turn: it stays with the thread's owner
// or its organisation and never falls back (compactionPlace), and its answer
// replaces the thread's history in continuity (settle).
func compactionOf(transport, sub string, fields continuity.Fields, body []byte, header http.Header) string {
	switch {
	case sub == "/compact":
		return compactionRoute
	case continuity.EndsWithCompactionTrigger(fields.Input):
		return compactionTrigger
	}
	meta, ok := clientTurnMetadata(body)
	if !ok && transport == "http" {
		meta = header.Get(wire.HeaderTurnMetadata)
	}
	var m struct {
		RequestKind string `json:"request_kind"`
	}
	if meta != "" && json.Unmarshal([]byte(meta), &m) == nil && m.RequestKind == "compaction" {
		return compactionKind
	}
	return ""
}

// clientTurnMetadata returns client_metadata["x-codex-turn-metadata"] of a
// Responses body (a JSON document in a string), and whether it has one.
func clientTurnMetadata(body []byte) (string, bool) {
	start, end, ok := memberValue(body, "client_metadata")
	if !ok {
		return "", false
	}
	var md map[string]json.RawMessage
	if json.Unmarshal(body[start:end], &md) != nil {
		return "", false
	}
	var meta string
	if json.Unmarshal(md[wire.HeaderTurnMetadata], &meta) != nil {
		return "", false
	}
	return meta, true
}

// compactionPlace is where a compaction request may be served: accounts of
// the organisation that can read the thread's history, and the thread's own
// account (its owner) wherever it is, also in the fallback group when an
// exhausted pool put the thread there. The organisation is that of the
// account that served the thread's last response, which read every
// ciphertext of the history it was sent and issued the newest; else that of
// the account of the thread's lane or row. Only that organisation can read
// the history being compacted, and the compaction item the thread continues
// from. org is "" when none is known: any account may take the request.
type compactionPlace struct {
	org    string
	owners []string // the thread's account: of its last response, lane and row
}

// compactionPlace reads where r, a compaction, may be served, from the
// thread's continuity entry, its preferences and the accounts in scope.
func (s *Server) compactionPlace(r *request, prefs preferences, cands []candidate) compactionPlace {
	var pl compactionPlace
	if r.ident.Key != "" {
		if snap, ok := s.conts.Lookup(r.contKey()); ok && snap.AccountID != "" {
			pl.org = snap.Organization
			pl.owners = append(pl.owners, snap.AccountID)
		}
	}
	for _, id := range []string{prefs.Lane, prefs.Thread} {
		if id == "" {
			continue
		}
		pl.owners = append(pl.owners, id)
		for _, c := range cands {
			if pl.org == "" && c.Account.ID == id {
				pl.org = c.Account.Organization
			}
		}
	}
	return pl
}

// group narrows the accounts selection may choose from (group: the pool,
// or the fallback group) to where the compaction may be served; a hard owner
// is honoured wherever it is, as for every request.
func (pl compactionPlace) group(group func(store.Account) bool) func(store.Account) bool {
	if pl.org == "" {
		return group
	}
	return func(a store.Account) bool {
		return a.Organization == pl.org && (group(a) || slices.Contains(pl.owners, a.ID))
	}
}

// compactionStuckError: no account that can read a thread's history can
// compact it now. The compaction goes nowhere else: another organisation
// cannot read the history, and the fallback group is no place for it.
type compactionStuckError struct {
	*noAccountError
}

func (e *compactionStuckError) Error() string {
	return "compaction: " + e.noAccountError.Error()
}

func (e *compactionStuckError) Unwrap() error { return e.noAccountError }

// compactionStuck turns a selection that found no account for a compaction
// into a compactionStuckError; any other error is returned as it is.
func compactionStuck(err error) error {
	var none *noAccountError
	if errors.As(err, &none) {
		return &compactionStuckError{noAccountError: none}
	}
	return err
}
