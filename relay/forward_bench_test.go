package relay

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/codexrelay/codex-relay/internal/store"
)

// discardWriter is an http.ResponseWriter and Flusher that keeps nothing.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// sseStream builds an upstream stream: created, one message with n text
// deltas, done, completed.
func sseStream(n int) []byte {
	var b bytes.Buffer
	b.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
	b.WriteString("event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[]}}\n\n")
	for i := range n {
		fmt.Fprintf(&b, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"word%d \"}\n\n", i)
	}
	b.WriteString("event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"...\"}]}}\n\n")
	b.WriteString("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":10,\"output_tokens\":5}}}\n\n")
	return b.Bytes()
}

// BenchmarkForwardEvent measures the relay's per-event path over HTTP/SSE:
// read an event from the upstream body, hand it to the pump, sniff its type,
// track it, write it to the client and flush. Reported per event.
func BenchmarkForwardEvent(b *testing.B) {
	const deltas = 1000
	stream := sseStream(deltas)
	s := New(Config{Store: testStore(b)})
	r := &request{id: "req_bench", transport: "http"} // no thread key: nothing is bound or cached
	ch := choice{target: target{Account: store.Account{ID: "acc_bench"}}}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)) / (deltas + 4))
	b.ResetTimer()
	for i := 0; i < b.N; i += deltas + 4 {
		src := newHTTPSource(bytes.NewReader(stream), newHangUp(context.Background(), hangUpAfter))
		cl := s.newSSEClient(&discardWriter{h: http.Header{}})
		cl.r = r
		h := &head{}
		end := s.pump(ctx, r, "acc_bench", src, cl, h, func(tr *tracker) { s.settle(ctx, r, &ch, h, tr, nil) })
		if !end.facts.Completed {
			b.Fatalf("stream ended %+v", end.facts)
		}
	}
}

// The HTTP/SSE forwarding path allocates nothing per event it passes on
// unchanged: what one stream allocates (its request, tracker, settlement)
// spread over its 2,000 events stays far below one allocation an event.
// (Counted, not timed; BenchmarkForwardEvent reports the same per event.)
func TestForwardingAllocatesNothingPerEvent(t *testing.T) {
	const deltas = 2000
	stream := sseStream(deltas)
	s := New(Config{Store: testStore(t)})
	r := &request{id: "req_allocs", transport: "http"}
	ch := choice{target: target{Account: store.Account{ID: "acc_allocs"}}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(5, func() {
		src := newHTTPSource(bytes.NewReader(stream), newHangUp(context.Background(), hangUpAfter))
		cl := s.newSSEClient(&discardWriter{h: http.Header{}})
		cl.r = r
		h := &head{}
		end := s.pump(ctx, r, "acc_allocs", src, cl, h, func(tr *tracker) { s.settle(ctx, r, &ch, h, tr, nil) })
		if !end.facts.Completed {
			t.Fatalf("stream ended %+v", end.facts)
		}
	})
	perEvent := allocs / (deltas + 4)
	t.Logf("%.0f allocations a stream of %d events, %.3f an event", allocs, deltas+4, perEvent)
	assert.Less(t, perEvent, 0.25, "allocations per forwarded event")
}
