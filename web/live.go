package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/web/ui"
)

// A live stream lasts at most liveMaxAge; the browser's EventSource then
// reconnects. Its session is checked again at every update: a stream ends
// within one LiveInterval of its session's sign-out on any replica, or of
// its idle or absolute end. Unchanged content is not resent; a comment
// keeps idle connections open through proxies.
const (
	liveMaxAge    = 5 * time.Minute
	liveKeepAlive = 15 * time.Second
)

// live streams one live region of the console over SSE: its fragment is
// rendered every LiveInterval and sent as an "update" event when it changed.
func (s *Server) live(c echo.Context) error {
	sess, _ := c.Get(sessionKey).(session)
	var fragment func(ctx context.Context) (templ.Component, error)
	switch c.Param("topic") {
	case "overview":
		fragment = func(ctx context.Context) (templ.Component, error) {
			o, err := s.overview(ctx)
			return ui.OverviewBody(o), err
		}
	case "setup":
		base := relayBaseURL(c)
		fragment = func(ctx context.Context) (templ.Component, error) {
			setup, err := s.setupView(ctx, base)
			return ui.SetupBody(setup), err
		}
	case "lanes":
		fragment = func(ctx context.Context) (templ.Component, error) {
			p, err := s.lanesView(ctx)
			return ui.LanesBody(p), err
		}
	case "diagnostics":
		q, err := parseAttemptQuery(c)
		if err != nil {
			return err
		}
		q.Offset = 0
		fragment = func(ctx context.Context) (templ.Component, error) {
			p, err := s.diagnosticsView(ctx, q)
			return ui.DiagnosticsBody(p), err
		}
	case "signin":
		// A sign-in's user code is the admin's, as its page is.
		if err := checkRole(c, roles.Admin); err != nil {
			return err
		}
		si, ok := s.signIns.get(c.QueryParam("id"))
		if !ok {
			return echo.ErrNotFound
		}
		token := s.sessions.csrf(purposeSession, sess) // for its cancel form
		fragment = func(context.Context) (templ.Component, error) {
			return ui.SignInBody(s.signInView(si, s.cfg.Now()), token), nil
		}
	default:
		return echo.ErrNotFound
	}

	ctx := c.Request().Context()
	w := c.Response()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte("retry: 5000\n\n")); err != nil {
		return nil
	}
	w.Flush()

	var last [sha256.Size]byte
	lastWrite := time.Now()
	tick := time.NewTicker(s.cfg.LiveInterval)
	defer tick.Stop()
	end := time.NewTimer(liveMaxAge)
	defer end.Stop()
	for {
		comp, err := fragment(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("live view", "topic", c.Param("topic"), "err", err)
			}
			return nil // the response is committed; the browser retries
		}
		var buf bytes.Buffer
		if err := comp.Render(ctx, &buf); err != nil {
			s.log.Warn("live view render", "topic", c.Param("topic"), "err", err)
			return nil
		}
		var msg []byte
		if sum := sha256.Sum256(buf.Bytes()); sum != last {
			last = sum
			msg = sseEvent("update", buf.String())
		} else if time.Since(lastWrite) >= liveKeepAlive {
			msg = []byte(": keep-alive\n\n")
		}
		if msg != nil {
			if _, err := w.Write(msg); err != nil {
				return nil // the client went away
			}
			w.Flush()
			lastWrite = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-end.C:
			return nil
		case <-tick.C:
		}
		if !s.sessions.stillStands(ctx, sess) {
			return nil // signed out, idle or expired: the browser's retry goes to the login page
		}
		if p, ok := s.sessionPrincipal(ctx, sess); !ok || p.Role != principalOf(c).Role {
			return nil // its person disabled, or their token revoked, or their role changed
		}
	}
}

// sseEvent encodes one server-sent event; each line of data gets its own
// data field, as the format requires.
func sseEvent(name, data string) []byte {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteByte('\n')
	for _, line := range strings.Split(strings.ReplaceAll(data, "\r", ""), "\n") {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}
