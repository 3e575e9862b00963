package pricing

import (
	_ "embed"
	"encoding/json"
	"slices"
	"sync"
)

// defaultJSON is OpenAI's published API prices for the models Codex uses,
// with the page they were read on and the date. Update it by hand from that
// page; the relay never fetches prices. The figures of 2026: gpt-5.5,
// gpt-5.4 and gpt-5.3-codex as that page was quoted on 2026-06-04
// (tokenmix.ai) and 2026-05-05 (fernando-nog.netlify.app); gpt-5.6-sol,
// -terra and -luna from OpenAI's preview announcement of 2026-06-26 as
// quoted on 2026-06-28 (benchr.org), cached input at the announced 90%
// discount; the older models as read on 2025-12-11. Models without a
// published price (gpt-6.x, the sim's gpt-5.5-codex) are priced by the
// fallback, gpt-5.5, and marked unpriced.
//
//go:embed default.json
var defaultJSON []byte

var defaultTable = sync.OnceValue(func() Table {
	var t Table
	if err := json.Unmarshal(defaultJSON, &t); err != nil {
		panic("pricing: default.json does not parse: " + err.Error()) // a build mistake; the tests catch it
	}
	if err := t.Validate(); err != nil {
		panic("pricing: default.json is not a valid table: " + err.Error())
	}
	t.ID = DefaultID
	return t
})

// Default is the table the relay prices with until an operator stores one:
// OpenAI's published API prices (Source is the pricing page, AsOf the date
// the figures were read), ID DefaultID. Each call returns its own entries.
func Default() Table {
	t := defaultTable()
	t.Entries = slices.Clone(t.Entries)
	return t
}
