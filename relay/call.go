package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/relay/store"
	"github.com/codexrelay/codex-relay/relay/wire"
)

// call is one client request on the Responses routes.
type call struct {
	id        string
	start     time.Time
	transport string // http, ws
	path      string
	sub       string // "" or "/compact"
	hopFrom   string // the replica that forwarded this request here, if one did
	client    client
	ident     Identity
	header    http.Header // the client's headers, as forwarded upstream
	body      []byte
	fields    continuity.Fields
	turnState string // the client's x-codex-turn-state, if any
	// recovery is the last recovery action this request needed ("" none).
	recovery string
	// force names the account the next attempt must use (a same-account
	// recovery retry); "" lets selection choose.
	force string
	// fallback is set once the request fell back to the fallback group.
	fallback bool
	// fallbackInScope: the key's scope holds a fallback account (as choose
	// last read the accounts).
	fallbackInScope bool
	// resolved memoises fullInput for previous_response_id resolvedFor.
	resolvedFor string
	resolved    []json.RawMessage
	resolveErr  error
	// turnStateReleased: the account that issued turnState failed this
	// request before any work; the state binds nothing any more (and is
	// not forwarded).
	turnStateReleased bool
}

// dropTurnStateOf releases the request from its turn state when the account
// that issued it just failed this request before any work (seed 002's "no
// work observed"): nothing of the turn lives on that account that another
// one needs, and keeping the state hard would fail the request closed while
// other accounts have room.
func (c *call) dropTurnStateOf(s *Server, account string) {
	if c.turnState == "" {
		return
	}
	if o, ok := s.owners.get(turnStateKey(c.turnState)); ok && o.account == account {
		c.turnStateReleased = true
		c.header = c.header.Clone()
		c.header.Del(wire.HeaderTurnState)
	}
}

// markRecovery names the request's last recovery action on its answer.
func (c *call) markRecovery(h http.Header) {
	if c.recovery != "" {
		h.Set(RecoveryHeader, c.recovery)
	}
}

func (c *call) contKey() continuity.Key {
	return continuity.Key{Thread: string(c.ident.Key), Scope: c.client.scope()}
}

// choice is an account chosen for one attempt, with what selection read.
type choice struct {
	sel    Selection
	prefs  Preferences
	rows   []store.Binding
	target Target
}

// choose reads accounts, bindings and hard evidence, and selects.
func (s *Server) choose(ctx context.Context, c *call, exclude map[string]bool, laneOwner string) (choice, error) {
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return choice{}, err
	}
	cands := make([]Candidate, 0, len(accounts))
	c.fallbackInScope = false
	for _, a := range accounts {
		if c.client.key.AllowsAccount(a) {
			cands = append(cands, Candidate{Account: a, InFlight: s.InFlight(a.ID)})
			c.fallbackInScope = c.fallbackInScope || isFallback(a)
		}
	}
	rows, err := s.cfg.Store.BindingsFor(ctx, store.BindingLookup{
		ClientScope: c.client.scope(), ThreadKey: string(c.ident.Key), SessionKey: string(c.ident.SessionKey),
		RawSession: c.ident.Session, RawThread: c.ident.Thread,
	})
	if err != nil {
		return choice{}, err
	}
	ev := Evidence{}
	var prefs Preferences
	for _, b := range rows {
		switch b.Kind {
		case store.BindThread:
			if b.Key == string(c.ident.Key) {
				prefs.Thread = b.AccountID
			}
		case store.BindSession:
			if b.Key != string(c.ident.Key) {
				prefs.Session = b.AccountID
			} else if prefs.Thread == "" {
				// A client without thread ids: its session key is its thread key.
				prefs.Thread = b.AccountID
			}
		case store.BindRawSession:
			ev[HardRawSession] = b.AccountID
		case store.BindRawThread:
			ev[HardRawThread] = b.AccountID
		}
	}
	if c.turnState != "" && !c.turnStateReleased {
		if o, ok := s.owners.get(turnStateKey(c.turnState)); ok && o.scope == c.client.scope() {
			ev[HardTurnState] = o.account
		}
	}
	if prev := c.fields.PreviousResponseID; prev != "" && !s.rebuildable(c) {
		// Only the account that produced it can continue from this id. When
		// continuity can rebuild the full request instead, the id binds
		// nothing: the request may move like any other.
		if o, ok := s.owners.get(responseKey(prev)); ok && o.scope == c.client.scope() {
			ev[HardPreviousResponse] = o.account
		}
	}
	if laneOwner != "" {
		ev[HardLane] = laneOwner
	}
	if snap, ok := s.conts.Lookup(c.contKey()); ok && len(snap.CiphertextOrgs) > 0 {
		prefs.Organization = snap.CiphertextOrgs[len(snap.CiphertextOrgs)-1]
	}
	var sel Selection
	if c.force != "" {
		// A recovery retry stays on its account, whatever selection would say.
		sel = Selection{AccountID: c.force, Reason: "recovery", Hard: true}
		c.force = ""
	} else {
		sel, err = Select(SelectInput{Now: s.cfg.Now(), Evidence: ev, Prefs: prefs, Candidates: cands, Exclude: exclude, Group: c.inGroup})
	}
	if err != nil {
		return choice{sel: sel, prefs: prefs, rows: rows}, err
	}
	var acct store.Account
	for _, cd := range cands {
		if cd.Account.ID == sel.AccountID {
			acct = cd.Account
		}
	}
	if acct.ID == "" {
		return choice{sel: sel, prefs: prefs, rows: rows}, &NoAccountError{Considered: len(cands)}
	}
	cred, err := s.credentials(ctx, acct)
	if err != nil {
		// This account cannot be used now (its refresh was rejected, or the
		// auth server is away): the request goes on without it.
		s.log.Warn("account credentials unavailable", "account", acct.ID, "err", err)
		exclude = withExcluded(exclude, acct.ID)
		return s.choose(ctx, c, exclude, laneOwner)
	}
	return choice{sel: sel, prefs: prefs, rows: rows, target: Target{Account: acct, Cred: cred}}, nil
}

// chooseFor selects the account for a request's next attempt, through every
// way out the rules allow: when the thread's lane (laneOwner) cannot serve,
// without it (dropLane retires it); when an unavailable owner may be retired
// (seed 003), without it; when the pool is exhausted, in the fallback group.
func (s *Server) chooseFor(ctx context.Context, c *call, exclude map[string]bool, laneOwner string, dropLane func()) (choice, error) {
	ch, err := s.choose(ctx, c, exclude, laneOwner)
	if err != nil && laneOwner != "" && !errors.As(err, new(*ConflictError)) {
		// The request moves; the new account gets the full request.
		dropLane()
		ch, err = s.choose(ctx, c, exclude, "")
	}
	if err != nil && s.retireOwner(ctx, c, ch, err, exclude) {
		ch, err = s.choose(ctx, c, exclude, "")
	}
	if err != nil && s.fallBack(c, err) {
		ch, err = s.choose(ctx, c, exclude, "")
	}
	return ch, err
}

// fullInput is the whole input behind the request: its own input, or, when
// it chains with previous_response_id, the thread's history up to that
// response plus the new items, from continuity (resolved once per request).
func (s *Server) fullInput(c *call) ([]json.RawMessage, error) {
	prev := c.fields.PreviousResponseID
	if prev == "" {
		return c.fields.Input, nil
	}
	if c.resolvedFor != prev {
		c.resolvedFor = prev
		if c.ident.Key == "" {
			c.resolved, c.resolveErr = nil, continuity.ErrUnknownResponse
		} else {
			c.resolved, c.resolveErr = s.conts.Resolve(c.contKey(), prev, c.fields.Input)
		}
	}
	return c.resolved, c.resolveErr
}

// rebuildable reports whether continuity holds the history behind the
// request's previous_response_id, so a full request can be sent anywhere.
func (s *Server) rebuildable(c *call) bool {
	if c.fields.PreviousResponseID == "" {
		return false
	}
	_, err := s.fullInput(c)
	return err == nil
}

// credentials returns an account's credentials, fresh when a TokenSource
// is configured.
func (s *Server) credentials(ctx context.Context, a store.Account) (store.Credentials, error) {
	if s.cfg.Tokens != nil {
		return s.cfg.Tokens.Token(ctx, a)
	}
	return s.cfg.Store.Credentials(ctx, a.ID)
}

// withExcluded returns exclude with id added (allocating it when nil).
func withExcluded(exclude map[string]bool, id string) map[string]bool {
	if exclude == nil {
		exclude = map[string]bool{}
	}
	exclude[id] = true
	return exclude
}

// refreshAfter401 handles an upstream 401 before any work on a ChatGPT
// account: the token is refreshed (once per account and request) and the
// same account retried, with no penalty. It reports whether to retry.
func (s *Server) refreshAfter401(ctx context.Context, c *call, t Target, o Outcome, refreshed map[string]bool) bool {
	if o.Class != ClassAuth || o.Action != ActionNext || s.cfg.Tokens == nil || t.Account.Kind != store.KindChatGPT || refreshed[t.Account.ID] {
		return false
	}
	refreshed[t.Account.ID] = true
	if _, err := s.cfg.Tokens.AfterUnauthorized(ctx, t.Account, t.Cred.AccessToken); err != nil {
		return false // rejected (the account is marked) or unreachable: move on
	}
	c.force = t.Account.ID
	return true
}

// settle records what a served request leaves behind: the binding plan,
// fresh soft rows, and the response's owner.
func (s *Server) settle(ctx context.Context, c *call, ch choice, responseID string) {
	if c.ident.Key != "" {
		plan := PlanBinding(ch.sel, ch.prefs)
		if plan.Write {
			err := s.cfg.Store.Place(ctx, store.Placement{
				ClientScope: c.client.scope(), ThreadKey: string(c.ident.Key), SessionKey: string(c.ident.SessionKey),
				SessionID: c.ident.Session, ThreadID: c.ident.Thread, AccountID: ch.target.Account.ID,
				Source: plan.Source, TTL: s.cfg.BindingTTL, SeedSession: plan.SeedSession,
			})
			if err != nil {
				s.log.Warn("write binding", "err", err)
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
	if responseID != "" {
		s.owners.put(responseKey(responseID), owner{account: ch.target.Account.ID, scope: c.client.scope()})
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
func (s *Server) penalise(ctx context.Context, accountID string, p *Penalty) {
	if p == nil {
		return
	}
	if _, err := s.cfg.Store.SetAccountStatus(ctx, accountID, p.Status, p.Reason, p.Until); err != nil {
		s.log.Warn("penalise account", "account", accountID, "err", err)
	}
}

// foldUsage records the usage windows an upstream reported in headers.
func (s *Server) foldUsage(ctx context.Context, accountID string, h http.Header) {
	s.foldLimits(ctx, accountID, wire.ParseRateLimitHeaders(h))
}

// foldLimits records reported usage windows for an account.
func (s *Server) foldLimits(ctx context.Context, accountID string, rl wire.RateLimits) {
	p, sec := usageWindow(rl.Primary), usageWindow(rl.Secondary)
	if !p.Known && !sec.Known {
		return
	}
	if err := s.cfg.Store.UpdateUsage(ctx, accountID, p, sec); err != nil {
		s.log.Warn("update usage", "account", accountID, "err", err)
	}
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

// logRequest writes the request log row and the attempt records. It runs
// after the client has its answer, on a context of its own.
func (s *Server) logRequest(c *call, rec store.RequestRecord, attempts []store.Attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec.ID, rec.ClientKeyID, rec.ThreadKey = c.id, c.client.key.ID, string(c.ident.Key)
	rec.SessionID, rec.ThreadID, rec.Transport, rec.Path = c.ident.Session, c.ident.Thread, c.transport, c.path
	rec.Model, rec.StartedAt = c.fields.Model, c.start
	rec.Duration = s.cfg.Now().Sub(c.start)
	if err := s.cfg.Store.RecordRequest(ctx, rec, attempts); err != nil {
		s.log.Warn("log request", "err", err)
	}
	outcome := "ok"
	if rec.Status >= 400 || rec.ErrorCode != "" {
		outcome = "error"
	}
	s.metrics.requests.WithLabelValues(c.transport, rec.AccountID, outcome).Inc()
	s.metrics.duration.WithLabelValues(c.transport).Observe(rec.Duration.Seconds())
	if rec.FirstEvent > 0 {
		s.metrics.firstEvent.WithLabelValues(c.transport).Observe(rec.FirstEvent.Seconds())
	}
}

// responseEnvelope reads the parts of response.created/completed/failed the
// relay needs.
type responseEnvelope struct {
	Response struct {
		ID    string      `json:"id"`
		Error *wire.Error `json:"error"`
		Usage *struct {
			InputTokens        int64 `json:"input_tokens"`
			OutputTokens       int64 `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	} `json:"response"`
}

// tracker follows one upstream stream: ids, output items, usage, terminal.
type tracker struct {
	responseID string
	output     []json.RawMessage
	input      int64
	outputTok  int64
	cached     int64
	terminal   string
	failure    *wire.Error
	failStatus int
	work       bool
	events     int
	turnState  string
	// limits are the usage windows a codex.rate_limits event reported.
	limits *wire.RateLimits
}

// semantic reports whether an event carries work the client acts on.
func semantic(typ string) bool {
	switch typ {
	case wire.EventResponseCreated, wire.EventResponseInProgress, wire.EventResponseMetadata, wire.EventRateLimits, "":
		return false
	}
	return !wire.IsTerminal(typ)
}

// observe updates the tracker from one event; only the few event types that
// carry ids, items or errors are decoded.
func (t *tracker) observe(typ string, data []byte) {
	t.events++
	switch typ {
	case wire.EventResponseCreated, wire.EventResponseCompleted, wire.EventResponseIncomplete, wire.EventResponseFailed:
		var env responseEnvelope
		if json.Unmarshal(data, &env) == nil {
			if env.Response.ID != "" {
				t.responseID = env.Response.ID
			}
			if u := env.Response.Usage; u != nil {
				t.input, t.outputTok = u.InputTokens, u.OutputTokens
				if u.InputTokensDetails != nil {
					t.cached = u.InputTokensDetails.CachedTokens
				}
			}
			if typ == wire.EventResponseFailed {
				t.failure = env.Response.Error
				if t.failure == nil {
					t.failure = &wire.Error{Type: wire.TypeServerError, Message: "response.failed"}
				}
			}
		}
	case wire.EventOutputItemDone:
		var env struct {
			Item json.RawMessage `json:"item"`
		}
		if json.Unmarshal(data, &env) == nil && len(env.Item) > 0 {
			t.output = append(t.output, env.Item)
		}
	case wire.EventError:
		if ev, ok := wire.ParseErrorEvent(data); ok {
			t.failure, t.failStatus = &ev.Error, ev.Status
		} else {
			t.failure = &wire.Error{Type: wire.TypeServerError, Message: "upstream error event"}
		}
	case wire.EventRateLimits:
		var ev wire.RateLimitsEvent
		if json.Unmarshal(data, &ev) == nil {
			rl := wire.RateLimits{}
			if p := ev.RateLimits.Primary; p != nil {
				w := p.RateLimitWindow
				rl.Primary = &w
			}
			if sw := ev.RateLimits.Secondary; sw != nil {
				w := sw.RateLimitWindow
				rl.Secondary = &w
			}
			t.limits = &rl
		}
	case wire.EventResponseMetadata:
		var env struct {
			Headers map[string]string `json:"headers"`
		}
		if json.Unmarshal(data, &env) == nil {
			if ts := env.Headers[wire.HeaderTurnState]; ts != "" {
				t.turnState = ts
			}
		}
	}
	if wire.IsTerminal(typ) {
		t.terminal = typ
	}
	if semantic(typ) {
		t.work = true
	}
}
