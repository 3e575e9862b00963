package continuity

import "encoding/json"

// Item types of compaction (PROTOCOL.md, "Compaction and goals").
const (
	// typeCompaction is the item an upstream answers a compaction with: its
	// encrypted_content stands for the history it compacted, and only the
	// issuing organisation can read it.
	typeCompaction = "compaction"
	// typeCompactionTrigger ends the input of a compaction request (Codex
	// 0.169 and later). It is a request control, not history: no client
	// keeps it.
	typeCompactionTrigger = "compaction_trigger"
)

// EndsWithCompactionTrigger reports whether the last of items is a
// {"type":"compaction_trigger"}: the request asks the upstream to compact
// the history before it into one compaction item.
func EndsWithCompactionTrigger(items []json.RawMessage) bool {
	return len(items) > 0 && inspect(items[len(items)-1]).typ == typeCompactionTrigger
}

// CompactedHistory returns the history a client continues from once a
// compaction answered output to the whole input: what it sends in place of
// the old history at its next request, so what a rebuilt request must carry.
// ok is false when output holds no compaction item: nothing was compacted
// (a client that summarises by itself gets an ordinary message back), and
// the history is input followed by output, as for any other response.
//
// Two shapes of compaction exist. An input ending in compaction_trigger is
// answered with the compaction item (other output items are ignored, as
// Codex ignores them): the history is the input's messages of the user,
// developer and system roles, in order, then the compaction item, as Codex
// builds it (it keeps those messages and drops everything the item stands
// for: assistant messages, reasoning, tool calls and their outputs, earlier
// compaction items, and the trigger). The legacy compact route answers the
// new transcript itself (the messages the upstream kept, then the
// compaction item): the history is the input's instructions (developer and
// system messages, which a client keeps for itself and the transcript
// leaves out) followed by that transcript. Codex then trims what it keeps
// and renews its instructions by itself; either way the upstream reads the
// compaction item, and no ciphertext but the new item's remains.
func CompactedHistory(input, output []json.RawMessage) (history []json.RawMessage, ok bool) {
	for _, it := range output {
		if inspect(it).typ == typeCompaction {
			ok = true
		}
	}
	if !ok {
		return nil, false
	}
	trigger := EndsWithCompactionTrigger(input)
	history = make([]json.RawMessage, 0, len(input)+len(output))
	for _, it := range input {
		if inspect(it).typ != typeMessage {
			continue
		}
		switch messageRole(it) {
		case "developer", "system":
			history = append(history, it)
		case "user":
			if trigger {
				history = append(history, it)
			}
		}
	}
	for _, it := range output {
		switch typ := inspect(it).typ; {
		case typ == typeCompactionTrigger:
		case typ == typeCompaction, !trigger:
			history = append(history, it)
		}
	}
	return history, true
}

// messageRole returns the role of a message item ("" when it has none that
// can be read).
func messageRole(raw []byte) string {
	role := ""
	scanObject(raw, func(tok []byte, escaped bool, m member) {
		if string(keyName(tok, escaped)) == "role" {
			role, _ = stringValue(raw[m.valStart:m.end])
		}
	})
	return role
}
