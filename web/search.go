package web

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/web/ui"
)

// The header's search box: GET /admin/search?q= finds a thread or session
// id, a thread key, a client key by id or name, an account by id or label,
// a request id. One match is redirected to its page; several are listed.

// minSearchPrefix is the shortest query matched as the beginning of ids
// and names; a shorter one matches only whole ones.
const minSearchPrefix = 6

// searchIndex is what a search looks in: the accounts and client keys, and
// the ids of the bindings and the request log (store.FindIDs).
type searchIndex struct {
	accounts []store.Account
	keys     []store.ClientKey
	find     func(ctx context.Context, q string, prefix bool) (store.FoundIDs, error)
}

// resolve finds what q names: the exact matches of ids and names (names
// ignoring case), or when there are none and q has at least
// minSearchPrefix characters, the ids and names q begins. prefix reports
// hits of the second kind.
func (ix searchIndex) resolve(ctx context.Context, q string) (hits []ui.SearchHit, prefix bool, err error) {
	q = strings.TrimSpace(q)
	if q == "" {
		return nil, false, nil
	}
	if hits, err = ix.match(ctx, q, false); err != nil || len(hits) > 0 || utf8.RuneCountInString(q) < minSearchPrefix {
		return hits, false, err
	}
	hits, err = ix.match(ctx, q, true)
	return hits, len(hits) > 0, err
}

// match lists what q matches, exactly or as a prefix, in a fixed order:
// requests, threads, sessions (each by id), client keys, accounts (each by
// name).
func (ix searchIndex) match(ctx context.Context, q string, prefix bool) ([]ui.SearchHit, error) {
	found, err := ix.find(ctx, q, prefix)
	if err != nil {
		return nil, err
	}
	is := func(s string) bool { return s == q || prefix && strings.HasPrefix(s, q) }
	lower := strings.ToLower(q)
	named := func(s string) bool {
		return strings.EqualFold(s, q) || prefix && strings.HasPrefix(strings.ToLower(s), lower)
	}
	var hits []ui.SearchHit
	for _, id := range found.Requests {
		hits = append(hits, ui.SearchHit{Kind: "request", Name: id, ID: id, URL: requestURL(id)})
	}
	// Codex gives a root thread its session's id: the two are one find,
	// shown as the session's bindings, the thread's among them.
	sessions := map[string]store.FoundID{}
	for _, f := range found.Sessions {
		sessions[f.ID] = f
	}
	for _, t := range found.Threads {
		if sf, ok := sessions[t.ID]; ok {
			delete(sessions, t.ID)
			h := idHit("session", store.FoundID{ID: t.ID, Bound: t.Bound || sf.Bound})
			h.Kind, h.Note = "thread", "a root thread, with its session of the same id: "+h.Note
			hits = append(hits, h)
			continue
		}
		hits = append(hits, idHit("thread", t))
	}
	for _, f := range found.Sessions {
		if _, ok := sessions[f.ID]; ok {
			hits = append(hits, idHit("session", f))
		}
	}
	keys := slices.Clone(ix.keys)
	slices.SortFunc(keys, func(a, b store.ClientKey) int {
		return cmp.Or(cmp.Compare(strings.ToLower(a.Name), strings.ToLower(b.Name)), cmp.Compare(a.ID, b.ID))
	})
	accounts := slices.Clone(ix.accounts)
	slices.SortFunc(accounts, func(a, b store.Account) int {
		return cmp.Or(cmp.Compare(strings.ToLower(a.Label), strings.ToLower(b.Label)), cmp.Compare(a.ID, b.ID))
	})
	for _, k := range keys {
		if is(k.ID) || named(k.Name) {
			note := "client key"
			if !k.RevokedAt.IsZero() {
				note = "revoked client key"
			}
			hits = append(hits, ui.SearchHit{Kind: "client key", Name: k.Name, ID: k.ID, Note: note, URL: keyURL(k.ID)})
		}
	}
	for _, a := range accounts {
		if is(a.ID) || named(a.Label) {
			hits = append(hits, ui.SearchHit{Kind: "account", Name: a.Label, ID: a.ID, Note: "its page", URL: accountURL(a.ID)})
		}
	}
	return hits, nil
}

// idHit is a thread or session found: where it is placed when a binding
// holds it, else its requests.
func idHit(kind string, f store.FoundID) ui.SearchHit {
	q := url.Values{kind: {f.ID}}.Encode() // the Bindings and Requests pages filter by ?thread= and ?session=
	h := ui.SearchHit{Kind: kind, Name: f.ID, ID: f.ID, Note: "where it is placed", URL: "/admin/bindings?" + q}
	if !f.Bound {
		h.Note, h.URL = "no binding now: its requests", "/admin/requests?"+q
	}
	return h
}

func (s *Server) searchPage(c echo.Context) error {
	ctx := c.Request().Context()
	q := query(c, "q")
	n, err := s.names(ctx)
	if err != nil {
		return err
	}
	ix := searchIndex{accounts: n.accounts, keys: n.keys, find: s.cfg.Store.FindIDs}
	hits, prefix, err := ix.resolve(ctx, q)
	if err != nil {
		return err
	}
	if len(hits) == 1 {
		return c.Redirect(http.StatusSeeOther, hits[0].URL)
	}
	f := s.frame(c, "", "Search")
	f.Intro, f.Search = "search", q
	p := ui.SearchResults{Query: q, Prefix: prefix, Hits: hits, Short: len(hits) == 0 && utf8.RuneCountInString(q) < minSearchPrefix}
	return s.render(c, http.StatusOK, ui.SearchPage(f, p))
}
