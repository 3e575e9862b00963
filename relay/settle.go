package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// watchStored has a stored response's attempt record the response as an
// object of its account as soon as its id is known (see head.created).
func (s *Server) watchStored(ctx context.Context, r *request, ch *choice, h *head) {
	if r.fields.Stored() {
		h.created = func(id string) {
			wctx, cancel := storeWriteContext(ctx)
			defer cancel()
			s.recordStored(wctx, r, ch, id)
		}
	}
}

// recordStored records the stored response id as an object of ch's
// account, unsettled (its usage not charged yet); one recorded already is
// kept as it is.
func (s *Server) recordStored(ctx context.Context, r *request, ch *choice, id string) {
	o := store.Object{Scope: r.client.scope(), ID: id, Kind: store.ObjectResponse, AccountID: ch.target.Account.ID,
		Organization: ch.target.Account.Organization, ClientKeyID: r.client.key.ID, ThreadKey: string(r.ident.Key),
		RequestID: r.id, Created: s.cfg.Now()}
	if err := s.cfg.Store.PutObject(ctx, o); err != nil {
		s.log.Warn("record stored response: a later request naming it will not find its account", "response", id, "err", err)
	}
}

// settle records what a completed response leaves behind, before its
// terminal event reaches the client (which may send its next request the
// moment it reads it): who issued its turn state (and where a turn state
// this request released binds now) and produced its id, the thread's
// continuity (input is the whole history the upstream saw; nil: unknown,
// nothing is remembered; a compaction's answer replaces the history with the
// compacted one), the binding plan and fresh soft rows, and an account that
// served again after its reset.
func (s *Server) settle(ctx context.Context, r *request, ch *choice, h *head, tr *tracker, input []json.RawMessage) {
	ctx, cancel := storeWriteContext(ctx)
	defer cancel()
	acct := ch.target.Account.ID
	if h.turnState != "" {
		s.owners.put(turnStateKey(h.turnState), owner{account: acct, scope: r.client.scope(), proxy: h.proxy})
	}
	if h.released && r.turnState != "" {
		// The client keeps the first turn state of a turn (over WebSocket
		// the prewarm's) and echoes it on the turn's later requests: they
		// follow this request to the account that answered it, rather than
		// fail closed on the one that failed it. That account never issued
		// the state, so it is not forwarded there.
		s.owners.put(turnStateKey(r.turnState), owner{account: acct, scope: r.client.scope(), proxy: true})
	}
	if tr.responseID != "" {
		s.owners.put(responseKey(tr.responseID), owner{account: acct, scope: r.client.scope()})
		if r.fields.Stored() {
			// A stored response is an object of its account: read, deleted
			// or continued through any replica, it goes there. This answer
			// charged its usage; a later read does not again. (Its
			// response.created recorded it already, unsettled: settled now.)
			now := s.cfg.Now()
			s.recordStored(ctx, r, ch, tr.responseID)
			if _, err := s.cfg.Store.SettleObject(ctx, r.client.scope(), tr.responseID, now); err != nil {
				s.log.Warn("settle stored response", "response", tr.responseID, "err", err)
			}
		}
	}
	if input != nil && r.ident.Key != "" && tr.responseID != "" {
		ts := ""
		if !h.proxy {
			ts = h.turnState
		}
		s.conts.Commit(r.contKey(), continuity.Turn{ResponseID: tr.responseID, Input: input, Output: tr.output,
			AccountID: acct, Organization: ch.target.Account.Organization, TurnState: ts, Compaction: r.compaction != ""})
	}
	if r.ident.Key != "" {
		plan := planBinding(ch.sel, ch.prefs)
		if plan.Write {
			p := store.Placement{
				ClientScope: r.client.scope(), ThreadKey: string(r.ident.Key), SessionKey: string(r.ident.SessionKey),
				SessionID: r.ident.Session, ThreadID: r.ident.Thread, AccountID: acct,
				Source: plan.Source, TTL: s.cfg.BindingTTL, SeedSession: plan.SeedSession,
			}
			decided := s.cfg.Now()
			if err := s.cfg.Store.Place(ctx, p); err != nil {
				s.log.Warn("write binding: kept for a retry", "err", err)
				p.At = decided
				s.placements.add(p)
			}
		}
		var touch []string
		now := s.cfg.Now()
		for _, b := range ch.rows {
			if b.Strength == store.Soft && b.AccountID == ch.target.Account.ID && needsTouch(b.LastSeenAt, now, s.cfg.BindingTTL) {
				touch = append(touch, b.ID)
			}
		}
		if err := s.cfg.Store.TouchBindings(ctx, touch, s.cfg.BindingTTL); err != nil {
			s.log.Warn("touch bindings", "err", err)
		}
	}
	if a := ch.target.Account; a.Status == store.StatusRateLimited || a.Status == store.StatusQuotaExceeded {
		// Served after its reset: live traffic is the probe that confirms it.
		if _, err := s.cfg.Store.SetAccountStatus(ctx, a.ID, store.StatusActive, "served again after its reset", time.Time{}); err != nil {
			s.log.Warn("mark account active", "account", a.ID, "err", err)
		}
	}
}

// needsTouch reports whether a soft row last seen at seen is due a refresh:
// once a sixtieth of its TTL has passed (six minutes of six hours), not on
// every turn of an active thread. The row's expiry then lags the thread's
// last activity by at most that much.
func needsTouch(seen, now time.Time, ttl time.Duration) bool {
	return now.Sub(seen) >= ttl/60
}

// penalise applies an outcome's penalty to an account.
func (s *Server) penalise(ctx context.Context, accountID string, p *penalty) {
	if p == nil {
		return
	}
	ctx, cancel := storeWriteContext(ctx)
	defer cancel()
	if _, err := s.cfg.Store.SetAccountStatus(ctx, accountID, p.Status, p.Reason, p.Until); err != nil {
		s.log.Warn("penalise account", "account", accountID, "err", err)
	}
}

// foldUsage records the usage windows an upstream reported in headers.
func (s *Server) foldUsage(accountID string, h http.Header) {
	s.foldLimits(accountID, wire.ParseRateLimitHeaders(h))
}

// foldLimits records reported usage windows for an account, behind the
// request (s.usage): never on the way to its first event or its last.
func (s *Server) foldLimits(accountID string, rl wire.RateLimits) {
	p, sec := usageWindow(rl.Primary), usageWindow(rl.Secondary)
	if !p.Known && !sec.Known {
		return
	}
	s.usage.add(usageReport{account: accountID, primary: p, secondary: sec})
}

// usageReport is the usage windows one answer reported for an account.
type usageReport struct {
	account            string
	primary, secondary store.Window
}

// newUsage returns the writer of usage reports. A batch is folded into one
// report per account (for each window the latest that was reported), so
// under load an account's usage costs one write however many answers
// reported it. A report the database refused is not retried, and one
// that finds 100,000 queued is dropped: the next answer reports newer
// windows.
func (s *Server) newUsage() *writeBehind[usageReport] {
	return &writeBehind[usageReport]{batch: 4096, max: 100_000, closeNow: make(chan struct{}),
		write: func(batch []usageReport) []usageReport {
			for _, r := range latestUsage(batch) {
				ctx, cancel := context.WithTimeout(context.Background(), storeWriteTimeout)
				if err := s.cfg.Store.UpdateUsage(ctx, r.account, r.primary, r.secondary); err != nil {
					s.log.Warn("update usage", "account", r.account, "err", err)
				}
				cancel()
			}
			return nil
		},
		dropped: func(int) {},
	}
}

// latestUsage folds reports, oldest first, into one per account, in the
// order the accounts first reported: each window as last reported.
func latestUsage(batch []usageReport) []usageReport {
	var out []usageReport
	at := map[string]int{}
	for _, r := range batch {
		i, ok := at[r.account]
		if !ok {
			at[r.account] = len(out)
			out = append(out, r)
			continue
		}
		if r.primary.Known {
			out[i].primary = r.primary
		}
		if r.secondary.Known {
			out[i].secondary = r.secondary
		}
	}
	return out
}

func usageWindow(w *wire.RateLimitWindow) store.Window {
	if w == nil {
		return store.Window{}
	}
	sw := store.Window{UsedPercent: w.UsedPercent, WindowMinutes: w.WindowMinutes, Known: true}
	if w.ResetAt > 0 {
		sw.ResetAt = time.Unix(w.ResetAt, 0).UTC()
	}
	return sw
}

// storeWriteTimeout bounds the writes a request leaves behind (its
// binding, the account's usage windows or status): they must not end with
// the client, and must not hold a stream's last event for as long as TCP
// takes to give up on a database that stopped answering.
const storeWriteTimeout = 5 * time.Second

// storeWriteContext is ctx without its cancellation, with storeWriteTimeout.
func storeWriteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeWriteTimeout)
}

// placementRetryFor is how long a binding write the database refused is
// tried again. Past it the thread's lane and continuity have carried it
// (or it has ended), and a later answer has written its row.
const placementRetryFor = 10 * time.Minute

// newPlacements retries binding writes the database did not take as their
// requests settled (down, or too slow for the write's deadline): a
// thread's row is what keeps it on its account across restarts and
// replicas, so one lost under load could place the thread afresh, on an
// account that cannot read its history. A retried placement never undoes a
// later one (store.Placement.At).
func (s *Server) newPlacements() *writeBehind[store.Placement] {
	return &writeBehind[store.Placement]{batch: 64, max: 100_000, closeNow: make(chan struct{}),
		write: s.writePlacements,
		dropped: func(n int) {
			s.metrics.bindingsDropped.Add(float64(n))
			s.log.Error("binding writes dropped: the database did not take them in time", "bindings", n)
		},
	}
}

// writePlacements writes late placements one by one and returns those to
// try again (see written.sort), less those past placementRetryFor.
func (s *Server) writePlacements(batch []store.Placement) []store.Placement {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := writeEach(ctx, batch, s.cfg.Store.Place)
	retry, refused := w.sort()
	if len(refused) > 0 {
		s.log.Error("write binding: the database refused it", "bindings", len(refused), "err", w.lastErr())
		s.metrics.bindingsDropped.Add(float64(len(refused)))
	}
	if len(retry) == 0 {
		return nil
	}
	now := s.cfg.Now()
	kept := retry[:0]
	for _, p := range retry {
		if now.Sub(p.At) < placementRetryFor {
			kept = append(kept, p)
		}
	}
	if n := len(retry) - len(kept); n > 0 {
		s.log.Error("binding writes given up after "+placementRetryFor.String(), "bindings", n, "err", w.lastErr())
		s.metrics.bindingsDropped.Add(float64(n))
	}
	return kept
}
