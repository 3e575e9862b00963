package web

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
)

// laneView is a live upstream lane as the API shows it.
type laneView struct {
	Kind      string    `json:"kind"` // direct or bridge
	AccountID string    `json:"account_id"`
	SessionID string    `json:"session_id"`
	ThreadID  string    `json:"thread_id"`
	ThreadKey string    `json:"thread_key"`
	OpenedAt  time.Time `json:"opened_at"`
	Requests  int64     `json:"requests"`
	Replica   string    `json:"replica"`
}

func viewLane(l relay.LaneInfo) laneView {
	return laneView{Kind: l.Kind, AccountID: l.AccountID, SessionID: l.SessionID, ThreadID: l.ThreadID,
		ThreadKey: l.ThreadKey, OpenedAt: l.OpenedAt.UTC(), Requests: l.Requests, Replica: l.Replica}
}

func (s *Server) listLanes(c echo.Context) error {
	lanes := s.cfg.Relay.Lanes()
	out := make([]laneView, len(lanes))
	for i, l := range lanes {
		out[i] = viewLane(l)
	}
	return c.JSON(http.StatusOK, map[string]any{"lanes": out})
}

// replicaView is one live replica as the API shows it.
type replicaView struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Address     string    `json:"address"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Lanes       int       `json:"lanes"`
	Self        bool      `json:"self"`
}

// replicaViews lists the live replicas sharing the database.
func (s *Server) replicaViews(ctx context.Context) ([]replicaView, error) {
	reps, err := s.cfg.Store.Replicas(ctx, s.cfg.Relay.ReplicaLiveSince())
	if err != nil {
		return nil, err
	}
	out := make([]replicaView, len(reps))
	for i, r := range reps {
		var lanes []json.RawMessage
		_ = json.Unmarshal(r.Lanes, &lanes)
		out[i] = replicaView{ID: r.ID, Name: r.Name, Address: r.Address, StartedAt: r.StartedAt, HeartbeatAt: r.HeartbeatAt,
			Lanes: len(lanes), Self: r.ID == s.cfg.Relay.ReplicaID()}
	}
	return out, nil
}

func (s *Server) listReplicas(c echo.Context) error {
	out, err := s.replicaViews(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"replicas": out})
}

// attemptView is one attempt's diagnostic record as the API shows it.
type attemptView struct {
	ID            string    `json:"id"`
	RequestID     string    `json:"request_id"`
	Seq           int       `json:"seq"`
	ThreadKey     string    `json:"thread_key"`
	SessionID     string    `json:"session_id"`
	ThreadID      string    `json:"thread_id"`
	AccountID     string    `json:"account_id"`
	FromAccountID string    `json:"from_account_id"`
	Transport     string    `json:"transport"`
	Class         string    `json:"class"`
	Recovery      string    `json:"recovery"`
	Action        string    `json:"action"`
	Status        int       `json:"status"`
	ErrorCode     string    `json:"error_code"`
	Detail        string    `json:"detail"`
	StartedAt     time.Time `json:"started_at"`
	EndedAt       time.Time `json:"ended_at"`
	DurationMS    int64     `json:"duration_ms"`
	FirstEventMS  *int64    `json:"first_event_ms"`
}

func optMillis(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	v := d.Milliseconds()
	return &v
}

func viewAttempt(a store.Attempt) attemptView {
	return attemptView{ID: a.ID, RequestID: a.RequestID, Seq: a.Seq, ThreadKey: a.ThreadKey, SessionID: a.SessionID,
		ThreadID: a.ThreadID, AccountID: a.AccountID, FromAccountID: a.FromAccountID, Transport: a.Transport,
		Class: a.Class, Recovery: a.Recovery, Action: a.Action, Status: a.Status, ErrorCode: a.ErrorCode,
		Detail: a.Detail, StartedAt: a.StartedAt, EndedAt: a.EndedAt, DurationMS: a.EndedAt.Sub(a.StartedAt).Milliseconds(),
		FirstEventMS: optMillis(a.FirstEvent)}
}

func (s *Server) listDiagnostics(c echo.Context) error {
	q, err := parseAttemptQuery(c)
	if err != nil {
		return err
	}
	rows, total, err := s.cfg.Store.Attempts(c.Request().Context(), q.filter())
	if err != nil {
		return err
	}
	out := make([]attemptView, len(rows))
	for i, a := range rows {
		out[i] = viewAttempt(a)
	}
	return c.JSON(http.StatusOK, map[string]any{"attempts": out, "total": total})
}

// requestView is one request-log row as the API shows it.
type requestView struct {
	ID           string    `json:"id"`
	ClientKeyID  string    `json:"client_key_id"`
	ThreadKey    string    `json:"thread_key"`
	SessionID    string    `json:"session_id"`
	ThreadID     string    `json:"thread_id"`
	AccountID    string    `json:"account_id"`
	Transport    string    `json:"transport"`
	Path         string    `json:"path"`
	Model        string    `json:"model"`
	Status       int       `json:"status"`
	ErrorCode    string    `json:"error_code"`
	Recovery     string    `json:"recovery"`
	StartedAt    time.Time `json:"started_at"`
	FirstEventMS *int64    `json:"first_event_ms"`
	DurationMS   int64     `json:"duration_ms"`
	InputTokens  int64     `json:"input_tokens"`
	OutputTokens int64     `json:"output_tokens"`
	CachedTokens int64     `json:"cached_tokens"`
	// Usage beyond the three counts: see store.RequestRecord.
	ModelServed     string  `json:"model_served"`
	ServiceTier     string  `json:"service_tier"`
	ReasoningTokens int64   `json:"reasoning_tokens"`
	TotalTokens     int64   `json:"total_tokens"`
	CostUSD         float64 `json:"cost_usd"`
	Unpriced        bool    `json:"unpriced"`
	Charged         bool    `json:"charged"`
	FirstOutputMS   *int64  `json:"first_output_ms"`
	Policy          string  `json:"policy"`
	// Route names what the request was (responses, images.generations,
	// files.create, responses.get, ...); ObjectID the object it named or
	// created, if any.
	Route    string `json:"route"`
	ObjectID string `json:"object_id,omitempty"`
}

func viewRequest(r store.RequestRecord) requestView {
	v := requestView{ID: r.ID, ClientKeyID: r.ClientKeyID, ThreadKey: r.ThreadKey, SessionID: r.SessionID,
		ThreadID: r.ThreadID, AccountID: r.AccountID, Transport: r.Transport, Path: r.Path, Model: r.Model,
		Status: r.Status, ErrorCode: r.ErrorCode, Recovery: r.Recovery, StartedAt: r.StartedAt,
		FirstEventMS: optMillis(r.FirstEvent), DurationMS: r.Duration.Milliseconds(), InputTokens: r.InputTokens,
		OutputTokens: r.OutputTokens, CachedTokens: r.CachedTokens}
	v.ModelServed, v.ServiceTier, v.ReasoningTokens, v.TotalTokens = r.ModelServed, r.ServiceTier, r.ReasoningTokens, r.TotalTokens
	v.CostUSD, v.Charged, v.FirstOutputMS, v.Policy = float64(r.CostNanos)/1e9, r.Charged, optMillis(r.FirstOutput), r.Policy
	v.Unpriced = r.Unpriced
	v.Route, v.ObjectID = cmp.Or(r.Route, "responses"), r.ObjectID
	return v
}

func (s *Server) listRequests(c echo.Context) error {
	q, err := parseRequestQuery(c)
	if err != nil {
		return err
	}
	rows, total, err := s.cfg.Store.Requests(c.Request().Context(), q.filter())
	if err != nil {
		return err
	}
	out := make([]requestView, len(rows))
	for i, r := range rows {
		out[i] = viewRequest(r)
	}
	return c.JSON(http.StatusOK, map[string]any{"requests": out, "total": total})
}
