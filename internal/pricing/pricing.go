// Package pricing prices a request's usage from a table of USD prices per
// million tokens, by model and service tier. Pure: the store keeps the
// tables (history included), the relay prices each request when it
// settles, and this package only reads the figures it is handed.
//
// The relay ships a default table, OpenAI's published API prices (Default);
// an operator may replace it. Nothing here fetches prices from anywhere.
package pricing

import (
	"strings"
	"time"
)

// The service tiers a price can be given for: what OpenAI's service_tier
// reports having served. A request whose tier has no price of its own is
// priced at its model's default tier.
const (
	TierDefault  = "default"
	TierFlex     = "flex"
	TierPriority = "priority"
)

// DefaultID is the ID of the embedded default table, which is never stored.
const DefaultID = "default"

// Entry is the price of one model at one tier, in US dollars per million
// tokens.
type Entry struct {
	Model       string  `json:"model"`
	Tier        string  `json:"tier"`
	Input       float64 `json:"input_per_million"`
	CachedInput float64 `json:"cached_input_per_million"`
	Output      float64 `json:"output_per_million"`
}

// Table is a price table: its entries, where the figures come from (Source,
// typically a URL) and the date they were read there (AsOf, free text such
// as 2025-12-11). ID, CreatedAt and CreatedBy are set when it is stored;
// the default table has ID DefaultID and no creation time.
type Table struct {
	ID        string    `json:"id"`
	Source    string    `json:"source"`
	AsOf      string    `json:"as_of"`
	Entries   []Entry   `json:"entries"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
}

// IsDefault reports whether t is the embedded default rather than a table
// an operator stored.
func (t Table) IsDefault() bool { return t.ID == DefaultID }

// NormalizeTier maps a service tier as requests and responses carry it to
// a table's: lower case, with "" and "auto" meaning TierDefault. Other
// values are kept (a tier the table has no price for falls back to the
// default tier when looked up).
func NormalizeTier(tier string) string {
	tier = strings.ToLower(strings.TrimSpace(tier))
	if tier == "" || tier == "auto" {
		return TierDefault
	}
	return tier
}

// Lookup finds the price of model at tier. The model is matched without
// regard to case: the entry of that exact name, else the entry whose model
// is the longest that model extends with "-" (a dated snapshot such as
// gpt-5-codex-2025-09-15 is priced as gpt-5-codex, and gpt-5.1-codex-mini
// is never priced as gpt-5.1-codex while gpt-5.1-codex-mini has an entry).
// Within the model, the entry for the tier (see NormalizeTier), else the
// model's default-tier entry. ok is false when nothing prices the model.
//
// Lookup scans the entries: a table holds at most a few thousand.
func (t Table) Lookup(model, tier string) (Entry, bool) {
	name, ok := t.resolve(strings.TrimSpace(model))
	if !ok {
		return Entry{}, false
	}
	tier = NormalizeTier(tier)
	var fallback Entry
	found := false
	for _, e := range t.Entries {
		if !strings.EqualFold(e.Model, name) {
			continue
		}
		switch NormalizeTier(e.Tier) {
		case tier:
			return e, true
		case TierDefault:
			fallback, found = e, true
		}
	}
	return fallback, found
}

// resolve names the entry model that prices model: model itself, else the
// longest entry model that model extends with "-".
func (t Table) resolve(model string) (string, bool) {
	best, found := "", false
	for _, e := range t.Entries {
		m := e.Model
		switch {
		case m == "" || len(m) > len(model):
		case len(m) == len(model):
			if strings.EqualFold(m, model) {
				return m, true
			}
		case model[len(m)] == '-' && len(m) > len(best) && strings.EqualFold(model[:len(m)], m):
			best, found = m, true
		}
	}
	return best, found
}
