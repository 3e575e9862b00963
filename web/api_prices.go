package web

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/pricing"
)

// PriceTableView is a price table as the API shows it. Default is true for
// the built-in table, which has no creation time.
type PriceTableView struct {
	ID        string          `json:"id"`
	Source    string          `json:"source"`
	AsOf      string          `json:"as_of"`
	CreatedAt *time.Time      `json:"created_at"`
	CreatedBy string          `json:"created_by"`
	Default   bool            `json:"default"`
	Entries   []pricing.Entry `json:"entries"`
	// FallbackModel prices a model without an entry of its own (such a
	// request is marked unpriced); "" when there is none.
	FallbackModel string `json:"fallback_model"`
}

func viewPriceTable(t pricing.Table) PriceTableView {
	entries := t.Entries
	if entries == nil {
		entries = []pricing.Entry{}
	}
	return PriceTableView{ID: t.ID, Source: t.Source, AsOf: t.AsOf, CreatedAt: optTime(t.CreatedAt), CreatedBy: t.CreatedBy,
		Default: t.IsDefault(), Entries: entries, FallbackModel: t.FallbackModel}
}

// PriceTableForm is the body of PUT /prices: the whole new table.
type PriceTableForm struct {
	Source  string           `json:"source"`
	AsOf    string           `json:"as_of"`
	Entries []PriceEntryForm `json:"entries"`
	// FallbackModel names one of the entries' models, whose prices stand
	// in for a model the table does not price; empty: none (such a model
	// then costs nothing).
	FallbackModel string `json:"fallback_model"`
}

// PriceEntryForm is one entry of a PriceTableForm. The three token prices
// are required (0 for free), so a forgotten one is not taken for free; the
// price per image is for image models only (absent: 0); an empty tier, or
// "auto", is the default tier.
type PriceEntryForm struct {
	Model       string   `json:"model"`
	Tier        string   `json:"tier"`
	Input       *float64 `json:"input_per_million"`
	CachedInput *float64 `json:"cached_input_per_million"`
	Output      *float64 `json:"output_per_million"`
	PerImage    float64  `json:"per_image"`
}

// table reads the form into the table to validate and store.
func (f PriceTableForm) table() (pricing.Table, error) {
	t := pricing.Table{Source: strings.TrimSpace(f.Source), AsOf: strings.TrimSpace(f.AsOf),
		FallbackModel: strings.TrimSpace(f.FallbackModel), Entries: make([]pricing.Entry, len(f.Entries))}
	for i, e := range f.Entries {
		for _, p := range []struct {
			field string
			v     *float64
		}{{"input_per_million", e.Input}, {"cached_input_per_million", e.CachedInput}, {"output_per_million", e.Output}} {
			if p.v == nil {
				return pricing.Table{}, badField("entries["+strconv.Itoa(i)+"]."+p.field,
					"required: US dollars per million tokens (0 when free)")
			}
		}
		t.Entries[i] = pricing.Entry{Model: strings.TrimSpace(e.Model), Tier: pricing.NormalizeTier(e.Tier),
			Input: *e.Input, CachedInput: *e.CachedInput, Output: *e.Output, PerImage: e.PerImage}
	}
	return t, nil
}

// savePrices stores t as the new price table and audits it. An invalid
// table is a 400 naming the field (entries[3].tier), with the
// *pricing.FieldError kept as its cause; nothing is stored then.
func (s *Server) savePrices(c echo.Context, t pricing.Table) (pricing.Table, error) {
	saved, err := s.cfg.Store.SavePriceTable(c.Request().Context(), t, principalOf(c).Actor)
	var fe *pricing.FieldError
	if errors.As(err, &fe) {
		return pricing.Table{}, &HTTPError{Status: http.StatusBadRequest, Code: "invalid_field", Field: fe.Path(), Msg: fe.Error(), Err: fe}
	}
	if err != nil {
		return pricing.Table{}, err
	}
	s.audit(c, "prices.replace", "prices:"+saved.ID, fmt.Sprintf("%d %s; source %s; as of %s; fallback %s",
		len(saved.Entries), plural(len(saved.Entries), "entry", "entries"), cmp.Or(saved.Source, "(none)"), cmp.Or(saved.AsOf, "(none)"),
		cmp.Or(saved.FallbackModel, "(none)")))
	return saved, nil
}

// getPrices answers the table requests are priced with now.
func (s *Server) getPrices(c echo.Context) error {
	t, err := s.cfg.Store.PriceTable(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewPriceTable(t))
}

// putPrices replaces the price table. Requests settled from then on are
// priced with it; the request log keeps the costs it has.
func (s *Server) putPrices(c echo.Context) error {
	var f PriceTableForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	t, err := f.table()
	if err != nil {
		return err
	}
	saved, err := s.savePrices(c, t)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewPriceTable(saved))
}

// priceHistory lists the stored tables, newest (current) first; the
// built-in default, never stored, is not among them.
func (s *Server) priceHistory(c echo.Context) error {
	limit := 100
	if v := query(c, "limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageLimit {
			return badField("limit", "must be a whole number from 1 to %d", maxPageLimit)
		}
		limit = n
	}
	tables, err := s.cfg.Store.PriceTables(c.Request().Context(), limit)
	if err != nil {
		return err
	}
	out := make([]PriceTableView, len(tables))
	for i, t := range tables {
		out[i] = viewPriceTable(t)
	}
	return c.JSON(http.StatusOK, map[string]any{"tables": out})
}
