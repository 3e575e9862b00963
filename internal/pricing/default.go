package pricing

import (
	_ "embed"
	"encoding/json"
	"slices"
	"sync"
)

// defaultJSON is OpenAI's published API prices for the models Codex uses,
// with the page they were read on and the date. Update it by hand from that
// page; the relay never fetches prices.
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
