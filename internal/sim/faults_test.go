package sim

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestErrorFaults(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name       string
		fault      Fault
		wantStatus int
		wantType   string
		wantCode   string
		check      func(t *testing.T, e wire.Error, h map[string]string)
	}{
		{"usage limit", Fault{Kind: FaultUsageLimit, ResetsIn: Duration(90 * time.Minute)}, 429, wire.TypeUsageLimitReached, "",
			func(t *testing.T, e wire.Error, h map[string]string) {
				assert.Equal(t, "plus", e.PlanType)
				assert.Equal(t, now.Add(90*time.Minute).Unix(), e.ResetsAt)
				assert.Equal(t, int64(5400), e.ResetsInSeconds)
				assert.Equal(t, "100", h[wire.HeaderPrimaryUsedPercent])
			}},
		{"usage limit resets with the primary window", Fault{Kind: FaultUsageLimit}, 429, wire.TypeUsageLimitReached, "",
			func(t *testing.T, e wire.Error, _ map[string]string) {
				assert.Equal(t, now.Add(300*time.Minute).Unix(), e.ResetsAt)
			}},
		{"sharing cap", Fault{Kind: FaultSharingCap}, 429, wire.TypeUsageLimitReached, "",
			func(t *testing.T, e wire.Error, _ map[string]string) {
				assert.Zero(t, e.ResetsAt, "no reset time")
				assert.Zero(t, e.ResetsInSeconds)
				assert.Equal(t, "plus", e.PlanType)
			}},
		{"rate limit", Fault{Kind: FaultRateLimit, RetryAfter: Duration(2 * time.Second)}, 429, wire.TypeRateLimit, wire.CodeRateLimitExceeded,
			func(t *testing.T, e wire.Error, _ map[string]string) {
				assert.Contains(t, e.Message, "try again in 2s")
			}},
		{"insufficient quota", Fault{Kind: FaultInsufficientQuota}, 429, wire.TypeInsufficientQuota, wire.CodeInsufficientQuota, nil},
		{"expired token", Fault{Kind: FaultUnauthorized}, 401, wire.TypeInvalidRequest, wire.CodeTokenExpired, nil},
		{"payment required", Fault{Kind: FaultPaymentRequired}, 402, wire.TypeInvalidRequest, "payment_required", nil},
		{"forbidden", Fault{Kind: FaultForbidden}, 403, wire.TypeInvalidRequest, "forbidden", nil},
		{"server error", Fault{Kind: FaultServerError}, 500, wire.TypeServerError, "server_error", nil},
		{"bad gateway", Fault{Kind: FaultServerError, Status: 502}, 502, wire.TypeServerError, "server_error", nil},
		{"unavailable", Fault{Kind: FaultServerError, Status: 503}, 503, wire.TypeServerError, "server_error", nil},
		{"overloaded", Fault{Kind: FaultOverloaded}, 503, wire.TypeServerError, wire.CodeServerIsOverloaded, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{Now: func() time.Time { return now }})
			_, err := upstream.AddFault(tt.fault)
			require.NoError(t, err)
			c := clientFor(t, upstream, "a1")

			// HTTP: an error status with the error body and rate-limit headers.
			resp, _, err := c.turn(prompt(t, "hi"))
			status, e := errorOf(t, err)
			assert.Equal(t, tt.wantStatus, status)
			assert.Equal(t, tt.wantType, e.Type)
			assert.Equal(t, tt.wantCode, e.Code)
			assert.NotEmpty(t, resp.Header.Get(wire.HeaderPrimaryWindowMinutes))
			h := map[string]string{wire.HeaderPrimaryUsedPercent: resp.Header.Get(wire.HeaderPrimaryUsedPercent)}
			if tt.check != nil {
				tt.check(t, e, h)
			}

			// WebSocket: an error event with the same status, error and headers.
			ctx := testCtx(t, 5*time.Second)
			evs, err := wsTurn(ctx, t, c.mustDial(ctx), prompt(t, "hi"))
			require.NoError(t, err)
			ev, ok := wire.ParseErrorEvent(evs[len(evs)-1].Data)
			require.True(t, ok, "%s", evs[len(evs)-1].Data)
			assert.Equal(t, tt.wantStatus, ev.Status)
			assert.Equal(t, e, ev.Error)
			if tt.check != nil {
				tt.check(t, ev.Error, ev.Headers)
			}

			recs := upstream.Records(RecordFilter{Route: RouteResponses, Kind: RecordHTTP})
			require.Len(t, recs, 1)
			assert.Equal(t, tt.fault.Kind, recs[0].Fault)
			assert.Equal(t, tt.wantStatus, recs[0].Status)
			assert.Equal(t, tt.wantCode, recs[0].ErrorCode)
			assert.Equal(t, OutcomeError, recs[0].Outcome)
			assert.Equal(t, 2, upstream.Faults()[0].Fired)
		})
	}
}

func TestInStreamFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fault       Fault
		wantCode    string
		wantMessage string
	}{
		{Fault{Kind: FaultRateLimit, InStream: true, RetryAfter: Duration(1500 * time.Millisecond)}, wire.CodeRateLimitExceeded, "Please try again in 1.5s"},
		{Fault{Kind: FaultInsufficientQuota, InStream: true}, wire.CodeInsufficientQuota, "quota"},
		{Fault{Kind: FaultOverloaded, InStream: true}, wire.CodeServerIsOverloaded, "overloaded"},
		{Fault{Kind: FaultServerError, InStream: true}, "server_error", "error"},
	}
	for _, tt := range tests {
		t.Run(string(tt.fault.Kind), func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{Faults: []Fault{tt.fault}})
			c := clientFor(t, upstream, "k1")
			check := func(evs []event) {
				require.Equal(t, wire.EventResponseFailed, evs[len(evs)-1].Type)
				require.Equal(t, wire.EventResponseCreated, evs[len(evs)-2].Type)
				resp := evs[len(evs)-1].M["response"].(map[string]any)
				assert.Equal(t, "failed", resp["status"])
				e := resp["error"].(map[string]any)
				assert.Equal(t, tt.wantCode, e["code"])
				assert.Contains(t, e["message"], tt.wantMessage)
			}
			resp, evs, err := c.turn(prompt(t, "hi"))
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			check(evs)
			ctx := testCtx(t, 5*time.Second)
			conn := c.mustDial(ctx)
			evs, err = wsTurn(ctx, t, conn, prompt(t, "hi"))
			require.NoError(t, err)
			check(evs)
			evs, err = wsTurn(ctx, t, conn, prompt(t, "the connection stays open"))
			require.NoError(t, err)
			check(evs)
			recs := upstream.Requests(RecordFilter{})
			require.Len(t, recs, 3)
			for _, r := range recs {
				assert.Equal(t, OutcomeFailed, r.Outcome)
			}
		})
	}
}

func TestFaultCounting(t *testing.T) {
	t.Parallel()
	type step struct {
		account   string
		transport Transport
		prewarm   bool
		wantFail  bool
	}
	tests := []struct {
		name  string
		fault Fault
		steps []step
	}{
		{"usage limit after two requests", Fault{Kind: FaultUsageLimit, Account: "a1", After: 2},
			[]step{{"a1", TransportHTTP, false, false}, {"b1", TransportHTTP, false, false}, {"a1", TransportHTTP, false, false},
				{"a1", TransportHTTP, false, true}, {"a1", TransportWS, false, true}, {"b1", TransportHTTP, false, false}}},
		{"next request only", Fault{Kind: FaultServerError, Times: 1},
			[]step{{"a1", TransportHTTP, false, true}, {"a1", TransportHTTP, false, false}, {"b1", TransportHTTP, false, false}}},
		{"next two, from the second on", Fault{Kind: FaultOverloaded, After: 1, Times: 2},
			[]step{{"a1", TransportHTTP, false, false}, {"b1", TransportWS, false, true}, {"a1", TransportHTTP, false, true}, {"a1", TransportHTTP, false, false}}},
		{"websocket only", Fault{Kind: FaultRateLimit, Transport: TransportWS},
			[]step{{"a1", TransportHTTP, false, false}, {"a1", TransportWS, false, true}}},
		{"prewarms pass and do not count", Fault{Kind: FaultUnauthorized, Times: 1},
			[]step{{"a1", TransportWS, true, false}, {"a1", TransportWS, false, true}, {"a1", TransportWS, false, false}}},
		{"prewarms included on request", Fault{Kind: FaultUnauthorized, Times: 1, IncludePrewarm: true},
			[]step{{"a1", TransportWS, true, true}, {"a1", TransportWS, false, false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{Faults: []Fault{tt.fault}})
			ctx := testCtx(t, 10*time.Second)
			conns := map[string]*websocket.Conn{}
			for i, st := range tt.steps {
				b := prompt(t, "hi")
				if st.prewarm {
					b = prewarmBody(t)
				}
				var failed bool
				if st.transport == TransportHTTP {
					_, _, err := clientFor(t, upstream, st.account).turn(b)
					failed = err != nil
				} else {
					if conns[st.account] == nil {
						conns[st.account] = clientFor(t, upstream, st.account).mustDial(ctx)
					}
					evs, err := wsTurn(ctx, t, conns[st.account], b)
					require.NoError(t, err)
					failed = evs[len(evs)-1].Type == wire.EventError
				}
				assert.Equal(t, st.wantFail, failed, "step %d (%s over %s)", i, st.account, st.transport)
			}
		})
	}
}

func TestCutStream(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultCutStream, Events: 3, Times: 2}}})
	c := clientFor(t, upstream, "k1")

	// HTTP: three events, then the body breaks; no terminal event.
	resp := c.postResponses(context.Background(), prompt(t, "hi"), nil)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs, err := readSSE(resp.Body)
	require.Error(t, err, "the body must end abruptly, not cleanly")
	assert.Len(t, evs, 3)
	for _, ev := range evs {
		assert.False(t, wire.IsTerminal(ev.Type))
	}

	// WebSocket: three events (rate limits, metadata, created), then the
	// connection closes.
	ctx := testCtx(t, 5*time.Second)
	conn := c.mustDial(ctx)
	evs, err = wsTurn(ctx, t, conn, prompt(t, "hi"))
	require.Error(t, err)
	assert.Equal(t, []string{wire.EventRateLimits, wire.EventResponseMetadata, wire.EventResponseCreated}, types(evs))
	assert.Equal(t, websocket.StatusCode(-1), websocket.CloseStatus(err), "no close frame: %v", err)

	waitFor(t, func() bool {
		recs := upstream.Requests(RecordFilter{})
		return len(recs) == 2 && recs[1].Done
	}, "records of the cut requests")
	for _, r := range upstream.Records(RecordFilter{Kind: RecordHTTP})[:1] {
		assert.Equal(t, OutcomeCut, r.Outcome)
		assert.Equal(t, 3, r.Events)
		assert.Equal(t, FaultCutStream, r.Fault)
	}
	msgs := upstream.Records(RecordFilter{Kind: RecordMessage})
	require.Len(t, msgs, 1)
	assert.Equal(t, OutcomeCut, msgs[0].Outcome)

	// The fault fired twice; the third request streams whole.
	_, evs, err = c.turn(prompt(t, "hi"))
	require.NoError(t, err)
	assert.Equal(t, wire.EventResponseCompleted, evs[len(evs)-1].Type)
}

func TestStall(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultStall, Events: 2}}})
	c := clientFor(t, upstream, "k1")

	// HTTP: two events, then nothing until the client gives up.
	ctx, cancel := context.WithCancel(context.Background())
	resp := c.postResponses(ctx, prompt(t, "hi"), nil)
	r := wire.NewSSEReader(resp.Body, 0, 0)
	for range 2 {
		_, err := r.Next()
		require.NoError(t, err)
	}
	next := make(chan error, 1)
	go func() { _, err := r.Next(); next <- err }()
	select {
	case err := <-next:
		t.Fatalf("a stalled stream sent more: %v", err)
	case <-time.After(150 * time.Millisecond):
	}
	cancel()
	require.Error(t, <-next)
	resp.Body.Close()
	waitFor(t, func() bool {
		recs := upstream.Records(RecordFilter{Kind: RecordHTTP})
		return len(recs) == 1 && recs[0].Outcome == OutcomeStalled
	}, "the stalled HTTP request ends when the client leaves")

	// WebSocket: likewise, until the client closes.
	wctx := testCtx(t, 5*time.Second)
	conn := c.mustDial(wctx)
	rctx, rcancel := context.WithTimeout(wctx, 150*time.Millisecond)
	defer rcancel()
	evs, err := wsTurn(rctx, t, conn, prompt(t, "hi"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Len(t, evs, 2)
	waitFor(t, func() bool {
		recs := upstream.Records(RecordFilter{Kind: RecordMessage})
		return len(recs) == 1 && recs[0].Outcome == OutcomeStalled
	}, "the stalled WebSocket request ends when the client leaves")
}

func TestRefuseWebSocket(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status, want int
	}{{0, http.StatusUpgradeRequired}, {500, 500}} {
		t.Run(http.StatusText(tt.want), func(t *testing.T) {
			t.Parallel()
			upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultRefuseWebSocket, Status: tt.status, Times: 1}}})
			c := clientFor(t, upstream, "a1")
			ctx := testCtx(t, 5*time.Second)
			_, resp, err := c.dial(ctx)
			require.Error(t, err)
			require.NotNil(t, resp)
			assert.Equal(t, tt.want, resp.StatusCode)

			// HTTP is unaffected, and the fault was one-shot.
			_, _, err = c.turn(prompt(t, "hi"))
			require.NoError(t, err)
			conn, _, err := c.dial(ctx)
			require.NoError(t, err)
			_ = conn.CloseNow()

			recs := upstream.Records(RecordFilter{Kind: RecordHandshake})
			require.Len(t, recs, 2)
			assert.Equal(t, FaultRefuseWebSocket, recs[0].Fault)
			assert.Equal(t, tt.want, recs[0].Status)
			assert.Equal(t, OutcomeUpgraded, recs[1].Outcome)
		})
	}
}

func TestWebSocketMaxAge(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultWebSocketMaxAge, MaxAge: Duration(100 * time.Millisecond)}}})
	c := clientFor(t, upstream, "a1")
	ctx := testCtx(t, 5*time.Second)

	// The limit is hard: a response that has not begun when the age passes
	// is answered by the limit error alone, then the connection closes.
	conn := c.mustDial(ctx)
	evs, err := wsTurn(ctx, t, conn, prompt(t, "slow [[sim:delay 250ms]]"))
	require.NoError(t, err)
	require.Len(t, evs, 1, "nothing of the response was sent")
	ev, ok := wire.ParseErrorEvent(evs[0].Data)
	require.True(t, ok)
	assert.Equal(t, wire.CodeWebSocketConnectionLimitReached, ev.Error.Code)
	_, _, err = conn.Read(ctx)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err))

	// A response streaming when the age passes is cut by it.
	streaming := newSim(t, Config{Faults: []Fault{{Kind: FaultWebSocketMaxAge, MaxAge: Duration(500 * time.Millisecond)}}})
	sconn := clientFor(t, streaming, "a1").mustDial(ctx)
	evs, err = wsTurn(ctx, t, sconn, prompt(t, "long [[sim:events 300]] [[sim:gap 10ms]]"))
	require.NoError(t, err)
	last := evs[len(evs)-1]
	require.Equal(t, wire.EventError, last.Type, "the limit came instead of response.completed")
	ev, ok = wire.ParseErrorEvent(last.Data)
	require.True(t, ok)
	assert.Equal(t, wire.CodeWebSocketConnectionLimitReached, ev.Error.Code)
	assert.NotEmpty(t, find(evs, wire.EventOutputTextDelta), "output had begun")
	_, _, err = sconn.Read(ctx)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err))
	for _, up := range []*Server{upstream, streaming} {
		recs := up.Records(RecordFilter{Kind: RecordMessage})
		require.Len(t, recs, 1)
		assert.Equal(t, wire.CodeWebSocketConnectionLimitReached, recs[0].ErrorCode, "the record shows the limit")
		assert.Equal(t, FaultWebSocketMaxAge, recs[0].Fault)
		assert.Equal(t, OutcomeError, recs[0].Outcome)
	}

	// An idle connection is closed when the age passes. The age counts
	// from the upgrade, which comes after the dial starts: timed from there,
	// a slow dial (a loaded machine) cannot make the close look early.
	start := time.Now()
	conn = c.mustDial(ctx)
	evs, err = wsRead(ctx, conn)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 90*time.Millisecond)
	ev, ok = wire.ParseErrorEvent(evs[0].Data)
	require.True(t, ok)
	assert.Equal(t, wire.CodeWebSocketConnectionLimitReached, ev.Error.Code)
	_, _, err = conn.Read(ctx)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err))
	assert.Equal(t, 2, upstream.Faults()[0].Fired)
}

// A fault with a rate fires on about that fraction of the requests it is
// due for, counts every one it matches, and leaves the rest to the faults
// after it.
func TestFaultRate(t *testing.T) {
	t.Parallel()
	var fs faultSet
	_, err := fs.add(Fault{Kind: FaultServerError, Rate: 0.25, After: 100})
	require.NoError(t, err)
	_, err = fs.add(Fault{Kind: FaultCutStream})
	require.NoError(t, err)
	fired := map[FaultKind]int{}
	for range 4100 {
		f, ok := fs.check(faultSite{account: "a1", transport: TransportHTTP, route: RouteResponses})
		require.True(t, ok, "the second fault fires whenever the first does not")
		fired[f.Kind]++
	}
	// 4,000 due at 0.25: 1,000 expected, standard deviation 27.
	assert.InDelta(t, 1000, fired[FaultServerError], 150, "server errors")
	assert.Equal(t, 4100, fired[FaultServerError]+fired[FaultCutStream])
	assert.Equal(t, 4100, fs.list()[0].Seen)
	assert.Equal(t, fired[FaultServerError], fs.list()[0].Fired)
}

func TestFaultValidation(t *testing.T) {
	t.Parallel()
	bad := []Fault{
		{Kind: "explode"},
		{Kind: FaultServerError, Status: 404},
		{Kind: FaultRefuseWebSocket, Status: 200},
		{Kind: FaultRefuseWebSocket, Transport: TransportHTTP},
		{Kind: FaultWebSocketMaxAge},
		{Kind: FaultUnauthorized, InStream: true},
		{Kind: FaultUsageLimit, After: -1},
		{Kind: FaultStall, Transport: "carrier-pigeon"},
		{Kind: FaultServerError, Rate: -0.1},
		{Kind: FaultServerError, Rate: 1.5},
		{Kind: FaultServerError, Rate: math.NaN()},
	}
	upstream := newSim(t, Config{})
	for _, f := range bad {
		_, err := upstream.AddFault(f)
		assert.Error(t, err, "%+v", f)
	}
	assert.Empty(t, upstream.Faults())
	_, err := New(Config{Faults: bad[:1]})
	assert.Error(t, err)
}

func TestCloseEndsEverything(t *testing.T) {
	t.Parallel()
	upstream := NewServer(Config{Accounts: testAccounts(), Faults: []Fault{{Kind: FaultStall, Events: 1}}})
	t.Cleanup(upstream.Close)
	c := clientFor(t, upstream, "k1")
	ctx := testCtx(t, 10*time.Second)

	resp := c.postResponses(ctx, prompt(t, "stalls"), nil)
	httpDone := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		httpDone <- err
	}()
	stalled := c.mustDial(ctx)
	require.NoError(t, stalled.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","input":[]}`)))
	idle := c.mustDial(ctx)
	waitFor(t, func() bool {
		recs := upstream.Requests(RecordFilter{})
		return len(recs) == 2 && recs[0].Events == 1 && recs[1].Events == 1
	}, "both requests stall")

	closed := make(chan struct{})
	go func() { upstream.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not end the stalled streams and open connections")
	}
	require.Error(t, <-httpDone, "the stalled HTTP stream is cut")
	for _, conn := range []*websocket.Conn{stalled, idle} {
		_, err := wsRead(ctx, conn)
		assert.Error(t, err)
	}
	upstream.Close() // idempotent

	// A bare handler answers 503 after Close.
	h, err := New(Config{})
	require.NoError(t, err)
	h.Close()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
}

// An in-stream failure can follow output: Events events of the normal
// response, then response.failed (usage limits too).
func TestInStreamFailureAfterOutput(t *testing.T) {
	t.Parallel()
	s := NewServer(Config{Accounts: []Account{{ID: "a", Kind: KindOpenAI, AccessToken: "at-a"}}})
	defer s.Close()
	_, err := s.AddFault(Fault{Kind: FaultUsageLimit, InStream: true, Events: 4, Times: 1})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.OpenAIBaseURL()+"/responses", strings.NewReader(`{"model":"m","stream":true,"input":[{"type":"message","role":"user","content":"hi [[sim:words 20]]"}]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer at-a")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	body := string(b)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "response.output_item.added", "output began")
	assert.Contains(t, body, "response.failed")
	assert.Contains(t, body, "usage_limit_reached")
	assert.NotContains(t, body, "response.completed")
	assert.Equal(t, 4, strings.Count(body, "data: ")-1, "four events, then the failure")
}

// TakeFinished hands over finished records once and keeps the one still
// being written.
func TestTakeFinished(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Faults: []Fault{{Kind: FaultStall, Events: 1, After: 1, Times: 1}}})
	c := clientFor(t, upstream, "k1")
	ctx := testCtx(t, 10*time.Second)
	_, _, err := c.turn(prompt(t, "answered"))
	require.NoError(t, err)
	resp := c.postResponses(ctx, prompt(t, "stalls"), nil)
	defer resp.Body.Close()
	waitFor(t, func() bool {
		recs := upstream.Requests(RecordFilter{})
		return len(recs) == 2 && recs[1].Events == 1
	}, "the second request stalls")

	took := upstream.TakeFinished()
	require.Len(t, took, 1)
	assert.Equal(t, OutcomeCompleted, took[0].Outcome)
	require.NotNil(t, took[0].Usage, "the usage of the answer comes along")
	assert.Positive(t, took[0].Usage.OutputTokens)
	assert.Empty(t, upstream.TakeFinished(), "taken once")
	left := upstream.Records(RecordFilter{})
	require.Len(t, left, 1)
	assert.False(t, left[0].Done)
}

// A completion the sim counted but could not write is summed by its
// prompt_cache_key, for a soak to tell usage no relay could have seen.
func TestUndeliveredCompletionsAreSummed(t *testing.T) {
	t.Parallel()
	s := &Server{rec: recorder{max: 10}}
	for _, key := range []string{"a", "a", "b"} {
		ref := s.rec.add(Record{PromptCacheKey: key, Usage: &RecordUsage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15}})
		s.noteUndelivered(ref)
	}
	s.noteUndelivered(s.rec.add(Record{PromptCacheKey: "c"})) // no usage: nothing counted
	got := s.Undelivered()
	assert.Equal(t, map[string]RecordUsage{"a": {InputTokens: 20, OutputTokens: 10, TotalTokens: 30}, "b": {InputTokens: 10, OutputTokens: 5, TotalTokens: 15}}, got)
}
