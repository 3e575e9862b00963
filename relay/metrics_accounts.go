package relay

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/codexrelay/codex-relay/internal/store"
)

// accountStatuses are every status an account may have: each is a series
// of codex_relay_accounts, zeros included, so a rule can compare them.
var accountStatuses = []store.Status{store.StatusActive, store.StatusRateLimited, store.StatusQuotaExceeded,
	store.StatusPaused, store.StatusReauthRequired, store.StatusDisabled}

// accountsCollector reports the pool's state at each scrape, from the
// store's cached account list (no round trip per scrape while it is
// fresh): how many accounts have each status, how many could take a
// request now, each account's status, and the usage windows its upstream
// last reported. The Helm chart's PrometheusRule alerts on them as the
// webhooks do (an account that needs a new login, one exhausted, a pool
// with nothing left).
type accountsCollector struct {
	s                                 *Server
	accounts, available, status, used *prometheus.Desc
}

func newAccountsCollector(s *Server) *accountsCollector {
	return &accountsCollector{s: s,
		accounts: prometheus.NewDesc("codex_relay_accounts",
			"Accounts by status.", []string{"status"}, nil),
		available: prometheus.NewDesc("codex_relay_accounts_available",
			"Accounts that could take a request now (active, or cooling past their reset).", nil, nil),
		status: prometheus.NewDesc("codex_relay_account_status",
			"1 for each account, labelled with its status.", []string{"account", "label", "status"}, nil),
		used: prometheus.NewDesc("codex_relay_account_usage_ratio",
			"The share of an account's usage window used, as its upstream last reported it (1: exhausted).",
			[]string{"account", "label", "window"}, nil),
	}
}

func (c *accountsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.accounts
	ch <- c.available
	ch <- c.status
	ch <- c.used
}

func (c *accountsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accounts, err := c.s.cfg.Store.Accounts(ctx)
	if err != nil {
		// No figures rather than wrong ones: the series go missing, which
		// a rule sees as absent, and the scrape itself still succeeds.
		c.s.log.Warn("metrics: read accounts", "err", err)
		return
	}
	for _, p := range poolMetrics(accounts, c.s.cfg.Now()) {
		ch <- p.metric(c)
	}
}

// poolMetric is one sample of accountsCollector, as plain data.
type poolMetric struct {
	desc   string // "accounts", "available", "status", "used"
	labels []string
	value  float64
}

func (p poolMetric) metric(c *accountsCollector) prometheus.Metric {
	d := map[string]*prometheus.Desc{"accounts": c.accounts, "available": c.available, "status": c.status, "used": c.used}[p.desc]
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, p.value, p.labels...)
}

// poolMetrics is what accountsCollector reports for accounts at now.
func poolMetrics(accounts []store.Account, now time.Time) []poolMetric {
	counts := make(map[store.Status]int, len(accountStatuses))
	available := 0
	var out []poolMetric
	for _, a := range accounts {
		counts[a.Status]++
		if ok, _, _ := availability(candidate{Account: a}, now); ok {
			available++
		}
		out = append(out, poolMetric{desc: "status", labels: []string{a.ID, a.Label, string(a.Status)}, value: 1})
		for _, w := range []struct {
			name string
			w    store.Window
		}{{"primary", a.Primary}, {"secondary", a.Secondary}} {
			if !w.w.Known {
				continue
			}
			used := w.w.UsedPercent / 100
			if !w.w.ResetAt.IsZero() && !now.Before(w.w.ResetAt) {
				used = 0 // the window has reset since the upstream said so
			}
			out = append(out, poolMetric{desc: "used", labels: []string{a.ID, a.Label, w.name}, value: used})
		}
	}
	for _, st := range accountStatuses {
		out = append(out, poolMetric{desc: "accounts", labels: []string{string(st)}, value: float64(counts[st])})
	}
	return append(out, poolMetric{desc: "available", value: float64(available)})
}
