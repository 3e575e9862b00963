package web

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// The list queries below are shared by the API and the console: the same
// parameter names, the same validation, the same store filters.

// page is a window of a list: limit rows from offset. def is the list's
// default limit, which links leave out.
type page struct {
	Limit, Offset int
	def           int
}

// maxPageLimit is the largest page a list answers (the store's own cap).
const maxPageLimit = 1000

func parsePage(c echo.Context, defLimit int) (page, error) {
	p := page{Limit: defLimit, def: defLimit}
	if v := strings.TrimSpace(c.QueryParam("limit")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageLimit {
			return p, badField("limit", "must be a whole number from 1 to %d", maxPageLimit)
		}
		p.Limit = n
	}
	if v := strings.TrimSpace(c.QueryParam("offset")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return p, badField("offset", "must be a whole number, 0 or more")
		}
		p.Offset = n
	}
	return p, nil
}

func query(c echo.Context, name string) string { return strings.TrimSpace(c.QueryParam(name)) }

// bindingQuery is GET /bindings: filters session, thread, account,
// client_key, kind, and a page.
type bindingQuery struct {
	Session, Thread, Account, ClientKey string
	Kind                                store.BindingKind
	page
}

func parseBindingQuery(c echo.Context) (bindingQuery, error) {
	q := bindingQuery{Session: query(c, "session"), Thread: query(c, "thread"), Account: query(c, "account"),
		ClientKey: query(c, "client_key"), Kind: store.BindingKind(query(c, "kind"))}
	if q.Kind != "" && !q.Kind.Valid() {
		return q, badField("kind", "must be thread, session, raw_session or raw_thread")
	}
	var err error
	q.page, err = parsePage(c, 100)
	return q, err
}

func (q bindingQuery) filter() store.BindingFilter {
	return store.BindingFilter{SessionID: q.Session, ThreadID: q.Thread, AccountID: q.Account, ClientScope: q.ClientKey,
		Kind: q.Kind, Limit: q.Limit, Offset: q.Offset}
}

func (q bindingQuery) values() url.Values {
	return pairs("session", q.Session, "thread", q.Thread, "account", q.Account, "client_key", q.ClientKey, "kind", string(q.Kind))
}

// requestQuery is GET /requests: filters thread, session, account,
// client_key, transport, and a page.
type requestQuery struct {
	Thread, Session, Account, ClientKey, Transport string
	page
}

func parseRequestQuery(c echo.Context) (requestQuery, error) {
	q := requestQuery{Thread: query(c, "thread"), Session: query(c, "session"), Account: query(c, "account"),
		ClientKey: query(c, "client_key"), Transport: query(c, "transport")}
	if q.Transport != "" && q.Transport != "http" && q.Transport != "ws" {
		return q, badField("transport", "must be http or ws")
	}
	var err error
	q.page, err = parsePage(c, 100)
	return q, err
}

func (q requestQuery) filter() store.RequestFilter {
	return store.RequestFilter{ThreadID: q.Thread, SessionID: q.Session, AccountID: q.Account, ClientKeyID: q.ClientKey,
		Transport: q.Transport, Limit: q.Limit, Offset: q.Offset}
}

func (q requestQuery) values() url.Values {
	return pairs("thread", q.Thread, "session", q.Session, "account", q.Account, "client_key", q.ClientKey, "transport", q.Transport)
}

// attemptQuery is GET /diagnostics: filters class, recovery, account,
// request, thread, and a page of attempts.
type attemptQuery struct {
	Class, Recovery, Account, Request, Thread string
	page
}

func parseAttemptQuery(c echo.Context) (attemptQuery, error) {
	q := attemptQuery{Class: query(c, "class"), Recovery: query(c, "recovery"), Account: query(c, "account"),
		Request: query(c, "request"), Thread: query(c, "thread")}
	var err error
	q.page, err = parsePage(c, 200)
	return q, err
}

func (q attemptQuery) filter() store.AttemptFilter {
	return store.AttemptFilter{Class: q.Class, Recovery: q.Recovery, AccountID: q.Account, RequestID: q.Request,
		ThreadID: q.Thread, Limit: q.Limit, Offset: q.Offset}
}

func (q attemptQuery) values() url.Values {
	return pairs("class", q.Class, "recovery", q.Recovery, "account", q.Account, "request", q.Request, "thread", q.Thread)
}

// auditQuery is GET /audit: filters actor, action (a trailing "." matches a
// prefix), target, and a page.
type auditQuery struct {
	Actor, Action, Target string
	page
}

func parseAuditQuery(c echo.Context) (auditQuery, error) {
	q := auditQuery{Actor: query(c, "actor"), Action: query(c, "action"), Target: query(c, "target")}
	var err error
	q.page, err = parsePage(c, 100)
	return q, err
}

func (q auditQuery) filter() store.AuditFilter {
	return store.AuditFilter{Actor: q.Actor, Action: q.Action, Target: q.Target, Limit: q.Limit, Offset: q.Offset}
}

func (q auditQuery) values() url.Values {
	return pairs("actor", q.Actor, "action", q.Action, "target", q.Target)
}

// pairs builds query values from name, value pairs, leaving out blanks.
func pairs(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	return v
}
