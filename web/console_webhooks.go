package web

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The console's webhooks: the list with its add form, each webhook's page
// with its deliveries, and the remove and "send a test event" buttons. The
// forms go through the API's checks (addWebhook), so their errors read as
// the API's.

func webhookURL(id string) string { return "/admin/webhooks/" + url.PathEscape(id) }

// webhookRow shows a webhook, with its latest delivery when there is one.
func webhookRow(w store.Webhook, last *store.Delivery, now time.Time) ui.WebhookRow {
	r := ui.WebhookRow{ID: w.ID, URL: w.URL, Format: w.Format, Events: strings.Join(w.Events, ", "), Created: stamp(w.CreatedAt),
		Page: webhookURL(w.ID), LastDelivery: "none yet", LastTone: "muted"}
	if last != nil {
		switch last.Status {
		case store.DeliveryDelivered:
			r.LastDelivery, r.LastTone = "delivered "+ago(now, last.DeliveredAt), "ok"
		case store.DeliveryFailed:
			r.LastDelivery, r.LastTone = "failed", "bad"
		default:
			r.LastDelivery, r.LastTone = "pending", "warn"
			if last.Attempts > 0 {
				r.LastDelivery = "retrying"
			}
		}
	}
	return r
}

func deliveryRow(d store.Delivery, now time.Time) ui.DeliveryRow {
	r := ui.DeliveryRow{ID: d.ID, EventID: d.EventID, Type: d.EventType, State: d.EventState, Status: d.Status, Attempts: d.Attempts,
		Error: d.LastError, Created: stamp(d.CreatedAt), Tone: "warn"}
	if d.LastStatusCode != 0 {
		r.Code = strconv.Itoa(d.LastStatusCode)
	}
	if d.Attempts > 0 {
		r.Latency = strconv.FormatInt(d.LastLatency.Milliseconds(), 10) + " ms"
	}
	switch d.Status {
	case store.DeliveryDelivered:
		r.Tone = "ok"
	case store.DeliveryFailed:
		r.Tone = "bad"
	default:
		r.Next = until(now, d.NextAttemptAt)
		if r.Next == "" || !d.NextAttemptAt.After(now) {
			r.Next = "now"
		}
	}
	return r
}

func (s *Server) webhooksPage(c echo.Context) error {
	return s.renderWebhooks(c, http.StatusOK, ui.WebhookForm{}, nil)
}

// renderWebhooks shows the webhooks page; form and events, when set, are
// a refused add form, shown again as sent (but its secret).
func (s *Server) renderWebhooks(c echo.Context, status int, form ui.WebhookForm, events []string) error {
	ctx := c.Request().Context()
	ws, err := s.cfg.Store.Webhooks(ctx)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	p := ui.Webhooks{Form: form}
	for _, t := range alert.Types {
		p.Events = append(p.Events, ui.Option{Value: t, Label: t, Selected: slices.Contains(events, t)})
	}
	for _, w := range ws {
		ds, err := s.cfg.Store.Deliveries(ctx, w.ID, 1)
		if err != nil {
			return err
		}
		var last *store.Delivery
		if len(ds) > 0 {
			last = &ds[0]
		}
		p.Webhooks = append(p.Webhooks, webhookRow(w, last, now))
	}
	return s.render(c, status, ui.WebhooksPage(s.frame(c, "webhooks", "Webhooks"), p))
}

func (s *Server) consoleCreateWebhook(c echo.Context) error {
	form, _ := c.FormParams()
	f := WebhookForm{URL: strings.TrimSpace(c.FormValue("url")), Events: form["events"], Format: c.FormValue("format"), Secret: c.FormValue("secret")}
	w, err := s.addWebhook(c, f)
	if err != nil {
		msg, fix := fixable(err)
		if !fix {
			return err
		}
		c.Set(flashNowKey, &ui.Flash{Kind: "error", Text: msg})
		return s.renderWebhooks(c, http.StatusBadRequest, ui.WebhookForm{URL: f.URL, Format: f.Format}, f.Events)
	}
	s.flash(c, "ok", "Added the webhook for "+strings.Join(w.Events, ", ")+". Send it a test event to check it is reachable.")
	return c.Redirect(http.StatusSeeOther, "/admin/webhooks")
}

func (s *Server) webhookPage(c echo.Context) error {
	ctx := c.Request().Context()
	w, err := s.cfg.Store.Webhook(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	ds, err := s.cfg.Store.Deliveries(ctx, w.ID, maxDeliveriesListed)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	var last *store.Delivery
	if len(ds) > 0 {
		last = &ds[0]
	}
	p := ui.WebhookDetail{Webhook: webhookRow(w, last, now)}
	for _, d := range ds {
		p.Deliveries = append(p.Deliveries, deliveryRow(d, now))
	}
	return s.render(c, http.StatusOK, ui.WebhookPage(s.subframe(c, "webhooks", "Webhook"), p))
}

func (s *Server) consoleRemoveWebhook(c echo.Context) error {
	w, err := s.removeWebhook(c, c.Param("id"))
	return s.back(c, "/admin/webhooks", err, "Removed the webhook to "+webhookHost(w)+".")
}

func (s *Server) consoleTestWebhook(c echo.Context) error {
	id := c.Param("id")
	_, err := s.sendTestEvent(c, id)
	return s.back(c, webhookURL(id), err, "Sent a test event: its delivery is listed below.")
}
