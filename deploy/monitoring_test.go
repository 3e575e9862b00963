package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// dashboardFile is the Grafana dashboard the chart ships.
const dashboardFile = chartDir + "/dashboards/codex-relay.json"

// alerts are the PrometheusRule's alerts: the conditions the relay's
// webhooks report (README, Alerts), each on the relay's own series.
var alerts = []string{"CodexRelayAccountNeedsLogin", "CodexRelayAccountExhausted", "CodexRelayPoolExhausted",
	"CodexRelayKeyLimitNear", "CodexRelayKeyLimitReached", "CodexRelayReplicaLost", "CodexRelayUpstreamErrors"}

// The PrometheusRule renders, decodes strictly into the operator's type,
// and holds every alert with an expression Prometheus parses, scoped to the
// release's namespace and Service, a valid "for", a severity and a
// summary; the thresholds come from the values.
func TestPrometheusRule(t *testing.T) {
	t.Parallel()
	r := mustRender(t, map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{
		"enabled": true, "labels": map[string]any{"release": "kube-prometheus"}, "upstreamErrorRatio": 0.35}}})
	rule := r.get(t, "PrometheusRule", "relay-codex-relay").(*monitoringv1.PrometheusRule)
	assert.Equal(t, "kube-prometheus", rule.Labels["release"])
	require.Len(t, rule.Spec.Groups, 1)
	var names []string
	for _, ru := range rule.Spec.Groups[0].Rules {
		names = append(names, ru.Alert)
		expr := ru.Expr.String()
		_, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
		require.NoError(t, err, "%s: %s", ru.Alert, expr)
		assert.Contains(t, expr, `namespace="codex", service="relay-codex-relay"`, "%s is scoped to the release", ru.Alert)
		if ru.For != nil {
			_, err := model.ParseDuration(string(*ru.For))
			assert.NoError(t, err, ru.Alert)
		}
		assert.Contains(t, []string{"info", "warning", "critical"}, ru.Labels["severity"], ru.Alert)
		assert.NotEmpty(t, ru.Annotations["summary"], ru.Alert)
		if ru.Alert == "CodexRelayUpstreamErrors" {
			assert.Contains(t, expr, "> 0.35", "the threshold is the value's")
		}
		if ru.Alert == "CodexRelayKeyLimitNear" {
			assert.Contains(t, expr, ">= 0.8", "the default warning share")
		}
	}
	assert.Equal(t, alerts, names)
	assert.NotContains(t, mustRender(t, nil).kinds(), "PrometheusRule", "off by default")
}

// dashboardExprs are the PromQL expressions of the dashboard's panels,
// with Grafana's variables given values Prometheus would see.
func dashboardExprs(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	require.Equal(t, "codex-relay", d.UID)
	out := map[string]string{}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$namespace", "codex")
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for i, tg := range p.Targets {
			out[p.Title+"#"+string(rune('A'+i))] = vars.Replace(tg.Expr)
		}
	}
	return out
}

// The Grafana dashboard parses, every panel's query is PromQL Prometheus
// accepts, and the chart ships it unchanged in a ConfigMap Grafana's
// sidecar loads by its label.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	exprs := dashboardExprs(t, raw)
	require.GreaterOrEqual(t, len(exprs), 10)
	for title, e := range exprs {
		_, err := parser.NewParser(parser.Options{}).ParseExpr(e)
		assert.NoError(t, err, "%s: %s", title, e)
		assert.Contains(t, e, `namespace="codex"`, "%s is scoped to the chosen namespace", title)
	}
	r := mustRender(t, map[string]any{"metrics": map[string]any{"grafanaDashboard": map[string]any{"enabled": true}}})
	cm := r.get(t, "ConfigMap", "relay-codex-relay-dashboard").(*corev1.ConfigMap)
	assert.Equal(t, "1", cm.Labels["grafana_dashboard"])
	assert.JSONEq(t, string(raw), cm.Data["codex-relay.json"], "shipped as written")
	assert.NotContains(t, mustRender(t, nil).kinds(), "ConfigMap", "off by default")
}
