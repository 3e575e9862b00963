package web

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/store"
)

// webhookRoutes declares the webhooks' routes of the admin API and the
// console (alerts, issue 35): admin-only, as every route of both is today.
func (s *Server) webhookRoutes(api, con *echo.Group) {
	// Webhooks are an admin's: their URLs may carry a receiver's token.
	s.handle(api, http.MethodGet, "/webhooks", admin, s.listWebhooks)
	s.handle(api, http.MethodPost, "/webhooks", admin, s.createWebhookAPI)
	s.handle(api, http.MethodDelete, "/webhooks/:id", admin, s.deleteWebhookAPI)
	s.handle(api, http.MethodPost, "/webhooks/:id/test", admin, s.testWebhookAPI)
	s.handle(api, http.MethodGet, "/webhooks/:id/deliveries", admin, s.listDeliveries)

	s.handle(con, http.MethodGet, "/webhooks", admin, s.webhooksPage)
	s.handle(con, http.MethodPost, "/webhooks", admin, s.consoleCreateWebhook)
	s.handle(con, http.MethodGet, "/webhooks/:id", admin, s.webhookPage)
	s.handle(con, http.MethodPost, "/webhooks/:id/remove", admin, s.consoleRemoveWebhook)
	s.handle(con, http.MethodPost, "/webhooks/:id/test", admin, s.consoleTestWebhook)
}

// WebhookForm is the body of POST /webhooks.
type WebhookForm struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`
	Format string   `json:"format"`
	Secret string   `json:"secret"`
}

// WebhookView is a webhook as the API shows it: never its secret.
type WebhookView struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	Format    string    `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	Disabled  bool      `json:"disabled"`
}

func viewWebhook(w store.Webhook) WebhookView {
	events := w.Events
	if events == nil {
		events = []string{}
	}
	return WebhookView{ID: w.ID, URL: w.URL, Events: events, Format: w.Format, CreatedAt: w.CreatedAt, Disabled: w.Disabled}
}

// DeliveryView is one delivery of an event to a webhook, as the API shows
// it.
type DeliveryView struct {
	ID             string     `json:"id"`
	EventID        string     `json:"event_id"`
	Type           string     `json:"type"`
	State          string     `json:"state"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	LastStatusCode int        `json:"last_status_code"`
	LastLatencyMS  int64      `json:"last_latency_ms"`
	LastError      string     `json:"last_error"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	CreatedAt      time.Time  `json:"created_at"`
	DeliveredAt    *time.Time `json:"delivered_at"`
}

func viewDelivery(d store.Delivery) DeliveryView {
	v := DeliveryView{ID: d.ID, EventID: d.EventID, Type: d.EventType, State: d.EventState, Status: d.Status, Attempts: d.Attempts,
		LastStatusCode: d.LastStatusCode, LastLatencyMS: d.LastLatency.Milliseconds(), LastError: d.LastError,
		CreatedAt: d.CreatedAt, DeliveredAt: optTime(d.DeliveredAt)}
	if d.Status == store.DeliveryPending {
		v.NextAttemptAt = optTime(d.NextAttemptAt)
	}
	return v
}

// checkWebhook reads a form into the webhook to store, checked: an http(s) URL
// that is not the relay's own admin routes, known events, a format, and a
// secret for the signed JSON format.
func (s *Server) checkWebhook(c echo.Context, f WebhookForm) (store.Webhook, error) {
	self := append([]string{reachedAt(c.Request())}, s.cfg.AlertSelf...)
	u, err := alert.ValidateURL(f.URL, self)
	if err != nil {
		return store.Webhook{}, badField("url", "%s", strings.TrimPrefix(err.Error(), "url: "))
	}
	if len(f.Events) == 0 {
		return store.Webhook{}, badField("events", "name at least one of %s", strings.Join(alert.Types, ", "))
	}
	var events []string
	for _, e := range f.Events {
		e = strings.TrimSpace(e)
		if !alert.KnownType(e) {
			return store.Webhook{}, badField("events", "unknown event %q: the events are %s", e, strings.Join(alert.Types, ", "))
		}
		if !slices.Contains(events, e) {
			events = append(events, e)
		}
	}
	format := strings.TrimSpace(f.Format)
	if format == "" {
		format = alert.FormatJSON
	}
	if format != alert.FormatJSON && format != alert.FormatSlack {
		return store.Webhook{}, badField("format", "must be json or slack")
	}
	if format == alert.FormatJSON && f.Secret == "" {
		return store.Webhook{}, badField("secret", "required for the json format: it signs every delivery (%s)", alert.SignatureHeader)
	}
	if len(f.Secret) > 512 {
		return store.Webhook{}, badField("secret", "at most 512 characters")
	}
	return store.Webhook{URL: u.String(), Events: events, Format: format}, nil
}

// reachedAt is the address a request reached the relay at, its port
// filled in from the scheme when the Host header names none.
func reachedAt(r *http.Request) string {
	if _, _, err := net.SplitHostPort(r.Host); err == nil {
		return r.Host
	}
	port := "80"
	if r.TLS != nil {
		port = "443"
	}
	return net.JoinHostPort(strings.Trim(r.Host, "[]"), port)
}

// addWebhook checks and stores a new webhook, and audits it.
func (s *Server) addWebhook(c echo.Context, f WebhookForm) (store.Webhook, error) {
	w, err := s.checkWebhook(c, f)
	if err != nil {
		return store.Webhook{}, err
	}
	created, err := s.cfg.Store.CreateWebhook(c.Request().Context(), w, f.Secret)
	if err != nil {
		return store.Webhook{}, err
	}
	s.audit(c, "webhook.create", "webhook:"+created.ID, webhookHost(created)+" for "+strings.Join(created.Events, ", ")+" ("+created.Format+")")
	return created, nil
}

// webhookHost is where a webhook goes, for the audit log: its host, not
// its path, which may carry a token (Slack's do).
func webhookHost(w store.Webhook) string {
	if i := strings.Index(w.URL, "://"); i >= 0 {
		rest := w.URL[i+3:]
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			rest = rest[:j]
		}
		return w.URL[:i+3] + rest
	}
	return ""
}

// removeWebhook deletes a webhook and its deliveries, and audits it.
func (s *Server) removeWebhook(c echo.Context, id string) (store.Webhook, error) {
	w, err := s.cfg.Store.DeleteWebhook(c.Request().Context(), id)
	if err != nil {
		return store.Webhook{}, err
	}
	s.audit(c, "webhook.delete", "webhook:"+w.ID, webhookHost(w))
	return w, nil
}

// sendTestEvent records a test event for one webhook, due at once, and
// audits it.
func (s *Server) sendTestEvent(c echo.Context, id string) (store.AlertEvent, error) {
	ctx := c.Request().Context()
	w, err := s.cfg.Store.Webhook(ctx, id)
	if err != nil {
		return store.AlertEvent{}, err
	}
	ev, err := alert.TestEvent(w.ID, s.cfg.Now())
	if err != nil {
		return store.AlertEvent{}, err
	}
	if err := s.cfg.Store.EnqueueEvent(ctx, ev, w.ID); err != nil {
		return store.AlertEvent{}, err
	}
	if s.cfg.KickAlerts != nil {
		s.cfg.KickAlerts()
	}
	s.audit(c, "webhook.test", "webhook:"+w.ID, "test event "+ev.ID)
	return ev, nil
}

func (s *Server) listWebhooks(c echo.Context) error {
	ws, err := s.cfg.Store.Webhooks(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]WebhookView, len(ws))
	for i, w := range ws {
		out[i] = viewWebhook(w)
	}
	return c.JSON(http.StatusOK, map[string]any{"webhooks": out})
}

func (s *Server) createWebhookAPI(c echo.Context) error {
	var f WebhookForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	w, err := s.addWebhook(c, f)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/webhooks/"+w.ID)
	v := viewWebhook(w)
	return c.JSON(http.StatusCreated, v)
}

func (s *Server) deleteWebhookAPI(c echo.Context) error {
	w, err := s.removeWebhook(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewWebhook(w))
}

func (s *Server) testWebhookAPI(c echo.Context) error {
	ev, err := s.sendTestEvent(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, map[string]string{"event_id": ev.ID})
}

// maxDeliveriesListed bounds a webhook's deliveries shown at once.
const maxDeliveriesListed = 100

func (s *Server) listDeliveries(c echo.Context) error {
	out, err := s.deliveryViews(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"deliveries": out})
}

// deliveryViews are a webhook's latest deliveries, newest first
// (ErrNotFound for no such webhook).
func (s *Server) deliveryViews(ctx context.Context, id string) ([]DeliveryView, error) {
	if _, err := s.cfg.Store.Webhook(ctx, id); err != nil {
		return nil, err
	}
	ds, err := s.cfg.Store.Deliveries(ctx, id, maxDeliveriesListed)
	if err != nil {
		return nil, fmt.Errorf("deliveries: %w", err)
	}
	out := make([]DeliveryView, len(ds))
	for i, d := range ds {
		out[i] = viewDelivery(d)
	}
	return out, nil
}
