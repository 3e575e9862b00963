package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// series returns the label sets of a metric family, one map per series.
func series(t *testing.T, g prometheus.Gatherer, name string) []map[string]string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var out []map[string]string
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, labels)
		}
	}
	return out
}

// counterValue is the value of the series of a counter family with exactly
// these labels, 0 when there is none.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsEqual(m.GetLabel(), labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if want[l.GetName()] != l.GetValue() {
			return false
		}
	}
	return true
}

// Whatever method, path and status a request brings, the HTTP metrics'
// labels stay within known sets, so a client cannot add series at will.
func TestHTTPMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	reg := prometheus.NewRegistry()
	// The client handler answers the status a request asks for: a stand-in
	// for any status a wrapped handler may write.
	client := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.Header.Get("X-Test-Status"))
		w.WriteHeader(code)
	})
	srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Registry: reg, Gatherer: reg, Client: client})

	// round sends requests with made-up methods, paths and statuses, each
	// round different from the others.
	round := func(n int) {
		paths := []string{"/made-up/%d", "/api/v1/made-up/%d", "/admin/made-up/%d", "/v1/made-up/%d", "/backend-api/%d",
			"/api/v1/accounts/%d", "/healthz/%d", "/%d"}
		for i := range 50 {
			id := n*1000 + i
			method := []string{"M" + strconv.Itoa(id), "get", "PROPFIND", http.MethodGet, http.MethodPost}[i%5]
			req := httptest.NewRequest(method, fmt.Sprintf(paths[i%len(paths)], id), nil)
			req.Header.Set("X-Test-Status", strconv.Itoa([]int{200, 299, 777, 404, 103}[i%5]))
			srv.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	round(1)
	first := series(t, reg, "codex_relay_http_requests_total")
	firstDurations := series(t, reg, "codex_relay_http_request_duration_seconds")
	require.NotEmpty(t, first)
	round(2)
	round(3)
	again := series(t, reg, "codex_relay_http_requests_total")
	assert.Len(t, again, len(first), "requests of the same shape with other made-up values add no series")
	assert.Len(t, series(t, reg, "codex_relay_http_request_duration_seconds"), len(firstDurations))

	routes := map[string]bool{"unmatched": true}
	for _, r := range srv.echo.Routes() {
		routes[r.Path] = true
	}
	methods := map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true, "other": true}
	for _, l := range again {
		assert.True(t, routes[l["route"]], "route %q is a registered pattern", l["route"])
		assert.True(t, methods[l["method"]], "method %q is a known one", l["method"])
		code, err := strconv.Atoi(l["code"])
		assert.True(t, l["code"] == "other" || (err == nil && (http.StatusText(code) != "" || code == 499)), "code %q is a real status", l["code"])
	}
	for _, l := range series(t, reg, "codex_relay_http_request_duration_seconds") {
		assert.True(t, routes[l["route"]], "route %q is a registered pattern", l["route"])
		assert.True(t, methods[l["method"]], "method %q is a known one", l["method"])
	}
	assert.Positive(t, counterValue(t, reg, "codex_relay_http_requests_total", map[string]string{"route": "/v1/*", "method": "other", "code": "other"}),
		"a made-up method and an unknown status are counted, as other")
}

// A client that hangs up before it is answered is a cancellation, not a
// server fault: counted as 499, logged at debug level, never as an error.
func TestRequestsCancelledByTheClient(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		route string
		path  string
		// block is the server side: it blocks until the client is gone.
		block func(ctx context.Context) error
	}{
		{"wrapped client handler writes nothing", "/v1/*", "/v1/responses", nil},
		{"handler error wraps context.Canceled", "/api/v1/accounts/:id/probe", "/api/v1/accounts/acc_1/probe",
			func(ctx context.Context) error { <-ctx.Done(); return fmt.Errorf("probe: %w", ctx.Err()) }},
		{"handler error after the client left", "/api/v1/accounts/:id/probe", "/api/v1/accounts/acc_1/probe",
			func(ctx context.Context) error { <-ctx.Done(); return errors.New("upstream: connection reset") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
			reg := prometheus.NewRegistry()
			var logs logbuf.Buffer
			entered := make(chan struct{})
			client := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				<-r.Context().Done()
			})
			srv := New(Config{Store: s, AdminTokenHash: HashAdminToken(testAdminToken), Registry: reg, Gatherer: reg, Client: client,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				Probe: func(ctx context.Context, _ string) (store.Account, error) {
					close(entered)
					return store.Account{}, tc.block(ctx)
				}})
			served := make(chan struct{})
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(served)
				srv.ServeHTTP(w, r)
			}))
			defer ts.Close()

			ctx, cancel := context.WithCancel(context.Background())
			// No body: net/http notices a hang-up only once the body is read.
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+tc.path, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			failed := make(chan error, 1)
			go func() {
				resp, err := ts.Client().Do(req)
				if err == nil {
					resp.Body.Close()
				}
				failed <- err
			}()
			<-entered
			cancel()
			require.ErrorIs(t, <-failed, context.Canceled)
			<-served

			assert.Equal(t, 1.0, counterValue(t, reg, "codex_relay_http_requests_total", map[string]string{"route": tc.route, "method": "POST", "code": "499"}),
				"the request is counted as cancelled by the client")
			for _, code := range []string{"200", "500"} {
				assert.Zero(t, counterValue(t, reg, "codex_relay_http_requests_total", map[string]string{"route": tc.route, "method": "POST", "code": code}))
			}
			assert.NotContains(t, logs.String(), "level=ERROR", "a client hanging up is no error of the server")
		})
	}
}
