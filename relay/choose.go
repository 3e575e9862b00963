package relay

import (
	"context"

	"github.com/codexrelay/codex-relay/internal/store"
)

// choice is an account chosen for one attempt, with what selection read.
type choice struct {
	sel    selection
	prefs  preferences
	rows   []store.Binding
	target target
	// fallbackInScope: the key's scope holds an account of the fallback
	// group (as the accounts read for this choice said).
	fallbackInScope bool
	// claim counts the request in flight on the selected account from the
	// moment it was selected (see choose); release ends it.
	claim func()
}

// release ends the choice's in-flight count.
func (ch *choice) release() {
	if ch.claim != nil {
		ch.claim()
		ch.claim = nil
	}
}

// bindingLookup names the binding rows that bear on r.
func bindingLookup(r *request) store.BindingLookup {
	return store.BindingLookup{
		ClientScope: r.client.scope(), ThreadKey: string(r.ident.Key), SessionKey: string(r.ident.SessionKey),
		RawSession: r.ident.Session, RawThread: r.ident.Thread,
	}
}

// readBindingsAhead starts reading r's bindings, for its first choice to
// take (see bindingsOf), while the request waits for something else: a
// new thread's lane lease and its bindings are then one round trip's
// wait, not two. The read ends with ctx, or on its own.
func (s *Server) readBindingsAhead(ctx context.Context, r *request) {
	a := &bindingsRead{done: make(chan struct{})}
	r.bindingsAhead = a
	go func() {
		defer close(a.done)
		a.rows, a.err = s.cfg.Store.BindingsFor(ctx, bindingLookup(r))
	}()
}

// bindingsOf is r's bindings: those read ahead for its first choice, or
// read now.
func (s *Server) bindingsOf(ctx context.Context, r *request) ([]store.Binding, error) {
	if a := r.bindingsAhead; a != nil {
		r.bindingsAhead = nil
		select {
		case <-a.done:
			return a.rows, a.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.cfg.Store.BindingsFor(ctx, bindingLookup(r))
}

// choose reads the accounts in the client's scope, the thread's binding
// rows and the evidence the request presents, and selects the account for
// p's next attempt. An account whose credentials cannot be had now (its
// refresh was rejected, the auth server is away) is passed over.
func (s *Server) choose(ctx context.Context, r *request, p plan, exclude map[string]bool, lane string) (choice, error) {
	if err := s.cfg.Store.WritesRefused(); err != nil {
		// Reads may still work, but what the request leaves (its log row,
		// binding and charge) could not be written.
		return choice{}, storeUnavailable("write", err)
	}
	accounts, err := s.cfg.Store.Accounts(ctx)
	if err != nil {
		return choice{}, storeUnavailable("read accounts", err)
	}
	var ch choice
	cands := make([]candidate, 0, len(accounts))
	for _, a := range accounts {
		if r.client.key.AllowsAccount(a) {
			cands = append(cands, candidate{Account: a, Unreachable: s.unreachable.has(a.ID, s.cfg.Now())})
			ch.fallbackInScope = ch.fallbackInScope || isFallback(a)
		}
	}
	ch.rows, err = s.bindingsOf(ctx, r)
	if err != nil {
		return choice{}, storeUnavailable("read bindings", err)
	}
	owner, prefs, err := weighEvidence(s.evidenceOf(r, p, ch.rows, lane))
	ch.prefs = prefs
	if err != nil {
		return ch, err
	}
	group := p.inGroup
	if r.compaction != "" {
		group = s.compactionPlace(r, prefs, cands).group(group)
	}
	for {
		if ch.sel, ch.claim, err = s.selectAndClaim(p, selectInput{Now: s.cfg.Now(), Owner: owner, Prefs: prefs, Candidates: cands, Exclude: exclude, Group: group}); err != nil {
			return ch, err
		}
		var acct store.Account
		for _, cd := range cands {
			if cd.Account.ID == ch.sel.AccountID {
				acct = cd.Account
			}
		}
		if acct.ID == "" {
			ch.release()
			return ch, &noAccountError{Considered: len(cands)}
		}
		cred, err := s.credentials(ctx, acct)
		if err == nil {
			ch.target = target{Account: acct, Cred: cred}
			return ch, nil
		}
		ch.release()
		// This account cannot be used now: the request goes on without it.
		s.log.Warn("account credentials unavailable", "account", acct.ID, "err", err)
		if p.force != "" {
			return ch, &noAccountError{Considered: len(cands)}
		}
		exclude[acct.ID] = true
	}
}

// selectAndClaim selects p's account from in, each candidate's load read
// afresh, and counts the request in flight there at once (claim ends
// that), all under s.balancing: selections made at the same instant see
// each other's claims, so a burst of new threads spreads over the accounts
// instead of all reading the same loads and landing on one.
func (s *Server) selectAndClaim(p plan, in selectInput) (selection, func(), error) {
	s.balancing.Lock()
	defer s.balancing.Unlock()
	if p.force != "" {
		// A recovery retry stays on its account, whatever selection would say.
		return selection{AccountID: p.force, Reason: reasonRecovery, Hard: true}, s.inFlight(p.force), nil
	}
	for i := range in.Candidates {
		in.Candidates[i].InFlight = s.InFlight(in.Candidates[i].Account.ID)
	}
	sel, err := selectAccount(in)
	if err != nil {
		return sel, nil, err
	}
	return sel, s.inFlight(sel.AccountID), nil
}

// evidenceOf reads what weighEvidence decides on: who issued the client's
// turn state, who alone can continue its previous_response_id, the lane's
// account, and the organisation of the thread's ciphertext.
func (s *Server) evidenceOf(r *request, p plan, rows []store.Binding, lane string) evidenceInput {
	in := evidenceInput{rows: rows, ident: r.ident, lane: lane, objectOwner: r.objectOwner}
	if r.turnState != "" && !p.released {
		if o, ok := s.owners.get(turnStateKey(r.turnState)); ok && o.scope == r.client.scope() {
			in.turnStateOwner = o.account
		}
	}
	if prev := r.fields.PreviousResponseID; prev != "" && !r.rebuildable() {
		// Only the account that produced it can continue from this id. When
		// continuity can rebuild the full request instead, the id binds
		// nothing: the request may move like any other.
		if o, ok := s.owners.get(responseKey(prev)); ok && o.scope == r.client.scope() {
			in.prevOwner = o.account
		}
	}
	if snap, ok := s.conts.Lookup(r.contKey()); ok && len(snap.CiphertextOrgs) > 0 {
		in.organization = snap.CiphertextOrgs[len(snap.CiphertextOrgs)-1]
	}
	return in
}

// chooseFor selects the account for p's next attempt through the way out
// selection's own rules allow: when an unavailable owner may be retired
// (seed 003), without it. A compaction that finds no account says so
// (compactionStuck). It returns the plan the retirement made. What follows
// an exhausted pool (the fallback group) is the decision step's.
func (s *Server) chooseFor(ctx context.Context, r *request, p plan, exclude map[string]bool, lane string) (choice, plan, error) {
	ch, err := s.choose(ctx, r, p, exclude, lane)
	if err == nil {
		return ch, p, nil
	}
	if next, ok := s.retireOwner(ctx, r, p, ch, err, exclude); ok {
		p = next
		if ch, err = s.choose(ctx, r, p, exclude, lane); err == nil {
			return ch, p, nil
		}
	}
	if r.compaction != "" {
		return ch, p, compactionStuck(err)
	}
	return ch, p, err
}

// credentials returns an account's credentials, fresh when a TokenSource
// is configured.
func (s *Server) credentials(ctx context.Context, a store.Account) (store.Credentials, error) {
	if s.cfg.Tokens != nil {
		return s.cfg.Tokens.Token(ctx, a)
	}
	cred, _, err := s.cfg.Store.CurrentCredentials(ctx, a.ID)
	return cred, err
}
