package relay

import "github.com/prometheus/client_golang/prometheus"

// metrics are the relay's Prometheus series. Routine events are counted
// here rather than logged.
type metrics struct {
	requests   *prometheus.CounterVec   // by transport, account, status class
	attempts   *prometheus.CounterVec   // by account, class, action
	firstEvent *prometheus.HistogramVec // time to first event, by transport
	duration   *prometheus.HistogramVec // request duration, by transport
	events     *prometheus.CounterVec   // events forwarded, by transport
	// eventsHTTP and eventsWS are events' children, resolved once: the
	// per-event path must not look labels up.
	eventsHTTP, eventsWS prometheus.Counter
	lanes                *prometheus.CounterVec // lane lifecycle, by what happened
	// Spend: by client key and priced model (bounded: keys are the
	// operator's, models outside the price table count as "other").
	tokens     *prometheus.CounterVec // by key, model, kind
	cost       *prometheus.CounterVec // by key, model
	keyRefused *prometheus.CounterVec // by key, limit
	// keyRejected counts wrong client keys, by answer (unauthorized, or
	// limited once their address had sent too many).
	keyRejected *prometheus.CounterVec
	budgetUse   *prometheus.GaugeVec // by key, limit: use / max at the key's latest admission
	logDropped  prometheus.Counter   // request log rows given up
	// bindingsDropped counts binding writes given up.
	bindingsDropped prometheus.Counter
	// objects counts requests on the object routes, by route and status
	// class; dropped counts the analytics requests the relay kept.
	objects *prometheus.CounterVec
	dropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_requests_total",
			Help: "Client requests on the Responses routes, by transport, serving account and outcome."}, []string{"transport", "account", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_attempts_total",
			Help: "Upstream attempts, by account, classification and next action."}, []string{"account", "class", "action"}),
		firstEvent: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "codex_relay_first_event_seconds",
			Help: "Time from a client request to the first event forwarded to it.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12)}, []string{"transport"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "codex_relay_request_seconds",
			Help: "Client request duration until its terminal event.", Buckets: prometheus.ExponentialBuckets(0.01, 3, 12)}, []string{"transport"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_events_forwarded_total",
			Help: "Server events forwarded to clients, by transport."}, []string{"transport"}),
		lanes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_lanes_total",
			Help: "Upstream WebSocket lane lifecycle: opened, reused, replaced, closed, rebuilt."}, []string{"event"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_tokens_total",
			Help: "Tokens the upstream reported, by client key, model (\"other\" when the price table does not list it) and kind: input (cached included), cached_input, output (reasoning included), reasoning."},
			[]string{"key", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_cost_usd_total",
			Help: "Cost of the usage the upstream reported, at the price table in force, by client key and model."}, []string{"key", "model"}),
		keyRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_key_limit_refusals_total",
			Help: "Requests refused 429 because their client key was at a limit, by key and limit (tokens/5h, concurrent, ...)."}, []string{"key", "limit"}),
		keyRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_client_key_rejections_total",
			Help: "Requests bearing an unknown, revoked or expired client key, by answer: unauthorized (401), or limited (429: their address had sent too many)."}, []string{"answer"}),
		budgetUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "codex_relay_key_budget_used_ratio",
			Help: "A client key's use of each limit (settled plus in flight, over max) at its latest request."}, []string{"key", "limit"}),
		logDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "codex_relay_request_log_dropped_total",
			Help: "Request log rows given up: the database refused them for what they hold, or did not take them before the queue filled or the relay stopped."}),
		bindingsDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "codex_relay_binding_writes_dropped_total",
			Help: "Binding writes given up: the database refused them for what they hold, or did not take them within 10 minutes, before the queue filled or before the relay stopped."}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "codex_relay_object_requests_total",
			Help: "Requests on the object routes (images, files, stored responses, embeddings, audio, memories), by route and status class (2xx, 4xx, 5xx)."},
			[]string{"route", "status"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "codex_relay_analytics_dropped_total",
			Help: "Codex analytics event requests the relay accepted and dropped (never forwarded upstream)."}),
	}
	m.eventsHTTP, m.eventsWS = m.events.WithLabelValues("http"), m.events.WithLabelValues("ws")
	reg.MustRegister(m.requests, m.attempts, m.firstEvent, m.duration, m.events, m.lanes, m.tokens, m.cost, m.keyRefused, m.keyRejected, m.budgetUse, m.logDropped, m.bindingsDropped, m.objects, m.dropped)
	return m
}
