package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Webhook is a receiver of alerts, as an admin registered it. Its secret
// is not part of it: WebhookSecret reads it, for the deliverer alone.
type Webhook struct {
	ID        string
	URL       string
	Events    []string // the event types it is sent
	Format    string   // "json" or "slack"
	CreatedAt time.Time
	Disabled  bool
}

type webhookRow struct {
	ID        string `db:"id"`
	URL       string `db:"url"`
	Events    string `db:"events"`
	Format    string `db:"format"`
	CreatedAt int64  `db:"created_at"`
	Disabled  int    `db:"disabled"`
}

func (r webhookRow) webhook() Webhook {
	return Webhook{ID: r.ID, URL: r.URL, Events: splitList(r.Events), Format: r.Format,
		CreatedAt: time.UnixMilli(r.CreatedAt).UTC(), Disabled: r.Disabled != 0}
}

// webhookAAD binds a webhook's sealed secret to its row.
func webhookAAD(id string) []byte { return []byte("webhook:" + id) }

// CreateWebhook stores a new webhook with its secret sealed (ErrNoSecretKey
// without a secret key); the id and creation time are filled in. The caller
// validates the URL, events and format.
func (s *Store) CreateWebhook(ctx context.Context, w Webhook, secret string) (Webhook, error) {
	if s.sealer == nil {
		return Webhook{}, ErrNoSecretKey
	}
	now := s.now()
	w.ID, w.CreatedAt = NewID("whk", now), time.UnixMilli(now.UnixMilli()).UTC()
	sealed, err := s.sealer.Seal([]byte(secret), webhookAAD(w.ID))
	if err != nil {
		return Webhook{}, err
	}
	if _, err := s.exec(ctx, `INSERT INTO webhooks (id, url, events, format, secret, created_at, disabled) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		w.ID, w.URL, joinList(w.Events), w.Format, sealed, now.UnixMilli(), flag(w.Disabled)); err != nil {
		return Webhook{}, fmt.Errorf("create webhook: %w", err)
	}
	w.Events = splitList(joinList(w.Events))
	return w, nil
}

// Webhooks lists every webhook, oldest first.
func (s *Store) Webhooks(ctx context.Context) ([]Webhook, error) {
	var rows []webhookRow
	if err := s.selectAll(ctx, &rows, `SELECT id, url, events, format, created_at, disabled FROM webhooks ORDER BY created_at, id`); err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	out := make([]Webhook, len(rows))
	for i, r := range rows {
		out[i] = r.webhook()
	}
	return out, nil
}

// Webhook reads one webhook (ErrNotFound when there is none).
func (s *Store) Webhook(ctx context.Context, id string) (Webhook, error) {
	var r webhookRow
	err := s.get(ctx, &r, `SELECT id, url, events, format, created_at, disabled FROM webhooks WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Webhook{}, fmt.Errorf("webhook %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("read webhook: %w", err)
	}
	return r.webhook(), nil
}

// WebhookSecret opens a webhook's secret, to sign a delivery.
func (s *Store) WebhookSecret(ctx context.Context, id string) (string, error) {
	if s.sealer == nil {
		return "", ErrNoSecretKey
	}
	var sealed string
	err := s.get(ctx, &sealed, `SELECT secret FROM webhooks WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("webhook %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read webhook secret: %w", err)
	}
	pt, err := s.sealer.Open(sealed, webhookAAD(id))
	if err != nil {
		return "", fmt.Errorf("webhook %s: %w", id, err)
	}
	return string(pt), nil
}

// DeleteWebhook deletes a webhook and its deliveries, sent or not
// (ErrNotFound when there is none).
func (s *Store) DeleteWebhook(ctx context.Context, id string) (Webhook, error) {
	w, err := s.Webhook(ctx, id)
	if err != nil {
		return Webhook{}, err
	}
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM webhook_deliveries WHERE webhook_id = ?`), id); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM webhooks WHERE id = ?`), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return Webhook{}, fmt.Errorf("webhook %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("delete webhook: %w", err)
	}
	return w, nil
}

// AlertState is whether one condition stands, as last written. Version 0
// is a condition never seen (no row).
type AlertState struct {
	Type       string
	SubjectKey string
	Firing     bool
	// Quiet: the condition stands but came back within the quiet period
	// of its last event, so neither it nor its clearing is sent.
	Quiet     bool
	ChangedAt time.Time
	FiredAt   time.Time // its last fired event; zero: none yet
	// Subject and Data are the condition's (JSON objects), kept for the
	// event that clears it.
	Subject json.RawMessage
	Data    json.RawMessage
	Version int64
}

type alertStateRow struct {
	Type       string `db:"type"`
	SubjectKey string `db:"subject_key"`
	Firing     int    `db:"firing"`
	Quiet      int    `db:"quiet"`
	ChangedAt  int64  `db:"changed_at"`
	FiredAt    *int64 `db:"fired_at"`
	Subject    string `db:"subject"`
	Data       string `db:"data"`
	Version    int64  `db:"version"`
}

// AlertStates reads the state of every condition ever seen.
func (s *Store) AlertStates(ctx context.Context) ([]AlertState, error) {
	var rows []alertStateRow
	if err := s.selectAll(ctx, &rows, `SELECT type, subject_key, firing, quiet, changed_at, fired_at, subject, data, version FROM alert_states ORDER BY type, subject_key`); err != nil {
		return nil, fmt.Errorf("read alert states: %w", err)
	}
	out := make([]AlertState, len(rows))
	for i, r := range rows {
		out[i] = AlertState{Type: r.Type, SubjectKey: r.SubjectKey, Firing: r.Firing != 0, Quiet: r.Quiet != 0,
			ChangedAt: time.UnixMilli(r.ChangedAt).UTC(), FiredAt: fromMillis(r.FiredAt),
			Subject: json.RawMessage(r.Subject), Data: json.RawMessage(r.Data), Version: r.Version}
	}
	return out, nil
}

// AlertEvent is one event: a condition fired or cleared, or a test.
// Payload is the generic JSON event, the body a json webhook receives.
type AlertEvent struct {
	ID         string
	Type       string
	SubjectKey string
	At         time.Time
	State      string // "fired" or "cleared"
	Payload    json.RawMessage
}

// TransitionAlert writes next as the state of its condition, provided it
// is still at version prev (0: never seen), and with it records ev (when
// not nil) and a pending delivery of ev to every enabled webhook that asked
// for its type, due at once. It reports false, writing nothing, when
// another writer changed the condition first: with several replicas
// watching the same conditions, one change makes one event.
func (s *Store) TransitionAlert(ctx context.Context, prev int64, next AlertState, ev *AlertEvent) (bool, error) {
	won := false
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		var res sql.Result
		var err error
		now := s.now().UnixMilli()
		subject, data := jsonObject(next.Subject), jsonObject(next.Data)
		if prev == 0 {
			res, err = tx.ExecContext(ctx, s.q(`INSERT INTO alert_states (type, subject_key, firing, quiet, changed_at, fired_at, subject, data, version)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (type, subject_key) DO NOTHING`),
				next.Type, next.SubjectKey, flag(next.Firing), flag(next.Quiet), now, millis(next.FiredAt), subject, data)
		} else {
			res, err = tx.ExecContext(ctx, s.q(`UPDATE alert_states SET firing = ?, quiet = ?, changed_at = ?, fired_at = ?, subject = ?, data = ?, version = version + 1
				WHERE type = ? AND subject_key = ? AND version = ?`),
				flag(next.Firing), flag(next.Quiet), now, millis(next.FiredAt), subject, data, next.Type, next.SubjectKey, prev)
		}
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		won = true
		if ev == nil {
			return nil
		}
		return s.insertEvent(ctx, tx, *ev, nil)
	})
	if err != nil {
		return false, fmt.Errorf("alert transition: %w", err)
	}
	return won, nil
}

// EnqueueEvent records ev and a pending delivery of it to each of the
// webhooks named (a test event, sent to the webhook it was asked for,
// whatever its events and even disabled).
func (s *Store) EnqueueEvent(ctx context.Context, ev AlertEvent, webhookIDs ...string) error {
	err := s.inTx(ctx, func(tx *sqlx.Tx) error { return s.insertEvent(ctx, tx, ev, webhookIDs) })
	if err != nil {
		return fmt.Errorf("enqueue alert event: %w", err)
	}
	return nil
}

// insertEvent writes ev and its deliveries: to the webhooks named, or
// when none are, to every enabled webhook that asked for ev's type.
func (s *Store) insertEvent(ctx context.Context, tx *sqlx.Tx, ev AlertEvent, to []string) error {
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO alert_events (id, type, subject_key, at, state, payload) VALUES (?, ?, ?, ?, ?, ?)`),
		ev.ID, ev.Type, ev.SubjectKey, ev.At.UnixMilli(), ev.State, string(ev.Payload)); err != nil {
		return err
	}
	if to == nil {
		var rows []webhookRow
		if err := tx.SelectContext(ctx, &rows, s.q(`SELECT id, url, events, format, created_at, disabled FROM webhooks WHERE disabled = 0`)); err != nil {
			return err
		}
		for _, r := range rows {
			if slices.Contains(splitList(r.Events), ev.Type) {
				to = append(to, r.ID)
			}
		}
	}
	now := s.now()
	for _, w := range to {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO webhook_deliveries (id, webhook_id, event_id, status, next_attempt_at, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			NewID("dlv", now), w, ev.ID, DeliveryPending, now.UnixMilli(), now.UnixMilli()); err != nil {
			return err
		}
	}
	return nil
}

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed" // out of tries
)

// Delivery is one event to one webhook and how its tries went.
type Delivery struct {
	ID             string
	WebhookID      string
	EventID        string
	EventType      string
	EventState     string
	Status         string
	Attempts       int
	NextAttemptAt  time.Time
	LastStatusCode int
	LastLatency    time.Duration
	LastError      string
	CreatedAt      time.Time
	DeliveredAt    time.Time
}

type deliveryRow struct {
	ID             string `db:"id"`
	WebhookID      string `db:"webhook_id"`
	EventID        string `db:"event_id"`
	EventType      string `db:"type"`
	EventState     string `db:"state"`
	Status         string `db:"status"`
	Attempts       int    `db:"attempts"`
	NextAttemptAt  int64  `db:"next_attempt_at"`
	LastStatusCode int    `db:"last_status_code"`
	LastLatencyMS  int64  `db:"last_latency_ms"`
	LastError      string `db:"last_error"`
	CreatedAt      int64  `db:"created_at"`
	DeliveredAt    *int64 `db:"delivered_at"`
}

func (r deliveryRow) delivery() Delivery {
	return Delivery{ID: r.ID, WebhookID: r.WebhookID, EventID: r.EventID, EventType: r.EventType, EventState: r.EventState,
		Status: r.Status, Attempts: r.Attempts, NextAttemptAt: time.UnixMilli(r.NextAttemptAt).UTC(),
		LastStatusCode: r.LastStatusCode, LastLatency: time.Duration(r.LastLatencyMS) * time.Millisecond, LastError: r.LastError,
		CreatedAt: time.UnixMilli(r.CreatedAt).UTC(), DeliveredAt: fromMillis(r.DeliveredAt)}
}

const deliveryColumns = `d.id, d.webhook_id, d.event_id, e.type, e.state, d.status, d.attempts, d.next_attempt_at,
	d.last_status_code, d.last_latency_ms, d.last_error, d.created_at, d.delivered_at`

// Deliveries lists a webhook's latest deliveries, newest first, at most
// limit of them.
func (s *Store) Deliveries(ctx context.Context, webhookID string, limit int) ([]Delivery, error) {
	var rows []deliveryRow
	if err := s.selectAll(ctx, &rows, `SELECT `+deliveryColumns+` FROM webhook_deliveries d JOIN alert_events e ON e.id = d.event_id
		WHERE d.webhook_id = ? ORDER BY d.created_at DESC, d.id DESC LIMIT ?`, webhookID, limit); err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	out := make([]Delivery, len(rows))
	for i, r := range rows {
		out[i] = r.delivery()
	}
	return out, nil
}

// ClaimedDelivery is a due delivery this replica claimed, with what it
// takes to send it.
type ClaimedDelivery struct {
	Delivery
	Webhook Webhook
	Payload json.RawMessage
}

// ClaimDeliveries claims up to limit pending deliveries due now and not
// claimed by a live lease, for me until now+lease, in one statement: two
// replicas claiming at once never both get one delivery (PostgreSQL
// re-checks the lease of a row another claim changed meanwhile; SQLite has
// one writer). A claim not finished by its lease's end (its replica died
// mid-try) is claimed again then.
func (s *Store) ClaimDeliveries(ctx context.Context, me string, lease time.Duration, limit int) ([]ClaimedDelivery, error) {
	now := s.now().UnixMilli()
	until := now + lease.Milliseconds()
	var ids []string
	err := s.writeQuery(ctx, &ids, `UPDATE webhook_deliveries SET claimed_by = ?, claimed_until = ?
		WHERE id IN (SELECT id FROM webhook_deliveries WHERE status = ? AND next_attempt_at <= ? AND claimed_until < ?
			ORDER BY next_attempt_at, id LIMIT ?)
		AND status = ? AND claimed_until < ?
		RETURNING id`, me, until, DeliveryPending, now, now, limit, DeliveryPending, now)
	s.noteWrite(ctx, err)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	q, args, err := sqlx.In(`SELECT `+deliveryColumns+`, e.payload, w.url, w.events, w.format, w.created_at AS webhook_created_at, w.disabled
		FROM webhook_deliveries d JOIN alert_events e ON e.id = d.event_id JOIN webhooks w ON w.id = d.webhook_id
		WHERE d.id IN (?) ORDER BY d.next_attempt_at, d.id`, ids)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		deliveryRow
		Payload          string `db:"payload"`
		URL              string `db:"url"`
		Events           string `db:"events"`
		Format           string `db:"format"`
		WebhookCreatedAt int64  `db:"webhook_created_at"`
		Disabled         int    `db:"disabled"`
	}
	if err := s.db.SelectContext(ctx, &rows, s.q(q), args...); err != nil {
		return nil, fmt.Errorf("read claimed deliveries: %w", err)
	}
	out := make([]ClaimedDelivery, len(rows))
	for i, r := range rows {
		out[i] = ClaimedDelivery{Delivery: r.delivery(), Payload: json.RawMessage(r.Payload),
			Webhook: webhookRow{ID: r.WebhookID, URL: r.URL, Events: r.Events, Format: r.Format, CreatedAt: r.WebhookCreatedAt, Disabled: r.Disabled}.webhook()}
	}
	return out, nil
}

// DeliveryResult is how one try of a delivery went.
type DeliveryResult struct {
	Delivered  bool
	StatusCode int // 0: no answer
	Latency    time.Duration
	Err        string // why it failed, for operators (no secret)
	// Next is when to try again after a failure; zero gives up (failed).
	Next time.Time
}

// FinishDelivery records a try of a delivery me claimed: delivered, due
// again at r.Next, or failed for good. A claim me no longer holds (its
// lease ran out and another replica took it) records nothing.
func (s *Store) FinishDelivery(ctx context.Context, id, me string, r DeliveryResult) error {
	status, next, delivered := DeliveryPending, r.Next.UnixMilli(), (*int64)(nil)
	now := s.now()
	switch {
	case r.Delivered:
		status, next, delivered = DeliveryDelivered, now.UnixMilli(), millis(now)
	case r.Next.IsZero():
		status, next = DeliveryFailed, now.UnixMilli()
	}
	_, err := s.exec(ctx, `UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_attempt_at = ?, last_status_code = ?,
		last_latency_ms = ?, last_error = ?, delivered_at = ?, claimed_by = '', claimed_until = 0
		WHERE id = ? AND claimed_by = ? AND status = ?`,
		status, next, r.StatusCode, r.Latency.Milliseconds(), truncate(r.Err, 500), delivered, id, me, DeliveryPending)
	if err != nil {
		return fmt.Errorf("finish delivery: %w", err)
	}
	return nil
}

// truncate cuts s to at most n bytes, dropping a rune cut in half.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// jsonObject is a JSON object column's text: {} for none.
func jsonObject(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	return string(raw)
}

// flag is a boolean as the schema's INTEGER 0/1.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// DeleteAlertHistoryBefore deletes the deliveries finished (delivered or
// out of tries) before before, and the events before it that no delivery
// names any more. Pending deliveries and their events stay whatever their
// age, and so does every condition's state.
func (s *Store) DeleteAlertHistoryBefore(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.exec(ctx, `DELETE FROM webhook_deliveries WHERE status <> ? AND created_at < ?`, DeliveryPending, before.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("delete old deliveries: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := s.exec(ctx, `DELETE FROM alert_events WHERE at < ?
		AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = alert_events.id)`, before.UnixMilli()); err != nil {
		return n, fmt.Errorf("delete old alert events: %w", err)
	}
	return n, nil
}

// AttemptCount is how many attempts on one account ended in one class.
type AttemptCount struct {
	AccountID string `db:"account_id"`
	Class     string `db:"class"`
	N         int    `db:"n"`
}

// AttemptCounts counts the attempts started after since, by account and
// class (attempts on no account left out).
func (s *Store) AttemptCounts(ctx context.Context, since time.Time) ([]AttemptCount, error) {
	var out []AttemptCount
	if err := s.selectAll(ctx, &out, `SELECT account_id, class, COUNT(*) AS n FROM attempts
		WHERE started_at > ? AND account_id <> '' GROUP BY account_id, class ORDER BY account_id, class`, since.UnixMilli()); err != nil {
		return nil, fmt.Errorf("count attempts: %w", err)
	}
	return out, nil
}
