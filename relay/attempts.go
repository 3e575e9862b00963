package relay

import (
	"cmp"
	"context"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// attempts serves one request, whatever its transport: choose an account,
// attempt the request there, decide (once, in decide.go) what the attempt's
// end means, and act on it: the client has its answer, or the next plan
// goes to the next attempt, within one budget (Config.MaxAttempts). Every
// attempt is recorded, and the request logged once, after the client has
// its answer.
func (s *Server) attempts(ctx context.Context, r *request, cl clientStream) {
	t := s.newTries(r)
	log := requestLog{s: s, r: r}
	defer log.write()
	if r.client.keyed {
		// A key's requests are its request log rows, counted where the
		// request is served: a request forwarded to the replica holding its
		// thread's lane counts there, once. Other routes (/models, the goal
		// routes) and a WebSocket's handshake are no request.
		s.countKeyUse(r.client.key.ID)
	}
	answer := func(f *failure, class attemptClass) {
		log.answered(f, class)
		if class == classCancelled || ctx.Err() != nil {
			return // nobody is listening
		}
		_ = cl.fail(&head{recovery: t.plan.recovery, limits: r.limits}, f)
	}
	reserved, err := s.admitBudget(ctx, r)
	r.reserved, log.rec.Reserved = reserved, reserved // settled (deleted) with the request's log row
	r.limits = s.limitsFor(ctx, r)
	if err == nil {
		// Files the input references live on one account: hard evidence.
		r.objectOwner, err = s.referencedAccount(ctx, r.client.scope(), r.body)
	}
	if err == nil && r.objectOwner == "" {
		err = s.storedPrevious(ctx, r)
	}
	if err != nil {
		f, class := failureFor(err, s.cfg.Now())
		log.attempt(1, "", "", class, "", actionTerminal, f.status, f.code(), err.Error(), s.cfg.Now(), 0)
		answer(f, class)
		return
	}
	for {
		lane := ""
		if k, ok := cl.lane(r); ok {
			lane, _ = s.pool.Owner(k)
		}
		ch, next, err := s.chooseFor(ctx, r, t.plan, t.exclude, lane)
		t.plan = next
		if err != nil {
			now := s.cfg.Now()
			st := t.decide(ended{refused: err, fallbackInScope: ch.fallbackInScope, now: now})
			if st.next == stepAttempt {
				continue // the fallback group: choose again there
			}
			if st.class == classFailed {
				s.log.Error("select account", "request", r.id, "err", err)
			}
			if st.record {
				log.attempt(t.n+1, "", t.prev, st.class, "", st.action, st.failure.status, st.failure.code(), err.Error(), now, 0)
			}
			answer(st.answer, st.answerClass)
			return
		}
		acct := ch.target.Account.ID
		if t.prev != "" && t.prev != acct && t.plan.moveIsFailover() {
			t.plan.recovery = RecoveryFailover
		}
		p := t.plan
		started := s.cfg.Now()
		res := s.attempt(ctx, r, p, &ch, cl)
		t.n++
		e := ended{account: acct, facts: res.facts, sentFull: res.sentFull, gone: ctx.Err() != nil,
			canRefresh: s.cfg.Tokens != nil && ch.target.Account.Kind == store.KindChatGPT}
		st := t.decide(e)
		if st.next == stepRefresh {
			e.refresh = s.refreshToken(ctx, ch.target)
			st = t.decide(e)
		}
		status, code := record(res.facts, st.failure)
		s.metrics.attempts.WithLabelValues(acct, string(st.class), string(st.action)).Inc()
		log.attempt(t.n, acct, t.prev, st.class, st.recovery, st.action, status, code, res.detail, started, res.firstEvent)
		log.served(acct, p.recovery, res, status, code)
		s.penalise(context.WithoutCancel(ctx), acct, st.penalty)
		switch {
		case unreachableSign(st.class, res.facts):
			s.unreachable.mark(acct, s.cfg.Now().Add(unreachableFor))
		case st.next == stepDone:
			s.unreachable.clear(acct)
		}
		t.prev = acct
		switch {
		case st.next == stepDone:
			log.done()
			return
		case st.next == stepEnd && st.answer != nil:
			answer(st.answer, st.answerClass)
			return
		case st.next == stepEnd:
			log.ended(st.answerClass)
			return
		}
	}
}

// turnStateOwner is the account that issued the client's turn state ("":
// none known).
func (s *Server) turnStateOwner(r *request) string {
	if r.turnState == "" {
		return ""
	}
	o, _ := s.owners.get(turnStateKey(r.turnState))
	return o.account
}

// refreshToken refreshes a ChatGPT account's token after the upstream
// answered 401 before any work, as the decision step asked. A refresh
// that is refused (the token source marks the account) or cannot be made
// now is refreshRefused: the request moves on.
func (s *Server) refreshToken(ctx context.Context, t target) refreshResult {
	if _, err := s.cfg.Tokens.AfterUnauthorized(ctx, t.Account, t.Cred.AccessToken); err != nil {
		return refreshRefused
	}
	return refreshDone
}

// requestLog gathers one request's log row and attempt records, written
// together when the request ends.
type requestLog struct {
	s        *Server
	r        *request
	rec      store.RequestRecord
	attempts []store.Attempt
	// last is the latest attempt: what it used is the request's use.
	last *attemptResult
	// status and code are the latest attempt's record (see record): the
	// request's, when the client has its terminal event already.
	status int
	code   string
	// object: the request is on an object route (objects.go), counted
	// under its route, not as a Responses request.
	object bool
}

// attempt records one attempt (account "" for a request selection refused).
// Every attempt of a compaction says so first in its detail, with how the
// request was recognised as one. The detail holds upstream messages:
// credential-shaped text in them is masked.
func (l *requestLog) attempt(seq int, account, from string, class attemptClass, recovery string, action nextAction, status int, code, detail string, started time.Time, first time.Duration) {
	r := l.r
	if r.compaction != "" {
		detail = joinDetail("compaction ("+r.compaction+")", detail)
	}
	l.attempts = append(l.attempts, store.Attempt{RequestID: r.id, Seq: seq, ThreadKey: string(r.ident.Key), SessionID: r.ident.Session,
		ThreadID: r.ident.Thread, AccountID: account, FromAccountID: from, Transport: r.transport, Class: string(class),
		Recovery: recovery, Action: string(action), Status: status, ErrorCode: code, Detail: wire.MaskSecretsString(detail),
		StartedAt: started, EndedAt: l.s.cfg.Now(), FirstEvent: first})
}

// served notes the account that served the latest attempt, and the
// status and code its record shows.
func (l *requestLog) served(account, recovery string, res attemptResult, status int, code string) {
	l.rec.AccountID, l.rec.Recovery, l.rec.FirstEvent, l.rec.FirstOutput = account, recovery, res.firstEvent, res.firstOutput
	l.last, l.status, l.code = &res, status, code
}

// done notes a request answered in full.
func (l *requestLog) done() { l.rec.Status = http.StatusOK }

// requestLogCloseGrace is how long Close keeps retrying request log rows
// the database refuses before it gives them up.
const requestLogCloseGrace = 15 * time.Second

// newRequestLog returns the writer of the request log: up to 256 rows in a
// transaction, at most 100,000 waiting (about 100 MB at worst: a row with
// its attempts is under 1 KB).
func (s *Server) newRequestLog() *writeBehind[store.LoggedRequest] {
	return &writeBehind[store.LoggedRequest]{batch: 256, max: 100_000, inline: true, closeNow: make(chan struct{}),
		write: s.writeRequestLog,
		dropped: func(n int) {
			s.metrics.logDropped.Add(float64(n))
			s.log.Error("request log rows dropped: the database did not take them in time", "rows", n)
		},
	}
}

// writeRequestLog writes a batch of request log rows in one transaction
// and returns those to try again. When the batch fails, each row is tried
// alone (see written.sort): rows the deadline left unwritten are kept; if
// some go through, the database takes writes and the ones it refused are
// refused for what they hold, and dropped (logged); if none do, the
// database is away, and all are kept.
func (s *Server) writeRequestLog(batch []store.LoggedRequest) []store.LoggedRequest {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.cfg.Store.RecordRequests(ctx, batch)
	if err == nil {
		return nil
	}
	if len(batch) == 1 {
		s.log.Warn("log request: kept for a retry", "err", err)
		return batch
	}
	w := writeEach(ctx, batch, func(ctx context.Context, r store.LoggedRequest) error {
		return s.cfg.Store.RecordRequests(ctx, []store.LoggedRequest{r})
	})
	retry, refused := w.sort()
	for i, r := range refused {
		s.log.Error("log request: the database refused the row", "request", r.Request.ID, "err", w.errs[i])
	}
	s.metrics.logDropped.Add(float64(len(refused)))
	if len(retry) > 0 {
		s.log.Warn("log request: rows kept for a retry", "rows", len(retry), "err", err)
	}
	return retry
}

// answered notes a request that ended with a failure sent to the client.
func (l *requestLog) answered(f *failure, class attemptClass) {
	l.rec.Status, l.rec.ErrorCode = f.status, cmp.Or(f.code(), string(class))
	if class == classCancelled {
		l.rec.Status, l.rec.ErrorCode = statusClientClosed, string(classCancelled)
	}
}

// ended notes a request whose client has its terminal event already (sent
// within the stream), or went away.
func (l *requestLog) ended(class attemptClass) {
	switch class {
	case classCancelled, classClientStalled:
		l.rec.Status, l.rec.ErrorCode = statusClientClosed, string(class)
	default:
		l.rec.Status, l.rec.ErrorCode = cmp.Or(l.status, http.StatusBadGateway), cmp.Or(l.code, string(class))
	}
}

// write queues the request log row and the attempt records, after the
// client has its answer (s.requestLog writes them, in batches). The row
// carries what the request used: its latest attempt's, the only one that
// can have done work (an attempt that did work is never followed by
// another). Writing it settles the request's budget reservation, once.
func (l *requestLog) write() {
	s, r, rec := l.s, l.r, l.rec
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec.ID, rec.ClientKeyID, rec.ThreadKey = r.id, r.client.key.ID, string(r.ident.Key)
	rec.SessionID, rec.ThreadID, rec.Transport, rec.Path = r.ident.Session, r.ident.Thread, r.transport, r.path
	rec.Model, rec.StartedAt, rec.Policy = r.asked, r.start, r.policy
	rec.Route = cmp.Or(rec.Route, r.route())
	rec.Duration = s.cfg.Now().Sub(r.start)
	if l.last != nil {
		s.charge(ctx, r, &rec, &l.last.tr, l.last.tr.work || l.last.tr.usage)
	}
	for i := range l.attempts {
		if l.attempts[i].ID == "" {
			// Its own id now: a retried write must not add it twice.
			l.attempts[i].ID = store.NewID("att", l.attempts[i].StartedAt)
		}
	}
	s.requestLog.add(store.LoggedRequest{Request: rec, Attempts: l.attempts})
	if l.object {
		s.metrics.objects.WithLabelValues(rec.Route, statusClass(rec.Status)).Inc()
		return
	}
	outcome := "ok"
	switch {
	case rec.Status == statusClientClosed:
		outcome = "cancelled"
	case rec.Status >= 400 || rec.ErrorCode != "":
		outcome = "error"
	}
	s.metrics.requests.WithLabelValues(r.transport, rec.AccountID, outcome).Inc()
	s.metrics.duration.WithLabelValues(r.transport).Observe(rec.Duration.Seconds())
	if rec.FirstEvent > 0 {
		s.metrics.firstEvent.WithLabelValues(r.transport).Observe(rec.FirstEvent.Seconds())
	}
}
