package deploy

import (
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

const (
	chartDir  = "helm/codex-relay"
	release   = "relay"
	namespace = "codex"
)

// decoder decodes manifests strictly into the Kubernetes API types, and the
// two custom resources the chart may render into their projects' own Go
// types: a field the type does not have (a typo, a wrong indentation) or
// one given twice is an error, as kubectl apply --validate=strict makes it.
func decoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, monitoringv1.AddToScheme(scheme))
	require.NoError(t, gatewayv1.Install(scheme))
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// rendered is what a chart renders: its objects by kind and name, and the
// notes.
type rendered struct {
	objects map[string]runtime.Object // "Kind/name"
	notes   string
}

func (r rendered) get(t *testing.T, kind, name string) runtime.Object {
	t.Helper()
	o, ok := r.objects[kind+"/"+name]
	require.True(t, ok, "%s/%s rendered; have %v", kind, name, slices.Sorted(maps.Keys(r.objects)))
	return o
}

func (r rendered) kinds() map[string]int {
	n := map[string]int{}
	for k := range r.objects {
		n[strings.Split(k, "/")[0]]++
	}
	return n
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	require.NoError(t, err)
	return c
}

// render renders the chart with values over its defaults, as helm template
// does for an install.
func render(t *testing.T, values map[string]any) (rendered, error) {
	t.Helper()
	c := loadChart(t)
	vals, err := chartutil.ToRenderValues(c, values, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.Render(c, vals)
	if err != nil {
		return rendered{}, err
	}
	dec := decoder(t)
	r := rendered{objects: map[string]runtime.Object{}}
	for name, content := range files {
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			r.notes = content
			continue
		case path.Ext(name) != ".yaml":
			continue
		}
		for _, doc := range releaseutil.SplitManifests(content) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, gvk, err := dec.Decode([]byte(doc), nil, nil)
			require.NoError(t, err, "%s does not decode strictly into its API type:\n%s", name, doc)
			acc, ok := obj.(interface {
				GetName() string
				GetNamespace() string
				GetLabels() map[string]string
			})
			require.True(t, ok, "%s: an object with metadata", name)
			key := gvk.Kind + "/" + acc.GetName()
			require.NotContains(t, r.objects, key, "rendered twice")
			for _, msg := range validation.IsDNS1123Subdomain(acc.GetName()) {
				t.Errorf("%s: name %q: %s", key, acc.GetName(), msg)
			}
			if errs := metav1validation.ValidateLabels(acc.GetLabels(), field.NewPath(key, "metadata", "labels")); len(errs) > 0 {
				t.Errorf("%s: %v", key, errs.ToAggregate())
			}
			r.objects[key] = obj
		}
	}
	return r, nil
}

var commentLine = regexp.MustCompile(`(?m)^\s*#.*$`)

func stripComments(s string) string { return commentLine.ReplaceAllString(s, "") }

func mustRender(t *testing.T, values map[string]any) rendered {
	t.Helper()
	r, err := render(t, values)
	require.NoError(t, err)
	return r
}

// lintChart runs helm lint with values and fails on any warning or error.
func lintChart(t *testing.T, values map[string]any) {
	t.Helper()
	linter := lint.All(chartDir, values, namespace, false)
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		} else {
			t.Logf("helm lint: %s", m)
		}
	}
}

// allOptions turns every option on: secrets from Secrets of the operator's,
// the ServiceMonitor, the Ingress and the HTTPRoute, and more.
func allOptions() map[string]any {
	return map[string]any{
		"replicaCount":     3,
		"image":            map[string]any{"digest": "sha256:" + strings.Repeat("a", 64)},
		"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
		"secretKey":        map[string]any{"existingSecret": "relay-key", "existingSecretKey": "key"},
		"adminToken":       map[string]any{"existingSecret": "relay-admin", "existingSecretKey": "token"},
		"database":         map[string]any{"existingSecret": "pg-app", "existingSecretKey": "uri"},
		"config": map[string]any{"timezone": "Europe/Berlin", "retention": "2160h", "fallbackModel": "gpt-5.1-codex-mini", "laneMaxAge": "50m", "envProxy": "ignore", "tokenURL": "https://auth.example/oauth/token",
			"streamIdleTimeout": "10m", "wsCompression": "off", "upstreamWsCompression": "takeover", "wsCompressionThreshold": 1024},
		"extraEnv":                      []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}},
		"terminationGracePeriodSeconds": 120,
		"drain":                         map[string]any{"preStopSeconds": 15, "timeoutSeconds": 90},
		"podDisruptionBudget":           map[string]any{"minAvailable": 2},
		"serviceAccount":                map[string]any{"annotations": map[string]any{"example.com/role": "relay"}},
		"podAnnotations":                map[string]any{"example.com/team": "ai"},
		"nodeSelector":                  map[string]any{"kubernetes.io/os": "linux"},
		"tolerations":                   []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "relay", "effect": "NoSchedule"}},
		"metrics":                       map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}},
		"ingress":                       map[string]any{"enabled": true, "tls": []any{map[string]any{"secretName": "relay-tls", "hosts": []any{"codex-relay.example.com"}}}},
		"httpRoute":                     map[string]any{"enabled": true, "parentRefs": []any{map[string]any{"name": "public", "namespace": "gateways", "sectionName": "https"}}},
	}
}

func TestHelmLint(t *testing.T) {
	t.Parallel()
	lintChart(t, nil)
	lintChart(t, allOptions())
	lintChart(t, map[string]any{"secretKey": map[string]any{"value": "0123456789abcdef0123"}, "adminToken": map[string]any{"value": "cra_token"}, "database": map[string]any{"url": "postgres://u:p@db:5432/relay"}})
}

// deployment returns the rendered Deployment and its relay container.
func deployment(t *testing.T, r rendered) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d := r.get(t, "Deployment", "relay-codex-relay").(*appsv1.Deployment)
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	return d, d.Spec.Template.Spec.Containers[0]
}

func envVar(c corev1.Container, name string) (corev1.EnvVar, int) {
	for i, e := range c.Env {
		if e.Name == name {
			return e, i
		}
	}
	return corev1.EnvVar{}, -1
}

// secretFiles maps each file of the projected secrets volume to the Secret
// name and key it comes from.
func secretFiles(t *testing.T, d *appsv1.Deployment, c corev1.Container) map[string][2]string {
	t.Helper()
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == "secrets" {
			mount = m.MountPath
			assert.True(t, m.ReadOnly)
		}
	}
	require.NotEmpty(t, mount, "the secrets volume is mounted")
	files := map[string][2]string{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name != "secrets" {
			continue
		}
		require.NotNil(t, v.Projected)
		for _, s := range v.Projected.Sources {
			require.NotNil(t, s.Secret)
			for _, it := range s.Secret.Items {
				files[path.Join(mount, it.Path)] = [2]string{s.Secret.Name, it.Key}
			}
		}
	}
	return files
}

// checkPodSpec checks what every rendering must hold: probes on the relay's
// endpoints, a drain hook shorter than the grace, a non-root read-only
// container with resources, the advertised URL from the pod's IP, secrets as
// files from the Secrets named, and Services, PDB and spread selecting the
// pods.
func checkPodSpec(t *testing.T, r rendered, preStop, drain int64, secrets map[string][2]string) {
	d, c := deployment(t, r)
	pod := d.Spec.Template.Spec
	podLabels := d.Spec.Template.Labels
	require.NotNil(t, d.Spec.Selector)
	assert.Subset(t, podLabels, d.Spec.Selector.MatchLabels, "the Deployment selects its pods")

	var port int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			port = p.ContainerPort
		}
	}
	assert.Equal(t, int32(2455), port)
	for name, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		require.NotNil(t, probe, "%s probe", name)
		require.NotNil(t, probe.HTTPGet, "%s probe over HTTP", name)
		assert.Equal(t, "http", probe.HTTPGet.Port.String(), name)
		want := map[string]string{"startup": "/healthz", "readiness": "/readyz", "liveness": "/healthz"}[name]
		assert.Equal(t, want, probe.HTTPGet.Path, name)
	}
	assert.Greater(t, c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold, int32(60), "a start with migrations is not killed")

	require.NotNil(t, c.Lifecycle)
	require.NotNil(t, c.Lifecycle.PreStop)
	require.NotNil(t, c.Lifecycle.PreStop.Sleep, "the image has no shell: the kubelet sleeps")
	assert.Equal(t, preStop, c.Lifecycle.PreStop.Sleep.Seconds)
	require.Equal(t, "serve", c.Args[0])
	var shutdown int64
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "-shutdown-timeout="); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(v, "s"), 10, 64)
			require.NoError(t, err)
			shutdown = n
		}
	}
	assert.Equal(t, drain, shutdown, "serve -shutdown-timeout")
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	assert.Greater(t, *pod.TerminationGracePeriodSeconds, preStop+shutdown, "the grace outlasts the preStop sleep and the drain")

	require.NotNil(t, pod.SecurityContext)
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.NotNil(t, pod.SecurityContext.RunAsUser)
	assert.NotZero(t, *pod.SecurityContext.RunAsUser)
	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.NotNil(t, sc.ReadOnlyRootFilesystem)
	assert.True(t, *sc.ReadOnlyRootFilesystem)
	require.NotNil(t, sc.AllowPrivilegeEscalation)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	require.NotNil(t, sc.Capabilities)
	assert.Contains(t, sc.Capabilities.Drop, corev1.Capability("ALL"))
	var tmp bool
	for _, m := range c.VolumeMounts {
		tmp = tmp || m.MountPath == "/tmp"
	}
	assert.True(t, tmp, "a writable /tmp on a read-only root")
	assert.False(t, c.Resources.Requests.Cpu().IsZero(), "CPU requested")
	assert.False(t, c.Resources.Requests.Memory().IsZero(), "memory requested")
	assert.False(t, c.Resources.Limits.Memory().IsZero(), "memory limited")
	require.NotNil(t, pod.EnableServiceLinks)
	assert.False(t, *pod.EnableServiceLinks, "no CODEX_RELAY_* variables injected for a Service named codex-relay")
	require.NotNil(t, pod.AutomountServiceAccountToken)
	assert.False(t, *pod.AutomountServiceAccountToken)

	podIP, ipAt := envVar(c, "POD_IP")
	require.NotNil(t, podIP.ValueFrom, "POD_IP from the downward API")
	require.NotNil(t, podIP.ValueFrom.FieldRef)
	assert.Equal(t, "status.podIP", podIP.ValueFrom.FieldRef.FieldPath)
	adv, advAt := envVar(c, "CODEX_RELAY_ADVERTISE_URL")
	assert.Equal(t, "http://$(POD_IP):2455", adv.Value)
	assert.Less(t, ipAt, advAt, "$(POD_IP) is only expanded from a variable defined before")
	addr, _ := envVar(c, "CODEX_RELAY_ADDR")
	assert.Equal(t, "0.0.0.0:2455", addr.Value)

	files := secretFiles(t, d, c)
	for variable, want := range secrets {
		e, at := envVar(c, variable)
		require.GreaterOrEqual(t, at, 0, "%s is set", variable)
		assert.Equal(t, want, files[e.Value], "%s names a file of Secret %s, key %s", variable, want[0], want[1])
		_, direct := envVar(c, strings.TrimSuffix(variable, "_FILE"))
		assert.Negative(t, direct, "%s never in the clear", strings.TrimSuffix(variable, "_FILE"))
	}
	if _, ok := secrets["CODEX_RELAY_ADMIN_TOKEN_FILE"]; !ok {
		_, at := envVar(c, "CODEX_RELAY_ADMIN_TOKEN_FILE")
		assert.Negative(t, at, "no admin token configured: the relay generates one")
	}

	svc := r.get(t, "Service", "relay-codex-relay").(*corev1.Service)
	assert.NotEqual(t, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	assert.Subset(t, podLabels, svc.Spec.Selector)
	assert.NotEmpty(t, svc.Spec.Selector)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, "http", svc.Spec.Ports[0].TargetPort.String())
	assert.Empty(t, svc.Spec.SessionAffinity, "round-robin")
	headless := r.get(t, "Service", "relay-codex-relay-replicas").(*corev1.Service)
	assert.Equal(t, corev1.ClusterIPNone, headless.Spec.ClusterIP, "headless")
	assert.Subset(t, podLabels, headless.Spec.Selector)
	assert.NotEmpty(t, headless.Spec.Selector)
	assert.True(t, headless.Spec.PublishNotReadyAddresses, "draining replicas stay listed")

	pdb := r.get(t, "PodDisruptionBudget", "relay-codex-relay").(*policyv1.PodDisruptionBudget)
	require.NotNil(t, pdb.Spec.Selector)
	assert.Subset(t, podLabels, pdb.Spec.Selector.MatchLabels)
	assert.NotEmpty(t, pdb.Spec.Selector.MatchLabels)
	require.NotEmpty(t, pod.TopologySpreadConstraints)
	for _, c := range pod.TopologySpreadConstraints {
		if c.LabelSelector != nil {
			assert.Subset(t, podLabels, c.LabelSelector.MatchLabels)
		}
	}

	sa := r.get(t, "ServiceAccount", pod.ServiceAccountName).(*corev1.ServiceAccount)
	require.NotNil(t, sa.AutomountServiceAccountToken)
	assert.False(t, *sa.AutomountServiceAccountToken)
}

// With its defaults the chart renders two replicas with every safety on and
// the optional objects off; the secret key and database, which it cannot
// invent, are expected in the chart's Secret, and the notes say so.
func TestHelmDefaults(t *testing.T) {
	t.Parallel()
	r := mustRender(t, nil)
	d, c := deployment(t, r)
	require.NotNil(t, d.Spec.Replicas)
	assert.Equal(t, int32(2), *d.Spec.Replicas)
	assert.Equal(t, "ghcr.io/codexrelay/codex-relay:devel", c.Image)
	checkPodSpec(t, r, 10, 60, map[string][2]string{
		"CODEX_RELAY_SECRET_KEY_FILE":   {"relay-codex-relay", "secret-key"},
		"CODEX_RELAY_DATABASE_URL_FILE": {"relay-codex-relay", "database-url"},
	})
	pdb := r.get(t, "PodDisruptionBudget", "relay-codex-relay").(*policyv1.PodDisruptionBudget)
	require.NotNil(t, pdb.Spec.MaxUnavailable)
	assert.Equal(t, 1, pdb.Spec.MaxUnavailable.IntValue())
	assert.Equal(t, map[string]int{"Deployment": 1, "Service": 2, "PodDisruptionBudget": 1, "ServiceAccount": 1}, r.kinds(),
		"no Secret without values, no ServiceMonitor, Ingress or HTTPRoute unless enabled")
	assert.Contains(t, r.notes, "WARNING: no secret key")
	assert.Contains(t, r.notes, "WARNING: no database")
	assert.Contains(t, r.notes, `grep "Admin token"`)
}

// Secrets given as values land in the chart's Secret, which the pods read
// and roll on.
func TestHelmSecretValues(t *testing.T) {
	t.Parallel()
	vals := map[string]any{
		"secretKey":  map[string]any{"value": "0123456789abcdef0123"},
		"adminToken": map[string]any{"value": "cra_token"},
		"database":   map[string]any{"url": "postgres://u:p@db:5432/relay"},
	}
	r := mustRender(t, vals)
	s := r.get(t, "Secret", "relay-codex-relay").(*corev1.Secret)
	assert.Equal(t, map[string][]byte{"secret-key": []byte("0123456789abcdef0123"), "admin-token": []byte("cra_token"), "database-url": []byte("postgres://u:p@db:5432/relay")}, s.Data)
	checkPodSpec(t, r, 10, 60, map[string][2]string{
		"CODEX_RELAY_SECRET_KEY_FILE":   {"relay-codex-relay", "secret-key"},
		"CODEX_RELAY_DATABASE_URL_FILE": {"relay-codex-relay", "database-url"},
		"CODEX_RELAY_ADMIN_TOKEN_FILE":  {"relay-codex-relay", "admin-token"},
	})
	d, _ := deployment(t, r)
	sum := d.Spec.Template.Annotations["checksum/secret"]
	assert.Len(t, sum, 64, "the pods roll when the Secret changes")
	assert.NotContains(t, r.notes, "WARNING")

	vals["database"] = map[string]any{"url": "postgres://u:other@db:5432/relay"}
	d2, _ := deployment(t, mustRender(t, vals))
	assert.NotEqual(t, sum, d2.Spec.Template.Annotations["checksum/secret"])
}

// With every option on, each optional object renders and is valid, and the
// secrets come from the operator's own Secrets.
func TestHelmAllOptions(t *testing.T) {
	t.Parallel()
	r := mustRender(t, allOptions())
	d, c := deployment(t, r)
	assert.Equal(t, int32(3), *d.Spec.Replicas)
	assert.Equal(t, "ghcr.io/codexrelay/codex-relay@sha256:"+strings.Repeat("a", 64), c.Image)
	checkPodSpec(t, r, 15, 90, map[string][2]string{
		"CODEX_RELAY_SECRET_KEY_FILE":   {"relay-key", "key"},
		"CODEX_RELAY_DATABASE_URL_FILE": {"pg-app", "uri"},
		"CODEX_RELAY_ADMIN_TOKEN_FILE":  {"relay-admin", "token"},
	})
	assert.Equal(t, int64(120), *d.Spec.Template.Spec.TerminationGracePeriodSeconds)
	assert.NotContains(t, r.objects, "Secret/relay-codex-relay", "existing Secrets only")
	for variable, want := range map[string]string{
		"CODEX_RELAY_TIMEZONE": "Europe/Berlin", "CODEX_RELAY_RETENTION": "2160h", "CODEX_RELAY_FALLBACK_MODEL": "gpt-5.1-codex-mini",
		"CODEX_RELAY_LANE_MAX_AGE": "50m", "CODEX_RELAY_ENV_PROXY": "ignore", "CODEX_RELAY_TOKEN_URL": "https://auth.example/oauth/token",
		"CODEX_RELAY_LOG_FORMAT": "json", "CODEX_RELAY_LOG_LEVEL": "info", "HTTPS_PROXY": "http://proxy:3128",
		"CODEX_RELAY_STREAM_IDLE_TIMEOUT": "10m", "CODEX_RELAY_WS_COMPRESSION": "off", "CODEX_RELAY_UPSTREAM_WS_COMPRESSION": "takeover",
		"CODEX_RELAY_WS_COMPRESSION_THRESHOLD": "1024",
	} {
		e, _ := envVar(c, variable)
		assert.Equal(t, want, e.Value, variable)
	}
	pdb := r.get(t, "PodDisruptionBudget", "relay-codex-relay").(*policyv1.PodDisruptionBudget)
	require.NotNil(t, pdb.Spec.MinAvailable)
	assert.Equal(t, 2, pdb.Spec.MinAvailable.IntValue())
	assert.Nil(t, pdb.Spec.MaxUnavailable)

	// The ServiceMonitor scrapes /metrics through the main Service only.
	sm := r.get(t, "ServiceMonitor", "relay-codex-relay").(*monitoringv1.ServiceMonitor)
	assert.Equal(t, "prometheus", sm.Labels["release"])
	svc := r.get(t, "Service", "relay-codex-relay").(*corev1.Service)
	headless := r.get(t, "Service", "relay-codex-relay-replicas").(*corev1.Service)
	assert.Subset(t, svc.Labels, sm.Spec.Selector.MatchLabels, "selects the main Service")
	var both bool
	for k, v := range sm.Spec.Selector.MatchLabels {
		both = both || headless.Labels[k] != v
	}
	assert.True(t, both, "not the headless one too (each pod would be scraped twice)")
	assert.Equal(t, []string{namespace}, sm.Spec.NamespaceSelector.MatchNames)
	require.Len(t, sm.Spec.Endpoints, 1)
	assert.Equal(t, "http", sm.Spec.Endpoints[0].Port)
	assert.Equal(t, "/metrics", sm.Spec.Endpoints[0].Path)

	// The Ingress keeps ingress-nginx from cutting or buffering streams.
	ing := r.get(t, "Ingress", "relay-codex-relay").(*networkingv1.Ingress)
	for _, a := range []string{"nginx.ingress.kubernetes.io/proxy-read-timeout", "nginx.ingress.kubernetes.io/proxy-send-timeout"} {
		n, err := strconv.Atoi(ing.Annotations[a])
		require.NoError(t, err, a)
		assert.GreaterOrEqual(t, n, 3600, a)
	}
	assert.Equal(t, "off", ing.Annotations["nginx.ingress.kubernetes.io/proxy-buffering"])
	assert.Equal(t, "64m", ing.Annotations["nginx.ingress.kubernetes.io/proxy-body-size"])
	require.Len(t, ing.Spec.Rules, 1)
	be := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
	assert.Equal(t, svc.Name, be.Name)
	assert.Equal(t, "http", be.Port.Name)
	require.Len(t, ing.Spec.TLS, 1)
	assert.Contains(t, r.notes, "https://codex-relay.example.com/backend-api/codex")

	// The HTTPRoute sends everything to the main Service, with long timeouts.
	hr := r.get(t, "HTTPRoute", "relay-codex-relay").(*gatewayv1.HTTPRoute)
	require.Len(t, hr.Spec.ParentRefs, 1)
	assert.Equal(t, gatewayv1.ObjectName("public"), hr.Spec.ParentRefs[0].Name)
	require.Len(t, hr.Spec.Rules, 1)
	require.Len(t, hr.Spec.Rules[0].BackendRefs, 1)
	ref := hr.Spec.Rules[0].BackendRefs[0]
	assert.Equal(t, gatewayv1.ObjectName(svc.Name), ref.Name)
	require.NotNil(t, ref.Port)
	assert.Equal(t, svc.Spec.Ports[0].Port, int32(*ref.Port))
	require.NotNil(t, hr.Spec.Rules[0].Timeouts)
	require.NotNil(t, hr.Spec.Rules[0].Timeouts.Request)
	assert.Equal(t, gatewayv1.Duration("1h"), *hr.Spec.Rules[0].Timeouts.Request)
}

// What the chart refuses to render: a grace the drain does not fit in, and a
// secret key the relay would refuse.
func TestHelmRefuses(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		values map[string]any
		want   string
	}{
		"a grace shorter than the drain": {map[string]any{"terminationGracePeriodSeconds": 70}, "must be longer than drain.preStopSeconds + drain.timeoutSeconds (70)"},
		"a short secret key":             {map[string]any{"secretKey": map[string]any{"value": "short"}}, "at least 16 characters"},
	} {
		_, err := render(t, tc.values)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
	}
}

// The strict decoder is what catches a wrong manifest: an unknown field.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	dec := decoder(t)
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {endpoints: [{port: http, pth: /metrics}]}\n",
		"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rules: [{timeout: {request: 1h}}]}\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 1, replicas: 2}\n",
	} {
		_, _, err := dec.Decode([]byte(doc), nil, nil)
		assert.Error(t, err, doc)
	}
	_, _, err := dec.Decode([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selector: {a: b}}\n"), nil, nil)
	assert.NoError(t, err)
}
