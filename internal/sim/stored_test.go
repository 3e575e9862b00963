package sim

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

func TestStoredResponseRoutes(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, pair := range [][2]string{{"k1", "a1"}, {"a1", "a2"}} {
		owner, other := clientFor(t, s, pair[0]), clientFor(t, s, pair[1])
		_, evs, err := owner.turn(body(t, []any{userMsg("not kept")}, nil))
		require.NoError(t, err)
		notStored := completedResponse(t, evs)["id"].(string)

		_, evs, err = owner.turn(body(t, []any{devMsg("be brief"), userMsg("keep me")}, map[string]any{"store": true}))
		require.NoError(t, err)
		id := completedResponse(t, evs)["id"].(string)

		resp, obj, raw := owner.call(http.MethodGet, "/responses/"+id, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		assert.Equal(t, id, obj["id"])
		assert.Equal(t, "response", obj["object"])
		assert.Equal(t, "completed", obj["status"])
		assert.Equal(t, false, obj["background"])
		assert.NotEmpty(t, obj["output"])
		assert.NotNil(t, obj["usage"])

		resp, items, _ := owner.call(http.MethodGet, "/responses/"+id+"/input_items?order=asc", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		data := items["data"].([]any)
		require.Len(t, data, 2)
		first := data[0].(map[string]any)
		assert.Equal(t, "developer", first["role"])
		assert.NotEmpty(t, first["id"], "every item has an id")
		assert.Equal(t, first["id"], items["first_id"])
		assert.Equal(t, data[1].(map[string]any)["id"], items["last_id"])
		assert.Equal(t, false, items["has_more"])
		_, desc, _ := owner.call(http.MethodGet, "/responses/"+id+"/input_items", nil, nil)
		assert.Equal(t, items["last_id"], desc["first_id"], "newest first by default")

		// previous_response_id over HTTP finds a stored response of the
		// account, and only that.
		_, _, err = owner.turn(body(t, []any{userMsg("next")}, map[string]any{"previous_response_id": id}))
		require.NoError(t, err)
		_, _, err = owner.turn(body(t, []any{userMsg("next")}, map[string]any{"previous_response_id": notStored}))
		st, e := errorOf(t, err)
		assert.Equal(t, http.StatusBadRequest, st)
		assert.Equal(t, wire.CodePreviousResponseNotFound, e.Code)
		_, _, err = other.turn(body(t, []any{userMsg("next")}, map[string]any{"previous_response_id": id}))
		st, e = errorOf(t, err)
		assert.Equal(t, http.StatusBadRequest, st)
		assert.Equal(t, wire.CodePreviousResponseNotFound, e.Code)

		msg := "Response with id '" + id + "' not found."
		for _, r := range []struct{ method, path string }{
			{http.MethodGet, "/responses/" + id}, {http.MethodGet, "/responses/" + id + "/input_items"},
			{http.MethodPost, "/responses/" + id + "/cancel"}, {http.MethodDelete, "/responses/" + id},
		} {
			resp, _, raw := other.call(r.method, r.path, nil, nil)
			assertNotFound(t, resp, raw, msg, "")
		}
		resp, _, raw = owner.call(http.MethodGet, "/responses/"+notStored, nil, nil)
		assertNotFound(t, resp, raw, "Response with id '"+notStored+"' not found.", "")

		resp, _, raw = owner.call(http.MethodPost, "/responses/"+id+"/cancel", nil, nil)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a synchronous response: %s", raw)

		sr, ok := s.StoredResponse(pair[0], id)
		require.True(t, ok)
		assert.Equal(t, StatusCompleted, sr.Status)
		assert.Len(t, sr.InputItems, 2)
		recs := s.Records(RecordFilter{Account: pair[1], Route: RouteResponseGet})
		require.NotEmpty(t, recs)
		assert.Equal(t, id, recs[0].ObjectID)

		resp, del, _ := owner.call(http.MethodDelete, "/responses/"+id, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, map[string]any{"id": id, "object": "response", "deleted": true}, del)
		resp, _, raw = owner.call(http.MethodGet, "/responses/"+id, nil, nil)
		assertNotFound(t, resp, raw, msg, "")
	}
}

func TestStreamFalseAnswersJSON(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	resp, obj, raw := k.call(http.MethodPost, "/responses", body(t, []any{userMsg("hello")}, map[string]any{"stream": false, "store": true}), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	assert.Equal(t, "completed", obj["status"])
	assert.Equal(t, "response", obj["object"])
	id := obj["id"].(string)
	sr, ok := s.StoredResponse("k1", id)
	require.True(t, ok)
	assert.Equal(t, StatusCompleted, sr.Status)
}

// backgroundPost posts a background response without stream and returns
// the queued object.
func backgroundPost(t *testing.T, c *client, text string) map[string]any {
	t.Helper()
	resp, obj, raw := c.call(http.MethodPost, "/responses", body(t, []any{userMsg(text)},
		map[string]any{"background": true, "stream": false, "store": true}), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	return obj
}

func TestBackgroundResponseLifecycle(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, id := range []string{"k1", "a1"} {
		c := clientFor(t, s, id)
		// A long delay keeps it queued while the test looks.
		obj := backgroundPost(t, c, "wait [[sim:delay 10m]]")
		assert.Equal(t, "queued", obj["status"])
		assert.Equal(t, true, obj["background"])
		rid := obj["id"].(string)
		_, got, _ := c.call(http.MethodGet, "/responses/"+rid, nil, nil)
		assert.Equal(t, "queued", got["status"])
		resp, cancelled, _ := c.call(http.MethodPost, "/responses/"+rid+"/cancel", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "cancelled", cancelled["status"])
		_, got, _ = c.call(http.MethodGet, "/responses/"+rid, nil, nil)
		assert.Equal(t, "cancelled", got["status"])

		// One that runs completes, and its answer is the script's.
		obj = backgroundPost(t, c, "hello there")
		rid = obj["id"].(string)
		// Follow it to its end (a stream), then read the object.
		r := c.do(testCtx(t, timeoutLong), http.MethodGet, c.base+"/responses/"+rid+"?stream=true", nil, nil)
		evs, err := readSSE(r.Body)
		r.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, wire.EventResponseCreated, evs[0].Type)
		assert.Equal(t, wire.EventResponseCompleted, evs[len(evs)-1].Type)
		assert.Equal(t, "Simulated reply to: hello there", answerText(evs))
		_, got, _ = c.call(http.MethodGet, "/responses/"+rid, nil, nil)
		assert.Equal(t, "completed", got["status"])
		assert.NotEmpty(t, got["output"])
		resp, again, _ := c.call(http.MethodPost, "/responses/"+rid+"/cancel", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "completed", again["status"], "a finished response stays as it was")

		// Replay after a sequence number gives the events after it.
		r = c.do(testCtx(t, timeoutLong), http.MethodGet, c.base+"/responses/"+rid+"?stream=true&starting_after=2", nil, nil)
		tail, err := readSSE(r.Body)
		r.Body.Close()
		require.NoError(t, err)
		require.Len(t, tail, len(evs)-3)
		assert.EqualValues(t, 3, tail[0].M["sequence_number"])
		assert.Equal(t, types(evs[3:]), types(tail))
	}
}

func TestBackgroundResponseInProgressAndLiveFollow(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	// A gap of ten minutes between events: the run stops after its first
	// event until it is cancelled.
	obj := backgroundPost(t, k, "slow [[sim:gap 10m]]")
	rid := obj["id"].(string)
	r := k.do(testCtx(t, timeoutLong), http.MethodGet, k.base+"/responses/"+rid+"?stream=true", nil, nil)
	defer r.Body.Close()
	sr := wire.NewSSEReader(r.Body, 0, 0)
	first, err := sr.Next()
	require.NoError(t, err)
	assert.Equal(t, wire.EventResponseCreated, decodeEvent(first.Data).Type)
	_, got, _ := k.call(http.MethodGet, "/responses/"+rid, nil, nil)
	assert.Equal(t, "in_progress", got["status"])
	resp, _, _ := k.call(http.MethodPost, "/responses/"+rid+"/cancel", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The follower's stream ends with the cancel.
	_, err = io.ReadAll(r.Body)
	require.NoError(t, err)
	st, ok := s.StoredResponse("k1", rid)
	require.True(t, ok)
	assert.Equal(t, StatusCancelled, st.Status)
	assert.Equal(t, 1, st.Events)
}

func TestBackgroundStreamAndFaults(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	_, evs, err := k.turn(body(t, []any{userMsg("both")}, map[string]any{"background": true, "store": true}))
	require.NoError(t, err)
	id := completedResponse(t, evs)["id"].(string)
	st, ok := s.StoredResponse("k1", id)
	require.True(t, ok)
	assert.True(t, st.Background)
	assert.Equal(t, StatusCompleted, st.Status)
	assert.Equal(t, len(evs), st.Events)

	resp, _, raw := k.call(http.MethodPost, "/responses", body(t, []any{userMsg("x")}, map[string]any{"background": true, "store": false}), nil)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", raw)

	// A cut on GET ...?stream=true cuts the replay, not the response.
	_, err = s.AddFault(Fault{Kind: FaultCutStream, Route: RouteResponseGet, Events: 2, Times: 1})
	require.NoError(t, err)
	r := k.do(testCtx(t, timeoutLong), http.MethodGet, k.base+"/responses/"+id+"?stream=true", nil, nil)
	got, err := readSSE(r.Body)
	r.Body.Close()
	assert.Error(t, err)
	assert.Len(t, got, 2)
	_, err = s.AddFault(Fault{Kind: FaultRateLimit, Route: RouteResponseGet, Times: 1})
	require.NoError(t, err)
	resp, _, _ = k.call(http.MethodGet, "/responses/"+id, nil, nil)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	resp, _, _ = k.call(http.MethodGet, "/responses/"+id, nil, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
