package alert

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// Options tune a replica's alert loops; the zero value is the defaults.
type Options struct {
	// Interval is how often the conditions are evaluated (default 15s);
	// Poll how often due deliveries are looked for (default 2s).
	Interval, Poll time.Duration
	// Quiet is the quiet period of a condition (default DefaultQuiet).
	Quiet time.Duration
	// ErrorShare and ErrorMinAttempts set when upstream.errors stands
	// (defaults DefaultErrorShare, DefaultErrorMinAttempts).
	ErrorShare       float64
	ErrorMinAttempts int
	// Schedule is the wait before each retry (default DefaultSchedule);
	// Timeout bounds one try (default 10s).
	Schedule []time.Duration
	Timeout  time.Duration
	// Self are the addresses the relay listens on (host:port): no
	// delivery goes to their /api or /admin routes.
	Self []string
	// Transport, when set, sends the deliveries (tests); else they go
	// through the relay's default egress.
	Transport http.RoundTripper
}

// Config is what Start needs from the relay.
type Config struct {
	Store   *store.Store
	Replica string
	// Proxy is the relay's default egress (the accounts' without a proxy).
	Proxy  func(*http.Request) (*url.URL, error)
	Budget func(context.Context, store.ClientKey) ([]store.LimitUse, error)
	Now    func() time.Time
	Logger *slog.Logger
}

// Loops are a replica's Watcher and Deliverer, run together.
type Loops struct {
	Watcher   *Watcher
	Deliverer *Deliverer
}

// New makes a replica's alert loops.
func New(cfg Config, o Options) *Loops {
	d := NewDeliverer(DelivererConfig{Store: cfg.Store, Replica: cfg.Replica, Proxy: cfg.Proxy, Transport: o.Transport, Self: o.Self,
		Schedule: o.Schedule, Poll: o.Poll, Timeout: o.Timeout, Now: cfg.Now, Logger: cfg.Logger})
	w := NewWatcher(WatcherConfig{Store: cfg.Store, Interval: o.Interval, Quiet: o.Quiet, Now: cfg.Now, Budget: cfg.Budget,
		ErrorShare: o.ErrorShare, ErrorMinAttempts: o.ErrorMinAttempts,
		Recorded: d.Kick, Logger: cfg.Logger})
	return &Loops{Watcher: w, Deliverer: d}
}

// Run runs both loops until ctx ends, and returns once both have.
func (l *Loops) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { l.Watcher.Run(ctx) })
	wg.Go(func() { l.Deliverer.Run(ctx) })
	wg.Wait()
}
