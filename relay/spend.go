package relay

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/store"
)

// HeaderLimit names the client key limit a request was refused under
// ("tokens/5h"), beside the 429 usage_limit_reached.
const HeaderLimit = "X-Codex-Relay-Limit"

// keyLimitError is a request its client key's limit does not admit.
type keyLimitError struct {
	limit   budget.Limit
	used    float64
	retryAt time.Time
}

func (e *keyLimitError) Error() string { return "client key at its limit " + e.limit.Name() }

// admitBudget admits a request under its key's limits, once per request
// whatever its attempts: a key without limits costs nothing; otherwise the
// store decides, across replicas, and the request reserves its estimate
// (a prewarm, which does no work, only checks). It reports whether a
// reservation may exist (the request's log row settles it) and refuses
// with a keyLimitError.
func (s *Server) admitBudget(ctx context.Context, r *request) (bool, error) {
	k := r.client.key
	if len(k.Limits) == 0 {
		return false, nil
	}
	reserve := !r.prewarm()
	var est budget.Use
	if reserve {
		est = s.estimate(ctx, r)
	}
	a, err := s.cfg.Store.Admit(ctx, store.Admission{Key: k, RequestID: r.id, Replica: s.cfg.Replica.ID,
		LiveSince: s.ReplicaLiveSince(), Estimate: est, Reserve: reserve, Location: s.cfg.Location, Now: s.cfg.Now()})
	if err != nil {
		return reserve, storeUnavailable("check the client key's limits", err)
	}
	r.keyUse = limitUseOf(k.Limits, a)
	for i, l := range k.Limits {
		if l.Max > 0 {
			s.metrics.budgetUse.WithLabelValues(k.ID, l.Name()).Set(a.Used[i] / l.Max)
		}
	}
	if refused := a.Refused; refused != nil {
		s.metrics.keyRefused.WithLabelValues(k.ID, refused.Limit.Name()).Inc()
		return false, &keyLimitError{limit: refused.Limit, used: refused.Used, retryAt: refused.RetryAt}
	}
	return reserve, nil
}

// estimate is what a request reserves: its input's tokens guessed from the
// size of its whole history, and an allowance for output, at its model's
// prices.
func (s *Server) estimate(ctx context.Context, r *request) budget.Use {
	size := len(r.body)
	if r.history != nil {
		size = 0
		for _, it := range r.history {
			size += len(it)
		}
	}
	var in, out float64
	if t, err := s.cfg.Store.PriceTable(ctx); err == nil {
		if q := t.Quote(r.fields.Model, serviceTier(r.body)); q.OK {
			in, out = q.Entry.Input*1000, q.Entry.Output*1000 // USD per million tokens is billionths of a USD per token, times 1000
		}
	}
	return budget.Estimate(size, in, out)
}

// serviceTier is the service tier a request body asks for ("" none).
func serviceTier(body []byte) string {
	s, e, ok := memberValue(body, "service_tier")
	if !ok {
		return ""
	}
	v, err := strconv.Unquote(string(body[s:e]))
	if err != nil {
		return ""
	}
	return v
}

// price is what a response's usage costs at the price table in force now
// (a model the table does not price at its fallback model's price,
// unpriced then), and the model its metrics count under: the table's name
// for it (dated snapshots share their model's series), or "other" when the
// table does not price it.
func (s *Server) price(ctx context.Context, r *request, tr *tracker, tier string) (cost int64, label string, unpriced bool) {
	t, err := s.cfg.Store.PriceTable(ctx)
	if err != nil {
		s.log.Warn("price table", "err", err)
		return 0, "other", true
	}
	q := t.Quote(cmp.Or(tr.model, r.fields.Model), tier)
	label = "other"
	if q.Priced {
		label = q.Entry.Model
	}
	if !q.OK {
		return 0, label, true
	}
	return q.Entry.Cost(pricing.Usage{Input: tr.input, CachedInput: tr.cached, Output: tr.outputTok, Images: tr.images}), label, !q.Priced
}

// finishReservation records a completed response's real use in its
// request's reservation, before its terminal event goes to the client (see
// store.FinishReservation). A failure leaves the estimate standing until
// the request's log row settles it.
func (s *Server) finishReservation(ctx context.Context, r *request, tr *tracker) {
	if !r.reserved {
		return
	}
	cost, _, _ := s.price(ctx, r, tr, cmp.Or(tr.tier, serviceTier(r.body)))
	ctx, cancel := storeWriteContext(ctx)
	defer cancel()
	if err := s.cfg.Store.FinishReservation(ctx, r.id, budget.Use{Requests: 1, Tokens: tr.total, CostNanos: cost}); err != nil {
		s.log.Warn("finish budget reservation", "request", r.id, "err", err)
	}
}

// charge fills a request's log row with what it used, priced at the table
// in force now (the row keeps that price), and whether it counts toward
// its key's budgets: the upstream did work for it.
func (s *Server) charge(ctx context.Context, r *request, rec *store.RequestRecord, tr *tracker, work bool) {
	rec.InputTokens, rec.OutputTokens, rec.CachedTokens = tr.input, tr.outputTok, tr.cached
	rec.ReasoningTokens, rec.TotalTokens = tr.reasoning, tr.total
	rec.ModelServed = tr.model
	rec.ServiceTier = cmp.Or(tr.tier, serviceTier(r.body))
	rec.Charged = work && !r.prewarm()
	if !tr.usage {
		return
	}
	cost, label, unpriced := s.price(ctx, r, tr, rec.ServiceTier)
	rec.CostNanos, rec.Unpriced = cost, unpriced
	key := cmp.Or(r.client.key.ID, "keyless")
	for kind, n := range map[string]int64{"input": tr.input, "cached_input": tr.cached, "output": tr.outputTok, "reasoning": tr.reasoning} {
		s.metrics.tokens.WithLabelValues(key, label, kind).Add(float64(n))
	}
	s.metrics.cost.WithLabelValues(key, label).Add(float64(cost) / 1e9)
}

// limitUnit says what a limit counts, for the refusal's message.
func limitUnit(l budget.Limit) string {
	per := map[budget.Window]string{budget.Minute: "per minute", budget.FiveHours: "per 5 hours", budget.Day: "per day",
		budget.Week: "per week", budget.Month: "per month"}[l.Window]
	switch l.Metric {
	case budget.Concurrent:
		return "requests at once"
	case budget.CostUSD:
		return "USD " + per
	}
	return string(l.Metric) + " " + per
}

// formatAmount prints a limit's figure: whole numbers as such, dollars to
// the cent or finer.
func formatAmount(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}
