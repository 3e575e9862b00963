package relay

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// attempts serves one request, whatever its transport: it selects an
// account, attempts the request there, classifies how the attempt ended
// (once), and then either the client has its answer or the next plan goes to
// the next attempt, within one budget (Config.MaxAttempts). When every
// account failed, the client gets the first failure. Every attempt is
// recorded, and the request logged once, after the client has its answer.
func (s *Server) attempts(ctx context.Context, r *request, cl clientStream) {
	var (
		p         = r.firstPlan()
		exclude   = map[string]bool{}
		cipher    = newCiphertextRecovery(!s.cfg.DisableRecovery)
		refreshed = map[string]bool{} // accounts whose token this request refreshed
		first     *failure            // the first account failure: the answer when every account failed
		prev      string              // the previous attempt's account
		log       = requestLog{s: s, r: r}
	)
	defer log.write()
	answer := func(f *failure, class attemptClass) {
		log.answered(f, class)
		if class == classCancelled || ctx.Err() != nil {
			return // nobody is listening
		}
		_ = cl.fail(&head{recovery: p.recovery}, f)
	}
	reserved, err := s.admitBudget(ctx, r)
	r.reserved, log.rec.Reserved = reserved, reserved // settled (deleted) with the request's log row
	if err != nil {
		f, class := failureFor(err, s.cfg.Now())
		log.attempt(1, "", "", class, "", actionTerminal, f.status, f.code(), err.Error(), s.cfg.Now(), 0)
		answer(f, class)
		return
	}
	for n := 1; ; n++ {
		lane := ""
		if k, ok := cl.lane(r); ok {
			lane, _ = s.pool.Owner(k)
		}
		ch, next, err := s.chooseFor(ctx, r, p, exclude, lane)
		p = next
		if err != nil {
			var none *noAccountError
			if first != nil && errors.As(err, &none) && none.EarliestReset.IsZero() {
				answer(first, log.firstClass) // every account failed this request
				return
			}
			f, class := failureFor(err, s.cfg.Now())
			if class == classFailed {
				s.log.Error("select account", "request", r.id, "err", err)
			}
			log.attempt(n, "", prev, class, "", actionTerminal, f.status, f.code(), err.Error(), s.cfg.Now(), 0)
			answer(f, class)
			return
		}
		acct := ch.target.Account.ID
		if prev != "" && prev != acct && p.moveIsFailover() {
			p.recovery = RecoveryFailover
		}
		started := s.cfg.Now()
		res := s.attempt(ctx, r, p, &ch, cl)
		if res.facts.Status == http.StatusUnauthorized && !res.facts.Committed {
			res.facts.Refreshed = s.refreshAfter401(ctx, ch.target, refreshed)
		}
		out := classify(res.facts)
		if out.Class == classCancelled || out.Class == classClientStalled {
			// The client went away: the attempt is recorded as closed by
			// the client, whatever the upstream said after it left.
			res.status = statusClientClosed
		}
		s.metrics.attempts.WithLabelValues(acct, string(out.Class), string(out.Action)).Inc()
		log.attempt(n, acct, prev, out.Class, cmp.Or(out.Recovery, p.recovery), out.Action, res.status, res.code, res.detail, started, res.firstEvent)
		log.served(acct, p.recovery, res)
		s.penalise(context.WithoutCancel(ctx), acct, out.Penalty)
		switch {
		case unreachableSign(out.Class, res.facts):
			s.unreachable.mark(acct, s.cfg.Now().Add(unreachableFor))
		case out.Action == actionDone:
			s.unreachable.clear(acct)
		}
		prev = acct
		switch out.Action {
		case actionDone:
			log.done()
			return
		case actionTerminal:
			if out.Class == classCiphertext && res.fail != nil {
				next, step := cipher.next(p, acct, res.fail, res.facts.Status, res.facts.Committed, ctx.Err() != nil,
					res.sentFull, r.fields.Conversation, s.cfg.MaxAttempts-n)
				if step == stepNextAccount {
					exclude[acct] = true
					if first == nil {
						// If no account accepts, the client gets the first rejection.
						first, log.firstClass = cipher.first, classCiphertext
					}
				}
				if step != stepTerminal {
					p = next
					continue
				}
				if cipher.first != nil {
					res.fail = cipher.first // no account accepted: the client gets the first rejection
				}
			}
			if res.fail != nil {
				answer(res.fail, out.Class)
			} else {
				log.ended(res, out.Class)
			}
			return
		case actionSame:
			p = p.sameAccount(acct)
		case actionNext:
			if first == nil && res.fail != nil {
				first, log.firstClass = res.fail, out.Class
			}
			exclude[acct] = true
			p = p.afterAccountFailed(s.turnStateOwner(r), acct)
		}
		if ctx.Err() != nil {
			log.ended(res, classCancelled)
			return
		}
		if n >= s.cfg.MaxAttempts {
			answer(cmp.Or(first, res.fail, failExhausted()), cmp.Or(log.firstClass, out.Class))
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

// refreshAfter401 refreshes a ChatGPT account's token after the upstream
// answered 401 before any work, once per account and request, and reports
// whether the same account may take the request again. A refresh that is
// refused (the token source marks the account) or cannot be made now says
// no: the request moves on.
func (s *Server) refreshAfter401(ctx context.Context, t target, refreshed map[string]bool) bool {
	if s.cfg.Tokens == nil || t.Account.Kind != store.KindChatGPT || refreshed[t.Account.ID] {
		return false
	}
	refreshed[t.Account.ID] = true
	_, err := s.cfg.Tokens.AfterUnauthorized(ctx, t.Account, t.Cred.AccessToken)
	return err == nil
}

// requestLog gathers one request's log row and attempt records, written
// together when the request ends.
type requestLog struct {
	s        *Server
	r        *request
	rec      store.RequestRecord
	attempts []store.Attempt
	// firstClass is the class of the first account failure (see attempts).
	firstClass attemptClass
	// last is the latest attempt: what it used is the request's use.
	last *attemptResult
}

// attempt records one attempt (account "" for a request selection refused).
// Every attempt of a compaction says so first in its detail, with how the
// request was recognised as one.
func (l *requestLog) attempt(seq int, account, from string, class attemptClass, recovery string, action nextAction, status int, code, detail string, started time.Time, first time.Duration) {
	r := l.r
	if r.compaction != "" {
		detail = joinDetail("compaction ("+r.compaction+")", detail)
	}
	l.attempts = append(l.attempts, store.Attempt{RequestID: r.id, Seq: seq, ThreadKey: string(r.ident.Key), SessionID: r.ident.Session,
		ThreadID: r.ident.Thread, AccountID: account, FromAccountID: from, Transport: r.transport, Class: string(class),
		Recovery: recovery, Action: string(action), Status: status, ErrorCode: code, Detail: detail,
		StartedAt: started, EndedAt: l.s.cfg.Now(), FirstEvent: first})
}

// served notes the account that served the latest attempt.
func (l *requestLog) served(account, recovery string, res attemptResult) {
	l.rec.AccountID, l.rec.Recovery, l.rec.FirstEvent, l.rec.FirstOutput = account, recovery, res.firstEvent, res.firstOutput
	l.last = &res
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
func (l *requestLog) ended(res attemptResult, class attemptClass) {
	switch class {
	case classCancelled, classClientStalled:
		l.rec.Status, l.rec.ErrorCode = statusClientClosed, string(class)
	default:
		l.rec.Status, l.rec.ErrorCode = cmp.Or(res.status, http.StatusBadGateway), cmp.Or(res.code, string(class))
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
