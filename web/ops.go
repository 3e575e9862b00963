package web

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/codexrelay/codex-relay/internal/store"
)

// healthz answers while the process runs; it checks nothing else, so an
// orchestrator does not restart a relay whose database is briefly away.
func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 when the database is reachable, takes writes and is
// fully migrated.
func (s *Server) readyz(c echo.Context) error {
	if s.cfg.Relay.Draining() {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": "draining: the relay is stopping"})
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 3*time.Second)
	defer cancel()
	if err := s.cfg.Store.Ready(ctx); err != nil {
		// /readyz answers anyone: the reason names no database address,
		// user or path (the log has the whole error).
		s.cfg.Logger.Warn("not ready", "err", err)
		reason := "database not ready"
		var nr *store.NotReadyError
		if errors.As(err, &nr) {
			reason = nr.Reason
		}
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": reason})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) metricsHandler() echo.HandlerFunc {
	return echo.WrapHandler(promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{}))
}

// httpMetrics counts every request by route pattern, method and status.
// Every label is bounded to a known set whatever the client sends, so a
// client cannot grow the number of series: the route is a registered
// pattern or "unmatched" (never the raw path), the method a standard one
// or "other", the code a status net/http knows (or 499) or "other".
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	routes   map[string]bool // registered route patterns; static after setRoutes
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codex_relay_http_requests_total",
			Help: "HTTP requests served, by route pattern, method and status code (499: the client went away first).",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "codex_relay_http_request_duration_seconds",
			Help:    "Time to serve an HTTP request (streams: until the stream ends), by route pattern and method.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30, 120, 600},
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// setRoutes records the route patterns that may appear as labels. Echo
// reports a registered pattern as the path already; the set makes that a
// property of this code rather than of echo's router.
func (m *httpMetrics) setRoutes(routes []*echo.Route) {
	m.routes = make(map[string]bool, len(routes))
	for _, r := range routes {
		m.routes[r.Path] = true
	}
}

func (m *httpMetrics) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		route, method := m.routeLabel(c.Path()), methodLabel(c.Request().Method)
		m.requests.WithLabelValues(route, method, codeLabel(statusOf(c, err))).Inc()
		m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
		return err
	}
}

func (m *httpMetrics) routeLabel(path string) string {
	if !m.routes[path] {
		return "unmatched"
	}
	return path
}

// methodLabel is the method label: the methods the server routes, and
// "other" for whatever else a client makes up.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "other"
}

// codeLabel is the status label: a status net/http knows, 499, or "other"
// (a handler may write any number from 100 to 999).
func codeLabel(status int) string {
	if status == statusClientClosed || http.StatusText(status) != "" {
		return strconv.Itoa(status)
	}
	return "other"
}

// statusOf is the status a request is counted under: the answer its error
// maps to, else the status written. A request whose client went away before
// any status was written (a wrapped client handler returns no error, and
// net/http would record an implicit 200) counts as 499.
func statusOf(c echo.Context, err error) int {
	if err != nil {
		return answerTo(c, err).Status
	}
	if !c.Response().Committed && clientGone(c) {
		return statusClientClosed
	}
	return c.Response().Status
}
