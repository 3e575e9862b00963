package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's price table: shown on the Settings page, replaced with a
// form whose entries are lines of text, model,tier,input,cached_input,output.

// pricesView is the Settings page's price section; form, when set, is what
// the operator typed into a form that was refused, shown again as typed.
func (s *Server) pricesView(ctx context.Context, form *ui.PriceForm) (ui.Prices, error) {
	t, err := s.cfg.Store.PriceTable(ctx)
	if err != nil {
		return ui.Prices{}, err
	}
	p := ui.Prices{Source: t.Source, AsOf: t.AsOf, Default: t.IsDefault(), ID: t.ID, State: "built-in default",
		Fallback: t.FallbackModel,
		Form:     ui.PriceForm{Source: t.Source, AsOf: t.AsOf, Fallback: t.FallbackModel, Entries: formatPriceLines(t.Entries)}}
	if u, err := url.Parse(t.Source); err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" {
		p.SourceURL = t.Source
	}
	if !p.Default {
		p.State = "saved " + stamp(t.CreatedAt) + " by " + t.CreatedBy
	}
	for _, e := range t.Entries {
		row := ui.PriceRow{Model: e.Model, Tier: e.Tier, Input: formatPrice(e.Input),
			CachedInput: formatPrice(e.CachedInput), Output: formatPrice(e.Output)}
		if e.PerImage > 0 {
			row.PerImage = formatPrice(e.PerImage)
		}
		p.Rows = append(p.Rows, row)
	}
	if form != nil {
		p.Form = *form
		p.Form.Open = true
	}
	return p, nil
}

func formatPrice(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// formatPriceLines writes entries as the form's lines, which
// parsePriceLines reads back; a price per image is a sixth value, written
// only when there is one.
func formatPriceLines(entries []pricing.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%s,%s,%s,%s,%s", e.Model, e.Tier, formatPrice(e.Input), formatPrice(e.CachedInput), formatPrice(e.Output))
		if e.PerImage > 0 {
			fmt.Fprintf(&b, ",%s", formatPrice(e.PerImage))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// priceLineFields names the values of a line, for messages.
var priceLineFields = [6]string{"model", "tier", "input price", "cached input price", "output price", "price per image"}

// parsePriceLines reads the form's entries: one a line, five values
// separated by commas (model, tier, and the input, cached input and output
// prices in US dollars per million tokens), and for an image model a sixth,
// its price per image in US dollars; an empty tier, or auto, is the
// default tier. Blank lines and lines starting with # are skipped. lines
// holds each entry's line number, from 1, for messages. The errors name the
// line; the table's own rules are pricing.Validate's.
func parsePriceLines(text string) (entries []pricing.Entry, lines []int, err error) {
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(entries) == pricing.MaxEntries {
			return nil, nil, badField("entries", "at most %d entries", pricing.MaxEntries)
		}
		v := strings.Split(line, ",")
		if len(v) != 5 && len(v) != 6 {
			return nil, nil, badField("entries", "line %d: give 5 values separated by commas (model,tier,input,cached_input,output), "+
				"and a sixth for an image model (per_image), not %d", n, len(v))
		}
		var prices [4]float64
		for j := range v[2:] {
			raw := strings.TrimSpace(v[2+j])
			p, perr := strconv.ParseFloat(raw, 64)
			if perr != nil {
				return nil, nil, badField("entries", "line %d: the %s %q is not a number", n, priceLineFields[2+j], raw)
			}
			prices[j] = p
		}
		entries = append(entries, pricing.Entry{Model: strings.TrimSpace(v[0]), Tier: pricing.NormalizeTier(v[1]),
			Input: prices[0], CachedInput: prices[1], Output: prices[2], PerImage: prices[3]})
		lines = append(lines, n)
	}
	return entries, lines, nil
}

// consoleSavePrices replaces the price table from the Settings page's
// form. A refused form is shown again as typed, with the error naming its
// line; nothing is saved then.
func (s *Server) consoleSavePrices(c echo.Context) error {
	form := ui.PriceForm{Source: strings.TrimSpace(c.FormValue("source")), AsOf: strings.TrimSpace(c.FormValue("as_of")),
		Fallback: strings.TrimSpace(c.FormValue("fallback_model")), Entries: c.FormValue("entries")}
	saved, err := s.savePriceForm(c, form)
	if err != nil {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: "The price table was not saved: " + msg})
		return s.renderSettings(c, http.StatusBadRequest, &form)
	}
	return s.back(c, "/admin/settings#prices", nil, fmt.Sprintf("Saved the price table (%d %s): requests are priced with it from now on.",
		len(saved.Entries), plural(len(saved.Entries), "entry", "entries")))
}

// savePriceForm parses and saves the form, with validation errors worded
// by line.
func (s *Server) savePriceForm(c echo.Context, form ui.PriceForm) (pricing.Table, error) {
	entries, lines, err := parsePriceLines(form.Entries)
	if err != nil {
		return pricing.Table{}, err
	}
	saved, err := s.savePrices(c, pricing.Table{Source: form.Source, AsOf: form.AsOf, FallbackModel: form.Fallback, Entries: entries})
	var fe *pricing.FieldError
	if errors.As(err, &fe) && fe.Index >= 0 && fe.Index < len(lines) {
		where := "line " + strconv.Itoa(lines[fe.Index])
		if fe.Model != "" {
			where += " (" + fe.Model + ")"
		}
		return pricing.Table{}, badField("entries", "%s: %s", where, fe.Problem)
	}
	return saved, err
}
