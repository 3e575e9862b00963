package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// benchTarget is where a phase's sessions go: the sim itself, the byte
// pipe in front of it, or the relay.
type benchTarget struct {
	name   string
	base   string                     // .../backend-api/codex
	header func(conv int) http.Header // credentials for conversation conv
}

// wireCounter counts the bytes the bench's clients read and wrote on
// their connections: what crossed the loopback between a client and its
// target, headers, framing and compression included.
type wireCounter struct {
	in, out atomic.Int64
	dials   atomic.Int64 // connections opened
}

// countingConn is a client connection whose bytes a wireCounter counts.
type countingConn struct {
	net.Conn
	n *wireCounter
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.in.Add(int64(n))
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.out.Add(int64(n))
	return n, err
}

// benchClient is the HTTP client of one phase: connections kept alive, as
// Codex keeps them, one per session at most, and counted.
func benchClient(sessions int, wc *wireCounter) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        sessions + 8,
		MaxIdleConnsPerHost: sessions + 8,
		IdleConnTimeout:     90 * time.Second,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			wc.dials.Add(1)
			return countingConn{Conn: c, n: wc}, nil
		},
	}}
}

// turnSample is one completed turn's measures.
type turnSample struct {
	turn       int           // 0 for a session's first turn
	firstEvent time.Duration // request written -> first event read
	firstToken time.Duration // -> first response.output_text.delta read
	total      time.Duration // -> response.completed read
	events     int           // events read
	eventBytes int           // their payload bytes (SSE data, WebSocket message)
}

// benchConversation is one session of a workload: a root thread that
// sends turns one after another on the same session, as Codex does.
type benchConversation struct {
	client  *http.Client
	target  benchTarget
	conv    int
	o       options
	session string
	// ready is called once the session is connected, before its first
	// turn (the burst barrier waits there); may be nil.
	ready func()
	// output is called once, at the first output event the session reads
	// (-busyprofile waits for every session's); may be nil.
	output func()
}

func (b *benchConversation) headers() http.Header {
	h := b.target.header(b.conv)
	h.Set("Session-Id", b.session)
	h.Set("Thread-Id", b.session)
	h.Set("Originator", "codex-relay-bench")
	return h
}

func (b *benchConversation) prompt(turn int) map[string]any {
	text := fmt.Sprintf("bench turn %d [[sim:words %d]]", turn+1, b.o.words)
	if b.o.deltas > 0 {
		text += fmt.Sprintf(" [[sim:events %d]]", b.o.deltas)
	}
	if b.o.pace > 0 {
		text += fmt.Sprintf(" [[sim:gap %s]]", b.o.pace)
	}
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

func (b *benchConversation) beforeFirstTurn() {
	if b.ready != nil {
		b.ready()
		b.ready = nil
	}
}

func (b *benchConversation) run(ctx context.Context, transport string, sample func(turnSample)) error {
	if transport == "ws" {
		conn, err := b.dial(ctx)
		if err != nil {
			return err
		}
		defer conn.CloseNow()
		if err := b.runWebSocket(ctx, conn, b.o.turns, sample); err != nil {
			return err
		}
		return conn.Close(websocket.StatusNormalClosure, "")
	}
	return b.runHTTP(ctx, sample)
}

// runHTTP resends the whole history every turn, as Codex does over HTTP.
func (b *benchConversation) runHTTP(ctx context.Context, sample func(turnSample)) error {
	var history []any
	for turn := range b.o.turns {
		history = append(history, b.prompt(turn))
		body, err := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "stream": true, "store": false,
			"prompt_cache_key": b.session, "input": history})
		if err != nil {
			return err
		}
		b.beforeFirstTurn()
		s, output, err := b.httpTurn(ctx, body)
		if err != nil {
			return fmt.Errorf("%s http turn %d: %w", b.target.name, turn+1, err)
		}
		s.turn = turn
		sample(s)
		history = append(history, output...)
	}
	return nil
}

func (b *benchConversation) httpTurn(ctx context.Context, body []byte) (turnSample, []any, error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.target.base+"/responses", bytes.NewReader(body))
	if err != nil {
		return turnSample{}, nil, err
	}
	req.Header = b.headers()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return turnSample{}, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return turnSample{}, nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var s turnSample
	events := wire.NewSSEReader(resp.Body, 0, 0)
	for {
		ev, err := events.Next()
		if err != nil {
			return turnSample{}, nil, fmt.Errorf("stream ended before response.completed: %w", err)
		}
		done, output, err := b.event(ev.Data, start, &s, true)
		if err != nil {
			return s, output, err
		}
		if done {
			// Read the stream to its end, as Codex does: the connection
			// goes back to the pool only then (closed early, it is dropped).
			if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)); err != nil {
				return s, output, fmt.Errorf("after response.completed: %w", err)
			}
			return s, output, nil
		}
	}
}

// dial opens the session's WebSocket, offering permessage-deflate with
// context takeover when -client-deflate is on, as Codex does.
func (b *benchConversation) dial(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	h := b.headers()
	h.Set("OpenAI-Beta", wire.OpenAIBetaWebSockets)
	mode := websocket.CompressionDisabled
	if b.o.clientDeflate {
		mode = websocket.CompressionContextTakeover
	}
	conn, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(b.target.base, "http")+"/responses",
		&websocket.DialOptions{HTTPClient: b.client, HTTPHeader: h, CompressionMode: mode})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("%s websocket dial: HTTP %d: %w", b.target.name, resp.StatusCode, err)
		}
		return nil, fmt.Errorf("%s websocket dial: %w", b.target.name, err)
	}
	conn.SetReadLimit(64 << 20)
	return conn, nil
}

// runWebSocket sends turns on conn, chained with previous_response_id and
// carrying only the new input, as Codex does.
func (b *benchConversation) runWebSocket(ctx context.Context, conn *websocket.Conn, turns int, sample func(turnSample)) error {
	previous, prewarmEvents := "", 0
	if b.o.prewarm {
		var err error
		if previous, prewarmEvents, err = b.prewarm(ctx, conn); err != nil {
			return fmt.Errorf("%s websocket prewarm: %w", b.target.name, err)
		}
	}
	for turn := range turns {
		msg := map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
			"prompt_cache_key": b.session, "input": []any{b.prompt(turn)}}
		if previous != "" {
			msg["previous_response_id"] = previous
		}
		b.beforeFirstTurn()
		s, id, err := b.wsTurn(ctx, conn, msg)
		if err != nil {
			return fmt.Errorf("%s websocket turn %d: %w", b.target.name, turn+1, err)
		}
		s.turn = turn
		if turn == 0 {
			s.events += prewarmEvents // read on this session, counted by the sim too
		}
		sample(s)
		previous = id
	}
	return nil
}

func (b *benchConversation) wsTurn(ctx context.Context, conn *websocket.Conn, msg map[string]any) (turnSample, string, error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	data, err := json.Marshal(msg)
	if err != nil {
		return turnSample{}, "", err
	}
	start := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
		return turnSample{}, "", err
	}
	var s turnSample
	for {
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return turnSample{}, "", err
		}
		done, _, err := b.event(frame, start, &s, false)
		if err != nil {
			return turnSample{}, "", err
		}
		if done {
			var ev struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			if err := json.Unmarshal(frame, &ev); err != nil || ev.Response.ID == "" {
				return turnSample{}, "", fmt.Errorf("response.completed without a response id")
			}
			return s, ev.Response.ID, nil
		}
	}
}

// prewarm sends what Codex sends as soon as its WebSocket is open: a
// response.create with generate:false and no input, answered by
// response.created and response.completed; the first turn chains to it.
// It returns the prewarm's response id and the events read.
func (b *benchConversation) prewarm(ctx context.Context, conn *websocket.Conn) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, b.o.turnTimeout)
	defer cancel()
	data, err := json.Marshal(map[string]any{"type": "response.create", "model": "gpt-5.5-codex", "stream": true, "store": false,
		"prompt_cache_key": b.session, "generate": false, "input": []any{}})
	if err != nil {
		return "", 0, err
	}
	if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
		return "", 0, err
	}
	for events := 1; ; events++ {
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return "", events, err
		}
		typ, _ := wire.EventType(frame)
		switch {
		case typ == wire.EventRateLimits:
			events-- // a limits report, not the answer's (see answerEvents)
		case typ == "response.completed":
			var ev struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			if err := json.Unmarshal(frame, &ev); err != nil || ev.Response.ID == "" {
				return "", events, errors.New("prewarm: response.completed without a response id")
			}
			return ev.Response.ID, events, nil
		case wire.IsTerminal(typ) || typ == "error":
			return "", events, fmt.Errorf("prewarm: %s: %s", typ, clipText(string(frame), 300))
		}
	}
}

// event reads one event of a turn that started at start: the first event
// sets the time to first event, the first text delta the time to first
// output token; response.completed ends the turn (with its output items
// when wantOutput); any other terminal event is an error.
func (b *benchConversation) event(data []byte, start time.Time, s *turnSample, wantOutput bool) (done bool, output []any, err error) {
	typ, _ := wire.EventType(data)
	if typ == wire.EventRateLimits {
		// A limits report, not the answer's (see answerEvents): neither
		// counted nor the first event (the relay sends its own at once).
		return false, nil, nil
	}
	s.events++
	s.eventBytes += len(data)
	if s.firstEvent == 0 {
		s.firstEvent = time.Since(start)
	}
	switch {
	case typ == "response.output_text.delta" && s.firstToken == 0:
		s.firstToken = time.Since(start)
		if b.output != nil {
			b.output()
			b.output = nil
		}
	case typ == "response.completed":
		s.total = time.Since(start)
		if s.firstToken == 0 {
			return true, nil, errors.New("response.completed before any text")
		}
		if !wantOutput {
			return true, nil, nil
		}
		var ev struct {
			Response struct {
				Output []any `json:"output"`
			} `json:"response"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return true, nil, fmt.Errorf("response.completed: %w", err)
		}
		return true, ev.Response.Output, nil
	case wire.IsTerminal(typ) || typ == "error":
		return true, nil, fmt.Errorf("%s: %s", typ, clipText(string(data), 300))
	}
	return false, nil, nil
}
