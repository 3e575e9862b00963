package pricing

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of a table Validate accepts.
const (
	MaxEntries     = 2000
	MaxModelLength = 200    // characters
	MaxSource      = 500    // characters
	MaxAsOf        = 50     // characters
	MaxPrice       = 100000 // US dollars per million tokens
	MaxImagePrice  = 1000   // US dollars per image
)

// FieldError is what Validate finds wrong: which entry (or the table
// itself), which field, and the problem in plain words.
type FieldError struct {
	// Index is the entry's position, from 0; -1 for the table's own
	// fields (source, as_of, entries).
	Index int
	// Model is the entry's model as given, for messages.
	Model string
	// Field is the JSON name of the field: model, tier, input_per_million,
	// cached_input_per_million, output_per_million; or source, as_of,
	// entries.
	Field string
	// Problem is a sentence naming the field, such as "the input price
	// must be 0 or more".
	Problem string
}

// Error names the entry by its position from 1, and its model.
func (e *FieldError) Error() string {
	switch {
	case e.Index < 0:
		return e.Problem
	case e.Model == "":
		return fmt.Sprintf("entry %d: %s", e.Index+1, e.Problem)
	}
	return fmt.Sprintf("entry %d (%s): %s", e.Index+1, e.Model, e.Problem)
}

// Path is the field's place in the table's JSON, such as entries[3].tier
// or source.
func (e *FieldError) Path() string {
	if e.Index < 0 {
		return e.Field
	}
	return "entries[" + strconv.Itoa(e.Index) + "]." + e.Field
}

// Validate checks t can be stored and used: between one and MaxEntries
// entries; each with a model (at most MaxModelLength characters, no spaces
// or control characters), a tier among TierDefault, TierFlex and
// TierPriority, and prices that are finite numbers from 0 to MaxPrice; no
// two entries for the same model (without regard to case) and tier; a
// default-tier entry for every model (the other tiers fall back to it); a
// source of at most MaxSource characters and an as-of of at most MaxAsOf;
// a fallback model, when named, with a default-tier entry.
// The error, a *FieldError, names the first problem found.
func (t Table) Validate() error {
	switch {
	case utf8.RuneCountInString(t.Source) > MaxSource:
		return &FieldError{Index: -1, Field: "source", Problem: fmt.Sprintf("the source must be at most %d characters", MaxSource)}
	case utf8.RuneCountInString(t.AsOf) > MaxAsOf:
		return &FieldError{Index: -1, Field: "as_of", Problem: fmt.Sprintf("the as-of date must be at most %d characters", MaxAsOf)}
	case len(t.Entries) == 0:
		return &FieldError{Index: -1, Field: "entries", Problem: "a price table needs at least one entry"}
	case len(t.Entries) > MaxEntries:
		return &FieldError{Index: -1, Field: "entries", Problem: fmt.Sprintf("a price table holds at most %d entries", MaxEntries)}
	}
	type key struct{ model, tier string }
	seen := make(map[key]int, len(t.Entries))
	for i, e := range t.Entries {
		if err := e.validate(); err != nil {
			err.Index, err.Model = i, e.Model
			return err
		}
		k := key{strings.ToLower(e.Model), e.Tier}
		if j, dup := seen[k]; dup {
			return &FieldError{Index: i, Model: e.Model, Field: "tier",
				Problem: fmt.Sprintf("entry %d already prices this model at the %s tier", j+1, e.Tier)}
		}
		seen[k] = i
	}
	for i, e := range t.Entries {
		if _, ok := seen[key{strings.ToLower(e.Model), TierDefault}]; !ok {
			return &FieldError{Index: i, Model: e.Model, Field: "tier",
				Problem: "the model has no default-tier price, which the other tiers fall back to"}
		}
	}
	if m := t.FallbackModel; m != "" {
		if _, ok := seen[key{strings.ToLower(m), TierDefault}]; !ok {
			return &FieldError{Index: -1, Field: "fallback_model",
				Problem: fmt.Sprintf("the fallback model %q has no default-tier price in the table", m)}
		}
	}
	return nil
}

// validate checks one entry on its own; the caller fills in its place.
func (e Entry) validate() *FieldError {
	n := utf8.RuneCountInString(e.Model)
	switch {
	case n == 0:
		return &FieldError{Field: "model", Problem: "the model is required"}
	case n > MaxModelLength:
		return &FieldError{Field: "model", Problem: fmt.Sprintf("the model must be at most %d characters", MaxModelLength)}
	case strings.ContainsFunc(e.Model, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError }):
		return &FieldError{Field: "model", Problem: "the model must not contain spaces or control characters"}
	case e.Tier != TierDefault && e.Tier != TierFlex && e.Tier != TierPriority:
		return &FieldError{Field: "tier", Problem: fmt.Sprintf("the tier must be %s, %s or %s, not %q", TierDefault, TierFlex, TierPriority, e.Tier)}
	}
	for _, p := range []struct {
		field, words string
		v            float64
		most         int
		unit         string
	}{
		{"input_per_million", "input price", e.Input, MaxPrice, "US dollars per million tokens"},
		{"cached_input_per_million", "cached input price", e.CachedInput, MaxPrice, "US dollars per million tokens"},
		{"output_per_million", "output price", e.Output, MaxPrice, "US dollars per million tokens"},
		{"per_image", "price per image", e.PerImage, MaxImagePrice, "US dollars per image"},
	} {
		switch {
		case math.IsNaN(p.v) || math.IsInf(p.v, 0):
			return &FieldError{Field: p.field, Problem: "the " + p.words + " must be a finite number"}
		case p.v < 0:
			return &FieldError{Field: p.field, Problem: "the " + p.words + " must be 0 or more"}
		case p.v > float64(p.most):
			return &FieldError{Field: p.field, Problem: fmt.Sprintf("the %s must be at most %d (%s)", p.words, p.most, p.unit)}
		}
	}
	return nil
}
