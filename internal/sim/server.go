package sim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// Server is the simulated upstream. It is an http.Handler: serve it with
// any http.Server, or start it on loopback with NewServer. All methods are
// safe for concurrent use.
type Server struct {
	// URL is the base URL ("http://127.0.0.1:port") when the server was
	// started by NewServer; empty for a bare handler from New.
	URL string

	cfg    Config          // static after New
	sealer sealer          // static after New
	mux    *http.ServeMux  // static after New
	ctx    context.Context // cancelled by Close; parent of every stream and connection
	cancel context.CancelFunc
	rec    recorder // has its own lock
	httpts *httptest.Server
	ids    atomic.Int64 // connection ids

	// handlers counts the requests in flight; Add happens under mu while
	// !closed, so Close can Wait for them.
	handlers sync.WaitGroup

	mu            sync.Mutex // guards the fields below
	closed        bool
	accounts      map[string]*accountState
	accountOrder  []string
	tokens        map[string]*tokenEntry
	refreshTokens map[string]*refreshEntry
	faults        faultSet
	goals         map[goalKey]json.RawMessage
	promptCache   map[cacheKey]int
	conns         map[*wsConn]struct{}
	// objects are the files, stored responses and realtime calls, by
	// account (see accountObjects).
	objects map[string]*accountObjects
	// analytics counts the analytics batches posted, which no relay should
	// forward.
	analytics int
	// undelivered sums, by prompt_cache_key, the usage of responses the
	// sim completed (and counted) but could not write the completion of:
	// their client had gone.
	undelivered map[string]RecordUsage
}

type goalKey struct{ account, thread string }
type cacheKey struct{ account, key string }

// maxPromptCacheEntries bounds the prompt cache model; past it the cache
// starts over (as if the upstream evicted everything).
const maxPromptCacheEntries = 10000

// New returns a Server configured by cfg, ready to serve as an http.Handler.
// Call Close when done: it ends every stream and WebSocket connection.
func New(cfg Config) (*Server, error) {
	cfg.withDefaults()
	switch cfg.WSCompression {
	case "", "pooled", "takeover", "off":
	default:
		return nil, fmt.Errorf("ws compression %q: want pooled, takeover or off", cfg.WSCompression)
	}
	secret := cfg.CipherSecret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:           cfg,
		sealer:        sealer{secret: secret},
		ctx:           ctx,
		cancel:        cancel,
		rec:           recorder{max: cfg.MaxRecords},
		accounts:      map[string]*accountState{},
		tokens:        map[string]*tokenEntry{},
		refreshTokens: map[string]*refreshEntry{},
		goals:         map[goalKey]json.RawMessage{},
		promptCache:   map[cacheKey]int{},
		conns:         map[*wsConn]struct{}{},
		objects:       map[string]*accountObjects{},
	}
	s.mux = s.routes()
	if err := s.AddAccounts(cfg.Accounts...); err != nil {
		cancel()
		return nil, err
	}
	for _, f := range cfg.Faults {
		if _, err := s.faults.add(f); err != nil {
			cancel()
			return nil, err
		}
	}
	return s, nil
}

// NewServer returns a Server started on a loopback port, like
// httptest.NewServer; its URL field holds the base URL. It panics when cfg
// is invalid, as a test helper may. Close stops it.
func NewServer(cfg Config) *Server {
	s, err := New(cfg)
	if err != nil {
		panic(fmt.Sprintf("sim: %v", err))
	}
	s.httpts = httptest.NewServer(s)
	s.URL = s.httpts.URL
	return s
}

// CodexBaseURL is the base URL of the ChatGPT Codex backend:
// {URL}/backend-api/codex (Codex calls {base}/responses).
func (s *Server) CodexBaseURL() string { return s.URL + "/backend-api/codex" }

// OpenAIBaseURL is the base URL of the OpenAI Responses API: {URL}/v1.
func (s *Server) OpenAIBaseURL() string { return s.URL + "/v1" }

// TokenURL is the OAuth token endpoint: {URL}/oauth/token.
func (s *Server) TokenURL() string { return s.URL + "/oauth/token" }

// UsageURL is the ChatGPT usage endpoint: {URL}/backend-api/wham/usage.
func (s *Server) UsageURL() string { return s.URL + "/backend-api/wham/usage" }

// ControlURL is the base of the control API: {URL}/_sim.
func (s *Server) ControlURL() string { return s.URL + controlPrefix }

// ServeHTTP serves the sim's routes. After Close it answers 503.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writeError(w, http.StatusServiceUnavailable, wire.Error{Type: wire.TypeServerError, Message: "the simulated upstream is closed"}, nil)
		return
	}
	defer s.handlers.Done()
	s.mux.ServeHTTP(w, r)
}

func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

// Close ends every stream (stalls included) and WebSocket connection, waits
// for the handlers in flight, and stops the listener NewServer started.
// Later requests are answered 503. Close is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	conns := make([]*wsConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	s.cancel()
	for _, c := range conns {
		_ = c.ws.CloseNow()
	}
	s.handlers.Wait()
	if s.httpts != nil {
		s.httpts.Close()
	}
}

// Reset forgets every record, fault, goal and object (files, stored and
// background responses, which it cancels, realtime calls), the prompt cache
// and the accounts' request and refresh counters. Accounts, tokens and open
// connections stay.
func (s *Server) Reset() {
	s.rec.clear()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.clear()
	s.goals = map[goalKey]json.RawMessage{}
	s.promptCache = map[cacheKey]int{}
	s.clearObjectsLocked()
	s.analytics = 0
	for _, st := range s.accounts {
		st.requests, st.refreshes, st.refreshesRejected = 0, 0, 0
	}
}

// Records returns copies of the records f selects, oldest first.
func (s *Server) Records(f RecordFilter) []Record { return s.rec.list(f) }

// Requests returns the records of response requests that f selects: HTTP
// POSTs to .../responses and .../responses/compact, and WebSocket messages,
// but not handshakes. They are what an upstream bills and what faults count.
func (s *Server) Requests(f RecordFilter) []Record {
	var out []Record
	for _, r := range s.rec.list(f) {
		if r.Kind != RecordHandshake && (r.Route == RouteResponses || r.Route == RouteCompact) {
			out = append(out, r)
		}
	}
	return out
}

// ClearRecords forgets every record.
func (s *Server) ClearRecords() { s.rec.clear() }

// TakeFinished removes the finished records and returns them, oldest
// first: a long run (the bench's soak) drains them as it goes, and the
// records of answers still being written stay for the next call.
func (s *Server) TakeFinished() []Record { return s.rec.takeFinished() }

// AddFault installs a fault and returns it as installed (with its ID).
func (s *Server) AddFault(f Fault) (FaultState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.add(f)
}

// Faults returns the installed faults with their counters.
func (s *Server) Faults() []FaultState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.list()
}

// RemoveFault removes one fault; it reports whether it existed.
func (s *Server) RemoveFault(id int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.remove(id)
}

// ClearFaults removes every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.clear()
}

// Goal returns the goal stored for a thread on an account, as set through
// /backend-api/codex/thread/goal/set.
func (s *Server) Goal(accountID, threadID string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.goals[goalKey{accountID, threadID}]
	return g, ok
}

// writeError writes an HTTP error answer with the error body shape and,
// when rl is given, the rate-limit headers.
func writeError(w http.ResponseWriter, status int, e wire.Error, rl *wire.RateLimits) {
	if rl != nil {
		rl.SetHeaders(w.Header())
	}
	writeJSON(w, status, wire.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
