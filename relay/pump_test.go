package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// scriptedSource is an upstream stream whose events have all arrived: Next
// hands them out in order, but reports the client gone (cancelling the
// request) when it reaches goneAt; Arrived hands out the rest.
type scriptedSource struct {
	events [][]byte
	next   int
	goneAt int // -1: never
	cancel context.CancelFunc
}

func (s *scriptedSource) Next(ctx context.Context, _ time.Duration) ([]byte, error) {
	if s.next == s.goneAt {
		s.cancel()
		return nil, ctx.Err()
	}
	if s.next >= len(s.events) {
		return nil, io.EOF
	}
	s.next++
	return s.events[s.next-1], nil
}

func (s *scriptedSource) Arrived() ([]byte, bool) {
	if s.next >= len(s.events) {
		return nil, false
	}
	s.next++
	return s.events[s.next-1], true
}

func (s *scriptedSource) stop() {}

// hangingUpClient takes events until the one named gone, whose write fails
// as a write to a closed connection does.
type hangingUpClient struct {
	gone   string
	onGone func() // called as the write of gone fails (nil: nothing)
	got    []string
}

func (c *hangingUpClient) lane(*request) (bridge.Key, bool) { return bridge.Key{}, false }
func (c *hangingUpClient) send(_ *head, typ string, _ []byte) error {
	if typ == c.gone {
		if c.onGone != nil {
			c.onGone()
		}
		return syscall.EPIPE
	}
	c.got = append(c.got, typ)
	return nil
}
func (c *hangingUpClient) fail(*head, *failure) error     { return errors.New("unexpected fail") }
func (c *hangingUpClient) reply(*head, int, []byte) error { return errors.New("unexpected reply") }
func (c *hangingUpClient) waiting(*head)                  {}
func (c *hangingUpClient) issueTurnState() string         { return "rts_test" }

// A response's events as the upstream streams them, ending with terminal.
func streamEnding(terminal string) [][]byte {
	ev := func(s string) []byte { return []byte(s) }
	out := [][]byte{
		ev(`{"type":"response.created","response":{"id":"resp_1"}}`),
		ev(`{"type":"response.output_item.added","item":{"type":"message","id":"m1"}}`),
		ev(`{"type":"response.output_text.delta","delta":"hello"}`),
		ev(`{"type":"response.output_text.done","text":"hello"}`),
		ev(`{"type":"response.output_item.done","item":{"type":"message","id":"m1","role":"assistant"}}`),
	}
	switch terminal {
	case wire.EventResponseCompleted:
		out = append(out, ev(`{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}`))
	case wire.EventResponseFailed:
		out = append(out, ev(`{"type":"response.failed","response":{"id":"resp_1","error":{"code":"server_error","message":"boom"}}}`))
	}
	return out
}

// A client that ends its stream early is a cancellation, whatever the
// moment: the lane survives when the upstream had finished (its terminal
// event at hand), and the completed response is settled once, as if heard;
// it is closed, cancelling the upstream's request, when the upstream was
// still answering.
func TestClientGoneKeepsTheLaneOnlyWhenTheUpstreamHadFinished(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		events   [][]byte
		goneAt   int    // the source reports the client gone before this event (-1: never)
		failSend string // the client's write of this event fails ("": none)
		broken   bool
		settled  bool
	}{
		{"hung up after the text, the upstream had completed", streamEnding(wire.EventResponseCompleted), 4, "", false, true},
		{"its write failed at the text, the upstream had completed", streamEnding(wire.EventResponseCompleted), -1, wire.EventOutputTextDone, false, true},
		{"hung up before the terminal event was read", streamEnding(wire.EventResponseCompleted), 5, "", false, true},
		{"its write of the terminal event failed", streamEnding(wire.EventResponseCompleted), -1, wire.EventResponseCompleted, false, true},
		{"hung up, the upstream had failed", streamEnding(wire.EventResponseFailed), 4, "", false, false},
		{"hung up, the upstream still answering", streamEnding(""), 4, "", true, false},
		{"its write failed, the upstream still answering", streamEnding(""), -1, wire.EventOutputTextDone, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := New(Config{Store: testStore(t), DisableBridge: true})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src := &scriptedSource{events: tc.events, goneAt: tc.goneAt, cancel: cancel}
			cl := &hangingUpClient{gone: tc.failSend}
			r := &request{id: "req_test", start: time.Now(), transport: "http"}
			settles := 0
			var settledID string
			end := s.pump(ctx, r, "acc_a", src, cl, &head{}, func(tr *tracker) { settles++; settledID = tr.responseID })

			assert.True(t, end.facts.Cancelled, "a cancellation")
			assert.False(t, end.facts.Completed, "the client did not hear the end")
			assert.False(t, end.facts.ClientStalled)
			out := classify(end.facts)
			assert.Equal(t, classCancelled, out.Class)
			assert.Equal(t, actionTerminal, out.Action, "nothing fails over")
			assert.Nil(t, out.Penalty, "the account is not penalised")
			assert.Equal(t, tc.broken, end.broken, "the lane is closed only while the upstream was still answering")
			if tc.settled {
				require.Equal(t, 1, settles, "the completed response is settled once")
				assert.Equal(t, "resp_1", settledID)
				assert.True(t, end.tr.usage, "its usage counts")
			} else {
				assert.Zero(t, settles)
			}
			assert.NotContains(t, cl.got, wire.EventResponseCompleted, "the client never heard the end")
		})
	}
}

// An upstream HTTP request outlives a client that hangs up by hangUpAfter:
// what the upstream sends in that time, its completion above all, is read
// and settled instead of thrown away with a request cancelled at once (the
// upstream bills what it sent).
func TestHTTPUpstreamAnswerInFlightWhenTheClientGoesIsSettled(t *testing.T) {
	t.Parallel()
	clientWent := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range streamEnding(wire.EventResponseCompleted) {
			typ, _ := wire.EventType(ev)
			if typ == wire.EventResponseCompleted {
				// The completion leaves as the client goes.
				select {
				case <-clientWent:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, ev)
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done() // the connection stays open until the relay ends the request
	}))
	t.Cleanup(upstream.Close)

	s := New(Config{Store: testStore(t), DisableBridge: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The test's grace is long, so a loaded machine cannot miss it.
	hang := newHangUp(ctx, time.Minute)
	defer hang.end()
	req, err := http.NewRequestWithContext(hang.ctx, http.MethodPost, upstream.URL, nil)
	require.NoError(t, err)
	resp, err := upstream.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	// The client goes as the text reaches it: its write fails, and its
	// context ends.
	cl := &hangingUpClient{gone: wire.EventOutputTextDone, onGone: func() { cancel(); close(clientWent) }}
	r := &request{id: "req_test", start: time.Now(), transport: "http"}
	settles := 0
	end := s.pump(ctx, r, "acc_a", newHTTPSource(resp.Body, hang), cl, &head{}, func(*tracker) { settles++ })

	assert.True(t, end.facts.Cancelled, "a cancellation")
	assert.False(t, end.broken, "the upstream's answer was complete")
	assert.Equal(t, 1, settles, "the completion the client never heard is settled")
	assert.True(t, end.tr.usage, "its usage counts")
	assert.NoError(t, hang.ctx.Err(), "the request is ended by its attempt, or hangUpAfter after the client went")
}
