package web

import (
	"cmp"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// A client key's console page: its scope and state, each limit with its
// use, and the form that edits its limits and model policy. The form goes
// through the same validation as PATCH /api/v1/keys/{id} (updateKey), so
// its errors read as the API's.

func keyURL(id string) string { return "/admin/keys/" + url.PathEscape(id) }

// keyRow shows a key as the keys list and its page do.
func keyRow(k store.ClientKey, n names, now time.Time) ui.KeyRow {
	r := ui.KeyRow{ID: k.ID, Name: k.Name, Prefix: k.Prefix, Scope: "all accounts", Models: "all",
		Expires: "never", Created: stamp(k.CreatedAt), LastUsed: ago(now, k.LastUsedAt), Requests: k.RequestCount,
		State: "active", Tone: "ok", Revoked: !k.RevokedAt.IsZero(), URL: keyURL(k.ID), Limits: "none",
		RequestsURL: "/admin/requests?" + url.Values{"client_key": {k.ID}}.Encode(),
		BindingsURL: "/admin/bindings?" + url.Values{"client_key": {k.ID}}.Encode()}
	switch {
	case len(k.ScopeAccounts) > 0:
		labels := make([]string, len(k.ScopeAccounts))
		for i, id := range k.ScopeAccounts {
			labels[i] = n.accountName(id)
		}
		r.Scope = strings.Join(labels, ", ")
	case k.ScopeTag != "":
		r.Scope = "accounts tagged " + k.ScopeTag
	}
	if len(k.Models) > 0 {
		r.Models = strings.Join(k.Models, ", ")
	}
	if len(k.Limits) > 0 {
		names := make([]string, len(k.Limits))
		for i, l := range k.Limits {
			names[i] = l.Name() + " " + limitAmount(l, l.Max)
		}
		r.Limits = strings.Join(names, ", ")
	}
	if !k.ExpiresAt.IsZero() {
		r.Expires = until(now, k.ExpiresAt)
	}
	switch {
	case r.Revoked:
		r.State, r.Tone = "revoked", "bad"
	case !k.ExpiresAt.IsZero() && !k.ExpiresAt.After(now):
		r.State, r.Tone = "expired", "warn"
	}
	return r
}

// limitAmount writes an amount in a limit's unit: dollars for cost, a
// count otherwise.
func limitAmount(l budget.Limit, v float64) string {
	if l.Metric == budget.CostUSD {
		return "$" + fnum(v)
	}
	return thousands(int64(v))
}

// keyLimitsForm is the key page's form as typed: limits and model aliases
// one a line, the reasoning effort cap and the priority tier rule.
type keyLimitsForm struct {
	Limits, Aliases, Effort, Tier string
}

func parseKeyLimitsForm(c echo.Context) keyLimitsForm {
	return keyLimitsForm{Limits: c.FormValue("limits"), Aliases: c.FormValue("model_aliases"),
		Effort: strings.TrimSpace(c.FormValue("max_reasoning_effort")), Tier: strings.TrimSpace(c.FormValue("priority_tier"))}
}

// patch is the form as PATCH /api/v1/keys/{id} takes it: the limits and
// the policy replaced, the rest of the key kept.
func (f keyLimitsForm) patch() (KeyPatch, error) {
	limits, err := ParseLimitLines(f.Limits)
	if err != nil {
		return KeyPatch{}, err
	}
	aliases, err := parseAliasLines(f.Aliases)
	if err != nil {
		return KeyPatch{}, err
	}
	return KeyPatch{Limits: &limits, ModelAliases: &aliases, MaxReasoningEffort: &f.Effort, PriorityTier: &f.Tier}, nil
}

// ParseLimitLines reads limits written one a line as metric/window=max
// (tokens/5h=2000000, cost_usd/month=50) or concurrent=max; blank lines
// and lines starting with # are skipped. Only the shape of a line is
// checked here, its errors naming the line; the limits themselves are
// validated where the API validates them (keyLimits), with its messages.
func ParseLimitLines(text string) ([]LimitForm, error) {
	out := []LimitForm{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, raw, ok := strings.Cut(line, "=")
		if !ok {
			return nil, badField("limits", "line %d: write metric/window=max, such as tokens/5h=2000000, or concurrent=max", i+1)
		}
		raw = strings.TrimSpace(raw)
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return nil, badField("limits", "line %d: the max %q is not a number", i+1, raw)
		}
		metric, window, _ := strings.Cut(name, "/")
		out = append(out, LimitForm{Metric: strings.TrimSpace(metric), Window: strings.TrimSpace(window), Max: v})
	}
	return out, nil
}

// formatLimitLines writes limits as ParseLimitLines reads them.
func formatLimitLines(ls []budget.Limit) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Name() + "=" + fnum(l.Max) + "\n")
	}
	return b.String()
}

// parseAliasLines reads model aliases written one a line as alias=model;
// blank lines and lines starting with # are skipped, and an alias given
// twice is refused. The aliases are validated where the API validates
// them (keyPolicy).
func parseAliasLines(text string) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		alias, model, ok := strings.Cut(line, "=")
		if !ok {
			return nil, badField("model_aliases", "line %d: write alias=model, such as fast=gpt-5.1-codex-mini", i+1)
		}
		alias = strings.TrimSpace(alias)
		if _, dup := out[alias]; dup {
			return nil, badField("model_aliases", "line %d: alias %q is given twice", i+1, alias)
		}
		out[alias] = strings.TrimSpace(model)
	}
	return out, nil
}

// formatAliasLines writes aliases as parseAliasLines reads them, sorted.
func formatAliasLines(m map[string]string) string {
	aliases := make([]string, 0, len(m))
	for a := range m {
		aliases = append(aliases, a)
	}
	slices.Sort(aliases)
	var b strings.Builder
	for _, a := range aliases {
		b.WriteString(a + "=" + m[a] + "\n")
	}
	return b.String()
}

// efforts are the reasoning effort caps a key may have, weakest first;
// "" is no cap.
var efforts = []string{"none", "minimal", "low", "medium", "high", "xhigh"}

func effortOptions(selected string) []ui.Option {
	return append([]ui.Option{{Value: "", Label: "no cap", Selected: selected == ""}}, choices(selected, efforts...)...)
}

func (s *Server) keyPage(c echo.Context) error {
	return s.renderKey(c, http.StatusOK, c.Param("id"), nil)
}

// renderKey shows a key's page; typed, when set, is a refused form, shown
// again as typed.
func (s *Server) renderKey(c echo.Context, status int, id string, typed *keyLimitsForm) error {
	ctx := c.Request().Context()
	k, err := s.cfg.Store.ClientKey(ctx, id)
	if err != nil {
		return err
	}
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	v, err := s.viewKeyUse(ctx, k)
	if err != nil {
		return err
	}
	now, loc := s.cfg.Now(), s.cfg.Location
	p := ui.KeyDetail{Key: keyRow(k, n, now), Zone: loc.String(),
		UsageURL: "/admin/usage?" + url.Values{"key": {k.ID}}.Encode(), Effort: cmp.Or(k.Policy.MaxReasoningEffort, "no cap"),
		Tier: cmp.Or(k.Policy.PriorityTier, "allow")}
	for _, l := range v.Limits {
		p.Limits = append(p.Limits, limitGauge(l, now, loc))
	}
	p.Warnings = v.Warnings
	aliases := make([]string, 0, len(k.Policy.ModelAliases))
	for a, m := range k.Policy.ModelAliases {
		aliases = append(aliases, a+" → "+m)
	}
	slices.Sort(aliases)
	p.Aliases = aliases
	form := keyLimitsForm{Limits: formatLimitLines(k.Limits), Aliases: formatAliasLines(k.Policy.ModelAliases),
		Effort: k.Policy.MaxReasoningEffort, Tier: cmp.Or(k.Policy.PriorityTier, "allow")}
	if typed != nil {
		form = *typed
	}
	p.Form = ui.KeyLimitsForm{Limits: form.Limits, Aliases: form.Aliases, Efforts: effortOptions(form.Effort),
		Tiers: choices(form.Tier, "allow", "refuse", "downgrade")}
	return s.render(c, status, ui.KeyPage(s.frame(c, "keys", "Client key "+k.Name), p))
}

// consoleUpdateKey saves the key page's form. A refused form is shown
// again as typed, with the API's message; nothing is saved then.
func (s *Server) consoleUpdateKey(c echo.Context) error {
	id := c.Param("id")
	f := parseKeyLimitsForm(c)
	patch, err := f.patch()
	var k store.ClientKey
	if err == nil {
		k, err = s.updateKey(c, id, patch)
	}
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return err
		}
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: "Not saved: " + msg})
		return s.renderKey(c, toHTTPError(err).Status, id, &f)
	}
	return s.back(c, keyURL(k.ID), nil, "Saved the limits and policy of "+k.Name+": they apply from its next request.")
}
