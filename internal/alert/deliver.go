package alert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// DelivererConfig configures a Deliverer. Store and Replica are required.
type DelivererConfig struct {
	Store *store.Store
	// Replica names this process in delivery claims; two Deliverers on one
	// database must have different names.
	Replica string
	// Proxy is the egress of deliveries, the relay's default egress
	// (http.ProxyFromEnvironment's rules); nil sends them direct.
	Proxy func(*http.Request) (*url.URL, error)
	// Transport, when set, sends the deliveries instead (tests); Proxy is
	// then unused.
	Transport http.RoundTripper
	// Self are the addresses (host:port) the relay listens on: a delivery
	// to its own /api or /admin routes is refused (see RefuseSelf).
	Self []string
	// Schedule is the wait before each retry; default DefaultSchedule.
	// Tests shorten it.
	Schedule []time.Duration
	// Poll is how often due deliveries are looked for when not kicked;
	// default 2s.
	Poll time.Duration
	// Timeout bounds one try, from connecting to the answer's end; default
	// 10s.
	Timeout time.Duration
	Now     func() time.Time
	Logger  *slog.Logger
}

// Deliverer sends the due deliveries it claims in the store, one try per
// claim, and records each try: delivered on a 2xx answer, else due again
// after the schedule's next wait with the same event (id and body), until
// out of tries. With several replicas each try is made by one (see
// store.ClaimDeliveries).
type Deliverer struct {
	cfg    DelivererConfig // static after NewDeliverer
	client *http.Client    // static after NewDeliverer
	kick   chan struct{}   // a pending wake-up, buffered 1
}

// NewDeliverer returns a Deliverer; it panics without a store or a
// replica name.
func NewDeliverer(cfg DelivererConfig) *Deliverer {
	if cfg.Store == nil || cfg.Replica == "" {
		panic("alert: DelivererConfig.Store and Replica are required")
	}
	if cfg.Schedule == nil {
		cfg.Schedule = DefaultSchedule
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rt := cfg.Transport
	if rt == nil {
		rt = &http.Transport{Proxy: cfg.Proxy, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute,
			TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: cfg.Timeout}
	}
	// A redirect is not followed: it could lead anywhere, the relay's own
	// admin routes included. A 3xx answer is a failed try.
	client := &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Deliverer{cfg: cfg, client: client, kick: make(chan struct{}, 1)}
}

// Kick has Run look for due deliveries now rather than at its next poll.
func (d *Deliverer) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run sends due deliveries until ctx ends, waiting for the tries under way.
func (d *Deliverer) Run(ctx context.Context) {
	defer d.client.CloseIdleConnections()
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		d.sendDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.kick:
		}
	}
}

// claimBatch bounds the deliveries claimed at once.
const claimBatch = 16

// sendDue claims the due deliveries and tries each, at once, until none
// is due.
func (d *Deliverer) sendDue(ctx context.Context) {
	for ctx.Err() == nil {
		// The lease outlasts a try (its deadline) with room for recording
		// it: a claim is taken over only from a replica that died.
		claimed, err := d.cfg.Store.ClaimDeliveries(ctx, d.cfg.Replica, d.cfg.Timeout+30*time.Second, claimBatch)
		if err != nil {
			if ctx.Err() == nil {
				d.cfg.Logger.Warn("claim webhook deliveries", "err", err)
			}
			return
		}
		var wg sync.WaitGroup
		for _, c := range claimed {
			wg.Go(func() { d.try(ctx, c) })
		}
		wg.Wait()
		if len(claimed) < claimBatch {
			return
		}
	}
}

// try sends one claimed delivery and records how it went.
func (d *Deliverer) try(ctx context.Context, c store.ClaimedDelivery) {
	res := d.send(ctx, c)
	if !res.Delivered {
		if next, ok := NextTry(d.cfg.Schedule, c.Attempts+1, d.cfg.Now()); ok {
			res.Next = next
		}
	}
	log := d.cfg.Logger.With("webhook", c.WebhookID, "event", c.EventID, "type", c.EventType, "try", c.Attempts+1)
	if res.Delivered {
		log.Debug("webhook delivered", "status", res.StatusCode, "latency", res.Latency)
	} else {
		log.Warn("webhook delivery failed", "status", res.StatusCode, "err", res.Err, "gives_up", res.Next.IsZero())
	}
	// Recorded even as the relay stops: the try was made.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := d.cfg.Store.FinishDelivery(rctx, c.ID, d.cfg.Replica, res); err != nil {
		log.Warn("record webhook delivery", "err", err)
	}
}

// send makes one try: the event in the webhook's format, signed with its
// secret, within the try's deadline.
func (d *Deliverer) send(ctx context.Context, c store.ClaimedDelivery) store.DeliveryResult {
	u, err := url.Parse(c.Webhook.URL)
	if err == nil {
		err = RefuseSelf(u, d.cfg.Self)
	}
	if err != nil {
		return store.DeliveryResult{Err: err.Error()}
	}
	body, err := Body(c.Webhook.Format, c.Payload)
	if err != nil {
		return store.DeliveryResult{Err: err.Error()}
	}
	secret, err := d.cfg.Store.WebhookSecret(ctx, c.WebhookID)
	if err != nil {
		return store.DeliveryResult{Err: "the webhook's secret could not be read"}
	}
	tctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(tctx, http.MethodPost, c.Webhook.URL, bytes.NewReader(body))
	if err != nil {
		return store.DeliveryResult{Err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "codex-relay-webhook")
	req.Header.Set("X-Codex-Relay-Event", c.EventType)
	req.Header.Set("X-Codex-Relay-Event-Id", c.EventID)
	req.Header.Set("X-Codex-Relay-Delivery", c.ID)
	req.Header.Set("X-Codex-Relay-Attempt", strconv.Itoa(c.Attempts+1))
	req.Header.Set(SignatureHeader, Sign(secret, body))
	start := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		return store.DeliveryResult{Latency: time.Since(start), Err: tryError(err)}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	res := store.DeliveryResult{StatusCode: resp.StatusCode, Latency: time.Since(start)}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		res.Delivered = true
	} else {
		res.Err = "the receiver answered " + resp.Status
	}
	return res
}

// tryError says why a try got no answer, without the URL (which may carry
// a token in its query).
func tryError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within the deadline"
	}
	return err.Error()
}

// ValidateURL checks a webhook's URL as it is registered: http or https,
// a host, no user info (a secret in it would be shown back), and not the
// relay's own /api or /admin routes.
func ValidateURL(raw string, self []string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return nil, errors.New("url: an http:// or https:// URL with a host is required")
	}
	if u.User != nil {
		return nil, errors.New("url: must not carry a user or password (the secret signs every delivery)")
	}
	if u.Fragment != "" {
		return nil, errors.New("url: must not have a fragment")
	}
	if err := RefuseSelf(u, self); err != nil {
		return nil, err
	}
	return u, nil
}

// RefuseSelf refuses a URL that points at the relay's own admin routes
// (/api, /admin) on one of the addresses it listens on (host:port; a host
// of 0.0.0.0 or :: is every address of this machine's interfaces): a
// webhook must not be a way to make the relay call its own admin API.
// Hosts are compared as written: a name that resolves to the relay is not
// looked up (the deliveries' egress may resolve it elsewhere anyway).
func RefuseSelf(u *url.URL, self []string) error {
	path := strings.ToLower(u.EscapedPath())
	if !(hasRoute(path, "/api") || hasRoute(path, "/admin")) {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	host := strings.ToLower(u.Hostname())
	for _, s := range self {
		sh, sp, err := net.SplitHostPort(s)
		if err != nil || sp != port {
			continue
		}
		if strings.EqualFold(sh, host) || local(host) || (unspecified(sh) && interfaceAddr(host)) {
			return fmt.Errorf("url: must not point at the relay's own %s routes", strings.SplitN(path[1:], "/", 2)[0])
		}
	}
	return nil
}

func hasRoute(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

func local(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// interfaceAddr reports whether host is an IP address of one of this
// machine's interfaces.
func interfaceAddr(host string) bool {
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func unspecified(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || (ip != nil && ip.IsUnspecified())
}
