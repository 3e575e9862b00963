package codexcli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// AppServer is one running `codex app-server`: the process Codex Desktop and
// the IDE extension start and drive with JSON-RPC over its standard input
// and output (one JSON object a line, without the "jsonrpc" member). It
// runs with the same CODEX_HOME, working directory and scrubbed environment
// as Exec, so it reads the same config.toml.
//
// Requests are sequential or concurrent as the caller likes; notifications
// are kept in arrival order until a Wait call consumes them. Requests the
// server sends to the client (approvals) are answered by the Approve
// function given to StartAppServer. Close kills the process group; the test
// that started it closes it at the latest when it ends.
type AppServer struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc // kills the process group
	stdin  io.WriteCloser
	stderr *lockedBuffer
	done   chan struct{} // closed when the reader loop ends (stdout closed)

	writeMu sync.Mutex // serialises writes to stdin

	mu       sync.Mutex
	nextID   int64                           // guarded by mu
	pending  map[int64]chan rpcMessage       // guarded by mu
	notes    []Notification                  // guarded by mu; not yet consumed by Wait
	noteSig  chan struct{}                   // guarded by mu; closed and replaced on each new notification
	served   []ServerRequest                 // guarded by mu; every request the server sent
	approve  func(ServerRequest) (any, bool) // static after start
	closeOne sync.Once
}

// Notification is one JSON-RPC notification from the app-server.
type Notification struct {
	Method string
	Params json.RawMessage
}

// ServerRequest is one JSON-RPC request the app-server sent to the client
// (for example item/commandExecution/requestApproval).
type ServerRequest struct {
	ID     json.RawMessage
	Method string
	Params json.RawMessage
}

// RPCError is a JSON-RPC error answer.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("json-rpc error %d: %s", e.Code, e.Message) }

type rpcMessage struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *RPCError       `json:"error,omitempty"`
}

// AcceptApprovals answers every approval request the app-server sends
// (commands, file changes) with "accept", and leaves other server requests
// unanswered.
func AcceptApprovals(r ServerRequest) (any, bool) {
	if strings.HasSuffix(r.Method, "/requestApproval") {
		return map[string]any{"decision": "accept"}, true
	}
	return nil, false
}

// StartAppServer starts `codex app-server` (stdio transport). approve
// answers the server's own requests; nil means AcceptApprovals. The process
// is killed when the test ends, if Close has not been called before.
func (c *Codex) StartAppServer(t testing.TB, approve func(ServerRequest) (any, bool)) *AppServer {
	t.Helper()
	if approve == nil {
		approve = AcceptApprovals
	}
	// The context is the process's lifetime (configureProcess's Cancel
	// kills the whole group); Close ends it.
	procCtx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(procCtx, c.Binary, "app-server")
	cmd.Dir = c.Dir
	cmd.Env = c.env()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("codexcli: app-server stdin: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("codexcli: app-server stdout: %v", err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	configureProcess(cmd)
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("codexcli: start app-server: %v", err)
	}
	s := &AppServer{
		cmd: cmd, cancel: cancel, stdin: stdin, stderr: stderr, done: make(chan struct{}),
		pending: map[int64]chan rpcMessage{}, noteSig: make(chan struct{}), approve: approve,
	}
	go s.read(stdout)
	t.Cleanup(s.Close)
	return s
}

// read is the reader loop: it owns stdout until the process closes it.
func (s *AppServer) read(stdout io.Reader) {
	defer close(s.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var m rpcMessage
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		m.Params = bytes.Clone(m.Params)
		m.Result = bytes.Clone(m.Result)
		m.ID = bytes.Clone(m.ID)
		switch {
		case m.Method != "" && len(m.ID) > 0:
			s.serve(ServerRequest{ID: m.ID, Method: m.Method, Params: m.Params})
		case m.Method != "":
			s.mu.Lock()
			s.notes = append(s.notes, Notification{Method: m.Method, Params: m.Params})
			close(s.noteSig)
			s.noteSig = make(chan struct{})
			s.mu.Unlock()
		default:
			var id int64
			if json.Unmarshal(m.ID, &id) != nil {
				continue
			}
			s.mu.Lock()
			ch := s.pending[id]
			delete(s.pending, id)
			s.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		}
	}
}

// serve answers one request of the server, in the reader loop (an answer is
// one short write).
func (s *AppServer) serve(r ServerRequest) {
	s.mu.Lock()
	s.served = append(s.served, r)
	s.mu.Unlock()
	result, ok := s.approve(r)
	if !ok {
		return
	}
	_ = s.write(map[string]any{"id": r.ID, "result": result})
}

func (s *AppServer) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	_, err = s.stdin.Write(append(b, '\n'))
	return err
}

// Call sends one request and waits for its answer until ctx ends. A JSON-RPC
// error answer is returned as *RPCError.
func (s *AppServer) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	ch := make(chan rpcMessage, 1)
	s.pending[id] = ch
	s.mu.Unlock()
	if err := s.write(map[string]any{"id": id, "method": method, "params": params}); err != nil {
		return nil, fmt.Errorf("app-server %s: write: %w", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return nil, fmt.Errorf("app-server %s: %w", method, m.Error)
		}
		return m.Result, nil
	case <-s.done:
		return nil, fmt.Errorf("app-server %s: the server closed its output (stderr: %s)", method, tail(s.stderr.String(), 2000))
	case <-ctx.Done():
		return nil, fmt.Errorf("app-server %s: %w (stderr: %s)", method, ctx.Err(), tail(s.stderr.String(), 2000))
	}
}

// Notify sends one notification (a message without an id).
func (s *AppServer) Notify(method string, params any) error {
	m := map[string]any{"method": method}
	if params != nil {
		m["params"] = params
	}
	return s.write(m)
}

// Initialize performs the handshake every client starts with: the
// initialize request, naming the client as clientName (Codex sends it
// upstream as its originator), then the initialized notification.
func (s *AppServer) Initialize(ctx context.Context, clientName string) (json.RawMessage, error) {
	res, err := s.Call(ctx, "initialize", map[string]any{
		"clientInfo": map[string]any{"name": clientName, "title": "Codex Relay end-to-end test", "version": "0.0.0"},
	})
	if err != nil {
		return nil, err
	}
	return res, s.Notify("initialized", nil)
}

// Wait returns the first notification not yet consumed for which match
// returns true, consuming it and every notification before it, waiting for
// more until ctx ends. The notifications it skipped are returned too, in
// order, so a caller can read what led up to the one it waited for.
func (s *AppServer) Wait(ctx context.Context, match func(Notification) bool) (Notification, []Notification, error) {
	var skipped []Notification
	for {
		s.mu.Lock()
		for i, n := range s.notes {
			if match(n) {
				skipped = append(skipped, s.notes[:i]...)
				s.notes = s.notes[i+1:]
				s.mu.Unlock()
				return n, skipped, nil
			}
		}
		skipped = append(skipped, s.notes...)
		s.notes = nil
		sig := s.noteSig
		s.mu.Unlock()
		select {
		case <-sig:
		case <-s.done:
			// The reader may have queued the last notifications before it
			// ended: look once more, then give up.
			s.mu.Lock()
			rest := s.notes
			s.notes = nil
			s.mu.Unlock()
			for i, n := range rest {
				if match(n) {
					return n, append(skipped, rest[:i]...), nil
				}
			}
			return Notification{}, append(skipped, rest...), fmt.Errorf("app-server closed its output before the notification came (stderr: %s)", tail(s.stderr.String(), 2000))
		case <-ctx.Done():
			return Notification{}, skipped, fmt.Errorf("waiting for a notification: %w (stderr: %s)", ctx.Err(), tail(s.stderr.String(), 2000))
		}
	}
}

// ServerRequests returns every request the server has sent so far.
func (s *AppServer) ServerRequests() []ServerRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ServerRequest(nil), s.served...)
}

// Stderr returns what the server has written to its standard error.
func (s *AppServer) Stderr() string { return s.stderr.String() }

// Close ends the server: it closes its standard input, kills its process
// group and waits for it. Safe to call more than once.
func (s *AppServer) Close() {
	s.closeOne.Do(func() {
		_ = s.stdin.Close()
		s.cancel()
		reapProcessGroup(s.cmd)
		// The reader loop ends when the killed group's stdout closes; Wait
		// must come after it (it closes the pipe). The bound is for a
		// descendant that escaped the group and holds stdout open.
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
		}
		err := s.cmd.Wait()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			s.stderr.WriteString("\ncodexcli: wait: " + err.Error())
		}
	})
}

// lockedBuffer is a bytes.Buffer safe for one writer (the process's
// stderr copier) and concurrent readers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(s)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
