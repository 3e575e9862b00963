package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// KeyView is a client key as the API shows it; Key is set only in the answer
// that created it.
type KeyView struct {
	ID           string     `json:"id"`
	Name         string     `json:"name"`
	Prefix       string     `json:"prefix"`
	Key          string     `json:"key,omitempty"`
	AccountIDs   []string   `json:"account_ids"`
	AccountTag   string     `json:"account_tag"`
	Models       []string   `json:"models"`
	ExpiresAt    *time.Time `json:"expires_at"`
	CreatedAt    time.Time  `json:"created_at"`
	LastUsedAt   *time.Time `json:"last_used_at"`
	RevokedAt    *time.Time `json:"revoked_at"`
	RequestCount int64      `json:"request_count"`
	// Limits are the key's budgets, each with its use now.
	Limits []LimitView `json:"limits"`
	// The key's model policy.
	ModelAliases       map[string]string `json:"model_aliases"`
	MaxReasoningEffort string            `json:"max_reasoning_effort"`
	PriorityTier       string            `json:"priority_tier"`
	// Warnings say where the key's limits will not count what the operator
	// may expect (costKeyWarnings); absent when there is nothing to say.
	Warnings []string `json:"warnings,omitempty"`
}

// LimitView is one limit of a key as the API shows it: max, what is used
// in its window now (settled; for concurrent, in flight), what requests in
// flight reserve, and when it resets (unix seconds; null: no reset ahead,
// as for concurrent or an empty rolling window).
type LimitView struct {
	Metric   string  `json:"metric"`
	Window   string  `json:"window,omitempty"`
	Max      float64 `json:"max"`
	Used     float64 `json:"used"`
	Reserved float64 `json:"reserved"`
	ResetsAt *int64  `json:"resets_at"`
}

// LimitForm is one limit as POST and PATCH take it.
type LimitForm struct {
	Metric string  `json:"metric"`
	Window string  `json:"window"`
	Max    float64 `json:"max"`
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func viewKey(k store.ClientKey) KeyView {
	v := KeyView{
		ID: k.ID, Name: k.Name, Prefix: k.Prefix, AccountIDs: nonNil(k.ScopeAccounts), AccountTag: k.ScopeTag,
		Models: nonNil(k.Models), ExpiresAt: optTime(k.ExpiresAt), CreatedAt: k.CreatedAt,
		LastUsedAt: optTime(k.LastUsedAt), RevokedAt: optTime(k.RevokedAt), RequestCount: k.RequestCount,
		Limits: []LimitView{}, ModelAliases: k.Policy.ModelAliases, MaxReasoningEffort: k.Policy.MaxReasoningEffort,
		PriorityTier: cmp.Or(k.Policy.PriorityTier, "allow"),
	}
	if v.ModelAliases == nil {
		v.ModelAliases = map[string]string{}
	}
	for _, l := range k.Limits {
		v.Limits = append(v.Limits, LimitView{Metric: string(l.Metric), Window: string(l.Window), Max: l.Max})
	}
	return v
}

// viewKeyUse is viewKey with each limit's use now.
func (s *Server) viewKeyUse(ctx context.Context, k store.ClientKey) (KeyView, error) {
	v := viewKey(k)
	if len(k.Limits) == 0 {
		return v, nil
	}
	if hasCostLimit(k.Limits) {
		t, err := s.cfg.Store.PriceTable(ctx)
		if err != nil {
			return v, err
		}
		v.Warnings = costKeyWarnings(k, t)
	}
	use, err := s.keyBudget(ctx, k)
	if err != nil {
		return v, err
	}
	for i, u := range use {
		v.Limits[i].Used, v.Limits[i].Reserved = u.Used, u.Reserved
		if !u.ResetsAt.IsZero() {
			at := u.ResetsAt.Unix()
			if u.ResetsAt.Nanosecond() > 0 {
				at++ // a reset within the second is reported at its end
			}
			v.Limits[i].ResetsAt = &at
		}
	}
	return v, nil
}

func hasCostLimit(ls []budget.Limit) bool {
	return slices.ContainsFunc(ls, func(l budget.Limit) bool { return l.Metric == budget.CostUSD })
}

// costKeyWarnings says, for a key with a cost_usd limit, which requests the
// price table t cannot cost as the operator may expect: a model the key may
// use (its allow-list, an alias's model) that t does not price is costed at
// t's fallback model, marked unpriced, or, without a fallback, costs
// nothing and the limit never counts it; a key that may use any model, with
// no fallback, has the same hole for every model t does not price.
func costKeyWarnings(k store.ClientKey, t pricing.Table) []string {
	if !hasCostLimit(k.Limits) {
		return nil
	}
	var models []string
	for _, m := range k.Models {
		models = append(models, cmp.Or(k.Policy.ModelAliases[m], m))
	}
	targets := make([]string, 0, len(k.Policy.ModelAliases))
	for _, m := range k.Policy.ModelAliases {
		targets = append(targets, m)
	}
	slices.Sort(targets)
	models = append(models, targets...)
	var out []string
	for _, m := range t.Unpriced(models) {
		if t.FallbackModel != "" {
			out = append(out, fmt.Sprintf("the price table does not price %s: the cost_usd limit counts its requests at %s's prices (the table's fallback_model), and usage reports mark them unpriced", m, t.FallbackModel))
		} else {
			out = append(out, fmt.Sprintf("the price table does not price %s and has no fallback_model: its requests cost $0 and the cost_usd limit never counts them; add %s to the price table or set a fallback_model", m, m))
		}
	}
	if len(k.Models) == 0 && t.FallbackModel == "" {
		out = append(out, "the key may ask for any model and the price table has no fallback_model: a model the table does not price costs $0 and the cost_usd limit never counts it; give the key an allow-list of priced models or set a fallback_model")
	}
	return out
}

// keyBudget reads how a key's limits stand: settled use, and the requests
// in flight on every live replica.
func (s *Server) keyBudget(ctx context.Context, k store.ClientKey) ([]store.LimitUse, error) {
	return s.cfg.Store.KeyBudget(ctx, k, s.cfg.Relay.ReplicaID(), s.cfg.Relay.ReplicaLiveSince(), s.cfg.Location)
}

// KeyForm is the body of POST /keys. Scope: account_ids, or account_tag, or
// neither for every account. Expiry: expires_at (RFC 3339) or expires_in (a
// Go duration such as "720h").
type KeyForm struct {
	Name       string   `json:"name"`
	AccountIDs []string `json:"account_ids"`
	AccountTag string   `json:"account_tag"`
	Models     []string `json:"models"`
	ExpiresAt  string   `json:"expires_at"`
	ExpiresIn  string   `json:"expires_in"`
	// Limits: see LimitForm; none is unlimited.
	Limits []LimitForm `json:"limits"`
	// ModelAliases maps a model name the key may ask for to the model
	// the upstream gets; MaxReasoningEffort caps reasoning.effort;
	// PriorityTier is allow (default), refuse or downgrade.
	ModelAliases       map[string]string `json:"model_aliases"`
	MaxReasoningEffort string            `json:"max_reasoning_effort"`
	PriorityTier       string            `json:"priority_tier"`
}

// keyLimits validates the limits of a key form.
func keyLimits(fs []LimitForm) ([]budget.Limit, error) {
	var out []budget.Limit
	for _, f := range fs {
		out = append(out, budget.Limit{Metric: budget.Metric(strings.TrimSpace(f.Metric)), Window: budget.Window(strings.TrimSpace(f.Window)), Max: f.Max})
	}
	if err := budget.ValidateAll(out); err != nil {
		return nil, badField("limits", "%s", err.Error())
	}
	return out, nil
}

// keyPolicy validates the model policy of a key form.
func keyPolicy(f KeyForm) (store.KeyPolicy, error) {
	p := store.KeyPolicy{MaxReasoningEffort: strings.TrimSpace(f.MaxReasoningEffort), PriorityTier: strings.TrimSpace(f.PriorityTier)}
	if len(f.ModelAliases) > 100 {
		return p, badField("model_aliases", "at most 100 aliases")
	}
	for alias, model := range f.ModelAliases {
		alias, model = strings.TrimSpace(alias), strings.TrimSpace(model)
		if alias == "" || model == "" || len(alias) > 200 || len(model) > 200 {
			return p, badField("model_aliases", "each alias and its model must be 1 to 200 characters")
		}
		if alias == model {
			return p, badField("model_aliases", "alias %q names itself", alias)
		}
		if p.ModelAliases == nil {
			p.ModelAliases = map[string]string{}
		}
		p.ModelAliases[alias] = model
	}
	if p.MaxReasoningEffort != "" && !relay.ValidEffort(p.MaxReasoningEffort) {
		return p, badField("max_reasoning_effort", "must be one of none, minimal, low, medium, high, xhigh (or empty: no cap)")
	}
	switch p.PriorityTier {
	case "", "allow", "refuse", "downgrade":
	default:
		return p, badField("priority_tier", "must be allow, refuse or downgrade")
	}
	if p.PriorityTier == "allow" {
		p.PriorityTier = ""
	}
	return p, nil
}

// newClientKey validates a key form into the key to create.
func (s *Server) newClientKey(c echo.Context, f KeyForm) (store.ClientKey, error) {
	k := store.ClientKey{Name: strings.TrimSpace(f.Name), ScopeTag: strings.TrimSpace(f.AccountTag)}
	var err error
	if k.Limits, err = keyLimits(f.Limits); err != nil {
		return k, err
	}
	if k.Policy, err = keyPolicy(f); err != nil {
		return k, err
	}
	for _, m := range f.Models {
		if m = strings.TrimSpace(m); m != "" {
			k.Models = append(k.Models, m)
		}
	}
	if k.Name == "" {
		return k, badField("name", "required: say who or what uses the key")
	}
	if len(k.Name) > 200 {
		return k, badField("name", "at most 200 characters")
	}
	if len(f.AccountIDs) > 0 && k.ScopeTag != "" {
		return k, badField("account_tag", "give account_ids or account_tag, not both")
	}
	for _, id := range f.AccountIDs {
		if _, err := s.cfg.Store.Account(c.Request().Context(), strings.TrimSpace(id)); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return k, badField("account_ids", "no account %q", id)
			}
			return k, err
		}
		k.ScopeAccounts = append(k.ScopeAccounts, strings.TrimSpace(id))
	}
	now := s.cfg.Now()
	switch {
	case f.ExpiresAt != "" && f.ExpiresIn != "":
		return k, badField("expires_in", "give expires_at or expires_in, not both")
	case f.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, f.ExpiresAt)
		if err != nil {
			return k, badField("expires_at", "must be an RFC 3339 time such as 2027-01-31T00:00:00Z")
		}
		if !t.After(now) {
			return k, badField("expires_at", "must be in the future")
		}
		k.ExpiresAt = t
	case f.ExpiresIn != "":
		d, err := time.ParseDuration(f.ExpiresIn)
		if err != nil || d <= 0 {
			return k, badField("expires_in", "must be a positive duration such as 720h")
		}
		k.ExpiresAt = now.Add(d)
	}
	return k, nil
}

func (s *Server) createKey(c echo.Context) error {
	var f KeyForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	created, secret, err := s.issueKey(c, f)
	if err != nil {
		return err
	}
	v, err := s.viewKeyUse(c.Request().Context(), created)
	if err != nil {
		return err
	}
	v.Key = secret
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().Header().Set("Location", "/api/v1/keys/"+created.ID)
	return c.JSON(http.StatusCreated, v)
}

func (s *Server) listKeys(c echo.Context) error {
	keys, err := s.cfg.Store.ClientKeys(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]KeyView, len(keys))
	for i, k := range keys {
		if out[i], err = s.viewKeyUse(c.Request().Context(), k); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": out})
}

func (s *Server) getKey(c echo.Context) error {
	k, err := s.cfg.Store.ClientKey(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	v, err := s.viewKeyUse(c.Request().Context(), k)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

// KeyPatch is the body of PATCH /keys/{id}: a field left out is kept.
// account_ids or account_tag replaces the scope (an empty list, or an empty
// tag, is every account); models replaces the allow-list; expires_at or
// expires_in sets a new expiry, and an empty expires_at removes it.
type KeyPatch struct {
	Name       *string   `json:"name"`
	AccountIDs *[]string `json:"account_ids"`
	AccountTag *string   `json:"account_tag"`
	Models     *[]string `json:"models"`
	ExpiresAt  *string   `json:"expires_at"`
	ExpiresIn  *string   `json:"expires_in"`
	// Limits replaces the key's limits (an empty list: unlimited).
	Limits             *[]LimitForm       `json:"limits"`
	ModelAliases       *map[string]string `json:"model_aliases"`
	MaxReasoningEffort *string            `json:"max_reasoning_effort"`
	PriorityTier       *string            `json:"priority_tier"`
}

// patchKey changes a key's name, scope, models or expiry. The change holds
// at the key's next request on every replica, open WebSockets included: a
// thread outside the new scope moves at its next request.
func (s *Server) patchKey(c echo.Context) error {
	var f KeyPatch
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	k, err := s.updateKey(c, c.Param("id"), f)
	if err != nil {
		return err
	}
	v, err := s.viewKeyUse(c.Request().Context(), k)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

// updateKey applies a patch to a key, validated as a new key's form is.
func (s *Server) updateKey(c echo.Context, id string, f KeyPatch) (store.ClientKey, error) {
	cur, err := s.cfg.Store.ClientKey(c.Request().Context(), id)
	if err != nil {
		return store.ClientKey{}, err
	}
	if !cur.RevokedAt.IsZero() {
		return store.ClientKey{}, &HTTPError{Status: http.StatusConflict, Code: "key_revoked", Msg: "a revoked key cannot be changed"}
	}
	form := KeyForm{Name: cur.Name, AccountIDs: cur.ScopeAccounts, AccountTag: cur.ScopeTag, Models: cur.Models,
		ModelAliases: cur.Policy.ModelAliases, MaxReasoningEffort: cur.Policy.MaxReasoningEffort, PriorityTier: cur.Policy.PriorityTier}
	for _, l := range cur.Limits {
		form.Limits = append(form.Limits, LimitForm{Metric: string(l.Metric), Window: string(l.Window), Max: l.Max})
	}
	if f.Limits != nil {
		form.Limits = *f.Limits
	}
	if f.ModelAliases != nil {
		form.ModelAliases = *f.ModelAliases
	}
	if f.MaxReasoningEffort != nil {
		form.MaxReasoningEffort = *f.MaxReasoningEffort
	}
	if f.PriorityTier != nil {
		form.PriorityTier = *f.PriorityTier
	}
	if f.Name != nil {
		form.Name = *f.Name
	}
	switch {
	case f.AccountIDs != nil && f.AccountTag != nil:
		form.AccountIDs, form.AccountTag = *f.AccountIDs, *f.AccountTag
	case f.AccountIDs != nil:
		form.AccountIDs, form.AccountTag = *f.AccountIDs, ""
	case f.AccountTag != nil:
		form.AccountIDs, form.AccountTag = nil, *f.AccountTag
	}
	if f.Models != nil {
		form.Models = *f.Models
	}
	if f.ExpiresAt != nil {
		form.ExpiresAt = *f.ExpiresAt
	}
	if f.ExpiresIn != nil {
		form.ExpiresIn = *f.ExpiresIn
	}
	k, err := s.newClientKey(c, form)
	if err != nil {
		return store.ClientKey{}, err
	}
	if f.ExpiresAt == nil && f.ExpiresIn == nil {
		k.ExpiresAt = cur.ExpiresAt // kept as it is, even when already past
	}
	k.ID = cur.ID
	updated, err := s.cfg.Store.UpdateClientKey(c.Request().Context(), k)
	if err != nil {
		return store.ClientKey{}, err
	}
	s.audit(c, "key.update", "key:"+updated.ID, updated.Name+": "+keyDiff(cur, updated))
	return updated, nil
}

// keyDiff says what an update changed in a key, before and after.
func keyDiff(a, b store.ClientKey) string {
	limits := func(k store.ClientKey) string {
		out := make([]string, len(k.Limits))
		for i, l := range k.Limits {
			out[i] = l.Name() + "=" + strconv.FormatFloat(l.Max, 'f', -1, 64)
		}
		return strings.Join(out, ",")
	}
	expires := func(k store.ClientKey) string {
		if k.ExpiresAt.IsZero() {
			return "never"
		}
		return k.ExpiresAt.UTC().Format(time.RFC3339)
	}
	aliases := func(k store.ClientKey) string {
		out := make([]string, 0, len(k.Policy.ModelAliases))
		for _, from := range slices.Sorted(maps.Keys(k.Policy.ModelAliases)) {
			out = append(out, from+"="+k.Policy.ModelAliases[from])
		}
		return strings.Join(out, ",")
	}
	var ch changes
	ch.add("name", a.Name, b.Name)
	ch.add("account_ids", strings.Join(a.ScopeAccounts, ","), strings.Join(b.ScopeAccounts, ","))
	ch.add("account_tag", a.ScopeTag, b.ScopeTag)
	ch.add("models", strings.Join(a.Models, ","), strings.Join(b.Models, ","))
	ch.add("expires_at", expires(a), expires(b))
	ch.add("limits", limits(a), limits(b))
	ch.add("model_aliases", aliases(a), aliases(b))
	ch.add("max_reasoning_effort", a.Policy.MaxReasoningEffort, b.Policy.MaxReasoningEffort)
	ch.add("priority_tier", a.Policy.PriorityTier, b.Policy.PriorityTier)
	if len(ch) == 0 {
		return "nothing changed"
	}
	return ch.String()
}

// revokeKey revokes rather than deletes, so the request log keeps naming it.
func (s *Server) revokeKey(c echo.Context) error {
	k, err := s.revokeKeyByID(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewKey(k))
}
