package web

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// The Settings page shows the price table in effect and replaces it from a
// form; a refused form is shown again as typed, and nothing is saved.
func TestConsolePrices(t *testing.T) {
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		ctx := context.Background()
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()

		rec := b.get("/admin/settings")
		require.Equal(t, http.StatusOK, rec.Code)
		page := body(rec)
		assert.Contains(t, page, `<section id="prices">`)
		assert.Contains(t, page, `href="https://openai.com/api/pricing/"`, "the source is a link")
		assert.Contains(t, page, "2026-06-28")
		assert.Contains(t, page, "built-in default")
		assert.Contains(t, page, `<code class="price-fallback">gpt-5.5</code>`)
		assert.Contains(t, page, `name="fallback_model" value="gpt-5.5"`)
		assert.Contains(t, page, `<td data-label="Model"><code>gpt-5.1-codex-mini</code></td>`, "the entries are listed")
		assert.Contains(t, page, "\ngpt-5.1-codex,default,1.25,0.125,10\ngpt-5.1-codex,priority,2.5,0.25,20\n", "the form holds the current entries")
		assert.Contains(t, page, `action="/admin/settings/prices"`)

		typed := "# model,tier,input,cached_input,output\ngpt-5.1-codex, default, 1.5, 0.15, 12\n\ngpt-5.1-codex,priority,3,0.3\n"
		rec = b.post("/admin/settings/prices", url.Values{"source": {"ops sheet <v2>"}, "as_of": {"2026-03-01"}, "entries": {typed}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		page = body(rec)
		assert.Contains(t, page, "The price table was not saved")
		assert.Contains(t, page, "line 4: give 5 values", "the error names the line, counting blank and skipped ones")
		assert.Contains(t, page, html.EscapeString(typed), "the form is shown again as typed")
		assert.Contains(t, page, `value="ops sheet &lt;v2&gt;"`)
		assert.Contains(t, page, "<details open>")

		rec = b.post("/admin/settings/prices", url.Values{"source": {"s"}, "as_of": {"2026-03-01"},
			"entries": {"gpt-5.1-codex,default,1.5,0.15,12\ngpt-5.1-codex,turbo,3,0.3,24\n"}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, body(rec), "line 2 (gpt-5.1-codex): the tier must be default, flex or priority")

		rec = b.post("/admin/settings/prices", url.Values{"entries": {"gpt-5.1-codex,default,1.5,free,12\n"}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, body(rec), "line 1: the cached input price &#34;free&#34; is not a number")

		rec = b.post("/admin/settings/prices", url.Values{"fallback_model": {"gpt-9"}, "entries": {"gpt-5.1-codex,default,1.5,0.15,12\n"}})
		require.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, body(rec), "the fallback model &#34;gpt-9&#34; has no default-tier price in the table")
		assert.Contains(t, body(rec), `name="fallback_model" value="gpt-9"`, "kept as typed")

		hist, err := s.PriceTables(ctx, 0)
		require.NoError(t, err)
		assert.Empty(t, hist, "nothing saved while the form was refused")

		rec = b.post("/admin/settings/prices", url.Values{"source": {"https://example.com/ops"}, "as_of": {"2026-03-01"},
			"fallback_model": {" gpt-5.1-codex "}, "entries": {"# ours\ngpt-5.1-codex,,1.5,0.15,12\r\ngpt-5.1-codex, priority ,3,0.3,24\n"}})
		require.Equal(t, http.StatusSeeOther, rec.Code, body(rec))
		assert.Equal(t, "/admin/settings#prices", rec.Header().Get("Location"))

		cur, err := s.PriceTable(ctx)
		require.NoError(t, err)
		assert.False(t, cur.IsDefault())
		assert.Equal(t, "https://example.com/ops", cur.Source)
		assert.Equal(t, "2026-03-01", cur.AsOf)
		assert.Equal(t, "admin-token", cur.CreatedBy)
		assert.Equal(t, "gpt-5.1-codex", cur.FallbackModel)
		assert.Equal(t, []pricing.Entry{
			{Model: "gpt-5.1-codex", Tier: "default", Input: 1.5, CachedInput: 0.15, Output: 12},
			{Model: "gpt-5.1-codex", Tier: "priority", Input: 3, CachedInput: 0.3, Output: 24},
		}, cur.Entries)
		audits, _, err := s.AuditLog(ctx, store.AuditFilter{Action: "prices.replace"})
		require.NoError(t, err)
		require.Len(t, audits, 1)
		assert.Equal(t, "admin-token", audits[0].Actor)

		page = body(b.get("/admin/settings"))
		assert.Contains(t, page, "Saved the price table (2 entries)")
		assert.Contains(t, page, `href="https://example.com/ops"`)
		assert.Contains(t, page, "by admin")
		assert.Contains(t, page, cur.ID)
		assert.NotContains(t, page, "built-in default")
		assert.Contains(t, page, "required>\ngpt-5.1-codex,default,1.5,0.15,12\ngpt-5.1-codex,priority,3,0.3,24\n</textarea>",
			"after a newline, which browsers drop from the start of a textarea")
		assert.NotContains(t, page, "gpt-5.1-codex-mini", "the old entries are gone from the page")
	})
}

// A source that is not an http(s) URL is shown as text, never as a link.
func TestConsolePricesSourceIsALinkOnlyWhenAWebAddress(t *testing.T) {
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	for _, src := range []string{"javascript:alert(1)", "our spreadsheet", "//example.com/x"} {
		_, err := s.SavePriceTable(context.Background(), pricing.Table{Source: src, Entries: []pricing.Entry{{Model: "m", Tier: "default"}}}, "api")
		require.NoError(t, err)
		srv, _ := consoleServer(t, s)
		b := newBrowser(t, srv)
		b.login()
		page := body(b.get("/admin/settings"))
		assert.Contains(t, page, `<code class="price-source">`+html.EscapeString(src)+`</code>`, src)
		assert.NotContains(t, page, `class="price-source" href`, src)
		assert.NotContains(t, page, `href="`+src, src)
	}
}

func TestParsePriceLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		text    string
		want    []pricing.Entry
		lines   []int
		wantErr string
	}{
		{"one line", "gpt-5,default,1.25,0.125,10", []pricing.Entry{{Model: "gpt-5", Tier: "default", Input: 1.25, CachedInput: 0.125, Output: 10}}, []int{1}, ""},
		{"spaces, CRLF, blanks and comments", "# header\r\n\r\n  gpt-5 , Flex , 0.625 , 0.0625 , 5 \r\n\no3,auto,2,0.5,8\r\n",
			[]pricing.Entry{{Model: "gpt-5", Tier: "flex", Input: 0.625, CachedInput: 0.0625, Output: 5}, {Model: "o3", Tier: "default", Input: 2, CachedInput: 0.5, Output: 8}}, []int{3, 5}, ""},
		{"empty tier is default", "o3,,2,0.5,8", []pricing.Entry{{Model: "o3", Tier: "default", Input: 2, CachedInput: 0.5, Output: 8}}, []int{1}, ""},
		{"unknown tier is kept for Validate", "o3,turbo,2,0.5,8", []pricing.Entry{{Model: "o3", Tier: "turbo", Input: 2, CachedInput: 0.5, Output: 8}}, []int{1}, ""},
		{"nothing", "\n# only a comment\n", nil, nil, ""},
		{"too few values", "o3,default,2,0.5", nil, nil, "line 1: give 5 values"},
		{"a price per image", "gpt-image-2,default,5,1.25,40,0.04",
			[]pricing.Entry{{Model: "gpt-image-2", Tier: "default", Input: 5, CachedInput: 1.25, Output: 40, PerImage: 0.04}}, []int{1}, ""},
		{"too many values", "\no3,default,2,0.5,8,9,1", nil, nil,
			"line 2: give 5 values separated by commas (model,tier,input,cached_input,output), and a sixth for an image model (per_image), not 7"},
		{"a price per image that is not a number", "img,default,0,0,0,cheap", nil, nil, `line 1: the price per image "cheap" is not a number`},
		{"not a number", "o3,default,2,0.5,eight", nil, nil, `line 1: the output price "eight" is not a number`},
		{"empty price", "o3,default,,0.5,8", nil, nil, `line 1: the input price "" is not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, lines, err := parsePriceLines(tc.text)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				he := toHTTPError(err)
				assert.Equal(t, http.StatusBadRequest, he.Status)
				assert.Equal(t, "entries", he.Field)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.lines, lines)
		})
	}
	_, _, err := parsePriceLines(strings.Repeat("m,default,1,1,1\n", pricing.MaxEntries+1))
	assert.ErrorContains(t, err, "at most 2000 entries")
}

// The lines the form is filled with read back as the same entries.
func TestPriceLinesRoundTrip(t *testing.T) {
	t.Parallel()
	d := pricing.Default()
	entries := append(d.Entries, pricing.Entry{Model: "gpt-image-2", Tier: "default", Output: 40, PerImage: 0.04})
	got, _, err := parsePriceLines(formatPriceLines(entries))
	require.NoError(t, err)
	assert.Equal(t, entries, got)
}

func FuzzParsePriceLines(f *testing.F) {
	f.Add("gpt-5,default,1.25,0.125,10\n# c\n\no3,,2,0.5,8")
	f.Add("a,b,c,d,e,f")
	f.Add("x,flex,NaN,Inf,-0\r\n")
	f.Fuzz(func(t *testing.T, text string) {
		entries, lines, err := parsePriceLines(text)
		if err != nil {
			return
		}
		require.Len(t, lines, len(entries))
		for i := 1; i < len(lines); i++ {
			require.Greater(t, lines[i], lines[i-1])
		}
		if (pricing.Table{Entries: entries}).Validate() != nil {
			return
		}
		again, _, err := parsePriceLines(formatPriceLines(entries))
		require.NoError(t, err)
		require.Equal(t, entries, again, "a valid table reads back as written")
	})
}
