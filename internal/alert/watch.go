package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// WatcherConfig configures a Watcher. Only Store is required.
type WatcherConfig struct {
	Store *store.Store
	// Interval is how often the conditions are evaluated; default 15s.
	Interval time.Duration
	// Quiet is the quiet period (see Decide); default DefaultQuiet.
	Quiet time.Duration
	// Now is the clock of events and the quiet period; default time.Now.
	Now func() time.Time
	// Budget reads how a key's limits stand (store.KeyBudget with this
	// replica's view of the reservations in flight); nil leaves keys'
	// limits unwatched.
	Budget func(context.Context, store.ClientKey) ([]store.LimitUse, error)
	// ErrorShare and ErrorMinAttempts set when upstream.errors stands
	// (see ErrorConditions); defaults DefaultErrorShare and
	// DefaultErrorMinAttempts.
	ErrorShare       float64
	ErrorMinAttempts int
	// Recorded is called after a check recorded an event (the
	// Deliverer's Kick, so it is sent at once); nil: nothing.
	Recorded func()
	Logger   *slog.Logger
}

// Watcher evaluates the conditions on the store's state and records each
// change (store.TransitionAlert): the event it makes and its deliveries.
// Every replica may run one: of two seeing one change, one records it.
type Watcher struct {
	cfg WatcherConfig // static after NewWatcher
}

// NewWatcher returns a Watcher; it panics without a store.
func NewWatcher(cfg WatcherConfig) *Watcher {
	if cfg.Store == nil {
		panic("alert: WatcherConfig.Store is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 15 * time.Second
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = DefaultQuiet
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ErrorShare <= 0 {
		cfg.ErrorShare = DefaultErrorShare
	}
	if cfg.ErrorMinAttempts <= 0 {
		cfg.ErrorMinAttempts = DefaultErrorMinAttempts
	}
	return &Watcher{cfg: cfg}
}

// Run checks the conditions every Interval until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		if err := w.Check(ctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn("alert conditions", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check evaluates every condition once and records the changes.
func (w *Watcher) Check(ctx context.Context) error {
	now := w.cfg.Now()
	accts, err := w.cfg.Store.Accounts(ctx)
	if err != nil {
		return err
	}
	keys, err := w.cfg.Store.ClientKeys(ctx)
	if err != nil {
		return err
	}
	conds := AccountConditions(accts, keys, now)
	counts, err := w.cfg.Store.AttemptCounts(ctx, now.Add(-ErrorWindow))
	if err != nil {
		return err
	}
	conds = append(conds, ErrorConditions(accts, counts, w.cfg.ErrorShare, w.cfg.ErrorMinAttempts)...)
	deps, err := w.cfg.Store.ReplicaDepartures(ctx)
	if err != nil {
		return err
	}
	if len(deps) > 0 {
		reps, err := w.cfg.Store.Replicas(ctx, time.Time{}) // every row; deletes none
		if err != nil {
			return err
		}
		conds = append(conds, ReplicaConditions(deps, reps)...)
	}
	if w.cfg.Budget != nil {
		for _, k := range keys {
			if len(k.Limits) == 0 || !k.Usable(now) {
				continue
			}
			uses, err := w.cfg.Budget(ctx, k)
			if err != nil {
				return fmt.Errorf("key %s budget: %w", k.ID, err)
			}
			conds = append(conds, KeyConditions(k, uses)...)
		}
	}
	states, err := w.cfg.Store.AlertStates(ctx)
	if err != nil {
		return err
	}
	type id struct{ typ, key string }
	prev := make(map[id]store.AlertState, len(states))
	for _, s := range states {
		prev[id{s.Type, s.SubjectKey}] = s
	}
	recorded := false
	standing := map[id]bool{}
	for _, c := range conds {
		standing[id{c.Type, c.Key}] = true
		subject, _ := json.Marshal(c.Subject)
		data, _ := json.Marshal(c.Data)
		p, ok := prev[id{c.Type, c.Key}]
		if !ok {
			p = store.AlertState{Type: c.Type, SubjectKey: c.Key}
		}
		r, err := w.change(ctx, p, true, now, subject, data)
		if err != nil {
			return err
		}
		recorded = recorded || r
	}
	for _, s := range states {
		if standing[id{s.Type, s.SubjectKey}] || !s.Firing {
			continue
		}
		r, err := w.change(ctx, s, false, now, s.Subject, s.Data)
		if err != nil {
			return err
		}
		recorded = recorded || r
	}
	if recorded && w.cfg.Recorded != nil {
		w.cfg.Recorded()
	}
	return nil
}

// change applies Decide to one condition and records what changed; it
// reports whether it recorded an event.
func (w *Watcher) change(ctx context.Context, p store.AlertState, on bool, now time.Time, subject, data json.RawMessage) (bool, error) {
	next, emit := Decide(State{Firing: p.Firing, Quiet: p.Quiet, FiredAt: p.FiredAt}, on, now, w.cfg.Quiet)
	if next == (State{Firing: p.Firing, Quiet: p.Quiet, FiredAt: p.FiredAt}) && p.Version != 0 {
		return false, nil
	}
	if !on && p.Version == 0 {
		return false, nil
	}
	row := store.AlertState{Type: p.Type, SubjectKey: p.SubjectKey, Firing: next.Firing, Quiet: next.Quiet, FiredAt: next.FiredAt,
		Subject: subject, Data: data}
	var ev *store.AlertEvent
	if emit != EmitNone {
		e, err := newEvent(p.Type, p.SubjectKey, emit, now, subject, data)
		if err != nil {
			return false, err
		}
		ev = &e
	}
	won, err := w.cfg.Store.TransitionAlert(ctx, p.Version, row, ev)
	if err != nil {
		return false, err
	}
	return won && ev != nil, nil
}

// newEvent is the stored event of a condition that fired or cleared: the
// generic JSON event, data.state set, a clear's message saying so.
func newEvent(typ, key string, emit Emit, now time.Time, subject, data json.RawMessage) (store.AlertEvent, error) {
	ev := Event{ID: store.NewID("evt", now), Type: typ, At: now.UTC()}
	if err := json.Unmarshal(subject, &ev.Subject); err != nil || ev.Subject == nil {
		ev.Subject = map[string]any{}
	}
	if err := json.Unmarshal(data, &ev.Data); err != nil || ev.Data == nil {
		ev.Data = map[string]any{}
	}
	state := Fired
	if emit == EmitCleared {
		state = Cleared
		if msg, _ := ev.Data["message"].(string); msg != "" {
			ev.Data["message"] = "Resolved: " + msg
		}
	}
	ev.Data["state"] = state
	payload, err := json.Marshal(ev)
	if err != nil {
		return store.AlertEvent{}, err
	}
	return store.AlertEvent{ID: ev.ID, Type: typ, SubjectKey: key, At: now, State: state, Payload: payload}, nil
}

// TestEvent is the stored event of the "send a test event" button.
func TestEvent(webhookID string, now time.Time) (store.AlertEvent, error) {
	ev := Event{ID: store.NewID("evt", now), Type: Test, At: now.UTC(), Subject: map[string]any{"webhook_id": webhookID},
		Data: map[string]any{"state": Fired, "message": "A test event from codex-relay: this webhook is reachable."}}
	payload, err := json.Marshal(ev)
	if err != nil {
		return store.AlertEvent{}, err
	}
	return store.AlertEvent{ID: ev.ID, Type: Test, SubjectKey: webhookID, At: now, State: Fired, Payload: payload}, nil
}
