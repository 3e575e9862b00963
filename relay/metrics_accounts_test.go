package relay

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

func TestPoolMetrics(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	win := func(pct float64, reset time.Time) store.Window {
		return store.Window{UsedPercent: pct, WindowMinutes: 300, ResetAt: reset, Known: true}
	}
	accounts := []store.Account{
		{ID: "a1", Label: "one", Status: store.StatusActive, Primary: win(40, now.Add(time.Hour))},
		{ID: "a2", Label: "two", Status: store.StatusRateLimited, StatusUntil: now.Add(time.Hour), Primary: win(100, now.Add(time.Hour))},
		{ID: "a3", Label: "three", Status: store.StatusRateLimited, StatusUntil: now.Add(-time.Minute), Primary: win(100, now.Add(-time.Minute))},
		{ID: "a4", Label: "four", Status: store.StatusReauthRequired},
	}
	got := map[string]float64{}
	for _, p := range poolMetrics(accounts, now) {
		key := p.desc
		for _, l := range p.labels {
			key += "/" + l
		}
		got[key] = p.value
	}
	assert.Equal(t, map[string]float64{
		"status/a1/one/active": 1, "status/a2/two/rate_limited": 1, "status/a3/three/rate_limited": 1, "status/a4/four/reauth_required": 1,
		"used/a1/one/primary": 0.4, "used/a2/two/primary": 1,
		"used/a3/three/primary": 0, // reset since: nothing used
		"accounts/active":       1, "accounts/rate_limited": 2, "accounts/quota_exceeded": 0, "accounts/paused": 0,
		"accounts/reauth_required": 1, "accounts/disabled": 0,
		"available": 2, // a1, and a3 past its reset
	}, got)
	for _, p := range poolMetrics(nil, now) {
		if p.desc == "available" {
			assert.Zero(t, p.value, "an empty pool has nothing available")
		}
	}
}

// recordingRegisterer keeps what is registered, for its descriptions.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([a-z_:]+)"`)

// Every codex_relay_ series the Helm chart's alerts and Grafana dashboard
// query is one the relay exposes (a histogram by its _bucket, _sum and
// _count too): a renamed metric fails here, not in a silent panel.
func TestMonitoringQueriesTheRelaysSeries(t *testing.T) {
	t.Parallel()
	reg := &recordingRegisterer{Registerer: prometheus.NewRegistry()}
	s := New(Config{Store: storetest.Open(t, storetest.SQLiteURL(t), store.Options{}), Registry: reg})
	defer s.Close()
	exposed := map[string]bool{}
	for _, c := range reg.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, d.String())
			exposed[m[1]] = true
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exposed[m[1]+suffix] = true
			}
		}
	}
	require.True(t, exposed["codex_relay_accounts_available"])
	series := regexp.MustCompile(`codex_relay_[a-z_]+`)
	for _, f := range []string{"../deploy/helm/codex-relay/templates/prometheusrule.yaml", "../deploy/helm/codex-relay/dashboards/codex-relay.json"} {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		names := series.FindAllString(string(raw), -1)
		require.NotEmpty(t, names, f)
		for _, n := range names {
			assert.True(t, exposed[n], "%s queries %s, which the relay does not expose", f, n)
		}
	}
}
