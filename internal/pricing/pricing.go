// Package pricing prices a request's usage from a table of USD prices per
// million tokens, by model and service tier. Pure: the store keeps the
// tables (history included), the relay prices each request when it
// settles, and this package only reads the figures it is handed.
//
// The relay ships a default table, OpenAI's published API prices (Default);
// an operator may replace it. Nothing here fetches prices from anywhere.
package pricing

import (
	"slices"
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
// tokens, and for an image model (images/generations, images/edits) also
// in US dollars per image it returns.
type Entry struct {
	Model       string  `json:"model"`
	Tier        string  `json:"tier"`
	Input       float64 `json:"input_per_million"`
	CachedInput float64 `json:"cached_input_per_million"`
	Output      float64 `json:"output_per_million"`
	PerImage    float64 `json:"per_image,omitempty"`
}

// Table is a price table: its entries, where the figures come from (Source,
// typically a URL) and the date they were read there (AsOf, free text such
// as 2025-12-11). ID, CreatedAt and CreatedBy are set when it is stored;
// the default table has ID DefaultID and no creation time.
type Table struct {
	ID      string  `json:"id"`
	Source  string  `json:"source"`
	AsOf    string  `json:"as_of"`
	Entries []Entry `json:"entries"`
	// FallbackModel names the entry model whose prices stand in for a model
	// the table does not price (Quote): its cost then counts, in reports
	// and budgets, marked as unpriced. "": such a model costs nothing, and
	// a cost limit does not count it.
	FallbackModel string    `json:"fallback_model,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	CreatedBy     string    `json:"created_by"`
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
// regard to case: the entry of that exact name, else, for a dated snapshot
// (the model's name, "-" and a date YYYY-MM-DD, such as
// gpt-5-codex-2025-09-15), the entry of the model it is a snapshot of. A
// variant is another model: gpt-5.5-codex is not priced as gpt-5.5 (Quote
// prices it by the fallback, marked so).
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
// model a dated snapshot (model-YYYY-MM-DD) is of.
func (t Table) resolve(model string) (string, bool) {
	base, dated := snapshotOf(model)
	found := ""
	for _, e := range t.Entries {
		switch m := e.Model; {
		case m == "":
		case strings.EqualFold(m, model):
			return m, true
		case dated && strings.EqualFold(m, base):
			found = m
		}
	}
	return found, found != ""
}

// snapshotOf reports whether model is a dated snapshot, model-YYYY-MM-DD,
// and of which model.
func snapshotOf(model string) (base string, ok bool) {
	const date = len("-2006-01-02")
	if len(model) <= date {
		return "", false
	}
	base, d := model[:len(model)-date], model[len(model)-date:]
	for i, c := range d {
		switch i {
		case 0, 5, 8:
			if c != '-' {
				return "", false
			}
		default:
			if c < '0' || c > '9' {
				return "", false
			}
		}
	}
	return base, true
}

// Quote is how a table prices one model at one tier.
type Quote struct {
	// Entry is the price used: the model's own (Priced), or the fallback
	// model's; zero when OK is false.
	Entry Entry
	// Priced: the table prices the model itself (or the model a dated
	// snapshot is of). OK: something prices it, itself or the fallback.
	Priced, OK bool
}

// Quote prices model at tier as requests are priced: by its own entry
// (Lookup), else by the fallback model's (marked not Priced), else not at
// all.
func (t Table) Quote(model, tier string) Quote {
	if e, ok := t.Lookup(model, tier); ok {
		return Quote{Entry: e, Priced: true, OK: true}
	}
	if t.FallbackModel != "" {
		if e, ok := t.Lookup(t.FallbackModel, tier); ok {
			return Quote{Entry: e, OK: true}
		}
	}
	return Quote{}
}

// Unpriced lists the models of models the table does not price itself
// (Lookup at the default tier), in their order, each once.
func (t Table) Unpriced(models []string) []string {
	var out []string
	for _, m := range models {
		if _, ok := t.Lookup(m, TierDefault); !ok && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}
