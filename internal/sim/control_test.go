package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// control calls the control API and decodes the JSON answer into out.
func control(t *testing.T, upstream *Server, method, path, body string, out any) int {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, upstream.ControlURL()+path, r)
	require.NoError(t, err)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, out), "%s", b)
	}
	return resp.StatusCode
}

func TestControlAPI(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{Accounts: []Account{}})

	// Accounts: add one, add a list, get, list, replace, remove.
	var added []AccountState
	require.Equal(t, 200, control(t, upstream, "POST", "/accounts",
		`{"id":"x1","kind":"chatgpt","organization":"org-q","access_token":"at-x1","refresh_token":"rt-x1","primary":{"used_percent":12}}`, &added))
	require.Len(t, added, 1)
	assert.Equal(t, "x1", added[0].ChatGPTAccountID, "defaults applied")
	assert.Equal(t, 12.0, added[0].Usage.Primary.UsedPercent)
	require.Equal(t, 200, control(t, upstream, "POST", "/accounts",
		`[{"id":"x2","kind":"openai","access_token":"sk-x2"},{"id":"x3","access_token":"at-x3","seal_messages":true}]`, &added))
	require.Len(t, added, 2)
	var all []AccountState
	require.Equal(t, 200, control(t, upstream, "GET", "/accounts", "", &all))
	assert.Equal(t, []string{"x1", "x2", "x3"}, []string{all[0].ID, all[1].ID, all[2].ID})
	var one AccountState
	require.Equal(t, 200, control(t, upstream, "GET", "/accounts/x3", "", &one))
	assert.True(t, one.SealMessages)
	assert.Equal(t, 404, control(t, upstream, "GET", "/accounts/nope", "", nil))

	_, _, err := clientFor(t, upstream, "x1").turn(prompt(t, "hi"))
	require.NoError(t, err)
	require.Equal(t, 200, control(t, upstream, "POST", "/accounts", `{"id":"x1","access_token":"at-x1-new"}`, &added))
	assert.Equal(t, 1, added[0].Requests, "replacing an account keeps its counters")
	c := clientFor(t, upstream, "x1")
	c.token = "at-x1"
	_, _, err = c.turn(prompt(t, "hi"))
	status, _ := errorOf(t, err)
	assert.Equal(t, http.StatusUnauthorized, status, "the replaced token no longer works")

	assert.Equal(t, 400, control(t, upstream, "POST", "/accounts", `{"id":"x4","access_token":"at-x4","colour":"red"}`, nil), "unknown fields are refused")
	assert.Equal(t, 400, control(t, upstream, "POST", "/accounts", `{"id":"x5","access_token":"sk-x2"}`, nil), "tokens are unique")
	assert.Equal(t, 400, control(t, upstream, "POST", "/accounts", `{"id":"x6"}`, nil))
	assert.Equal(t, 400, control(t, upstream, "POST", "/accounts", `[{"id":"x7","access_token":"a"},{"id":"x8","access_token":"a"}]`, nil))
	_, ok := upstream.Account("x7")
	assert.False(t, ok, "a refused batch adds nothing")

	assert.Equal(t, http.StatusNoContent, control(t, upstream, "DELETE", "/accounts/x3", "", nil))
	assert.Equal(t, 404, control(t, upstream, "DELETE", "/accounts/x3", "", nil))

	// Faults: add, list, fire, remove, clear.
	var faults []FaultState
	require.Equal(t, 200, control(t, upstream, "POST", "/faults", `{"kind":"server_error","status":502,"account":"x2","times":1}`, &faults))
	require.Len(t, faults, 1)
	id := faults[0].ID
	_, _, err = clientFor(t, upstream, "x2").turn(prompt(t, "hi"))
	status, _ = errorOf(t, err)
	assert.Equal(t, 502, status)
	require.Equal(t, 200, control(t, upstream, "GET", "/faults", "", &faults))
	assert.Equal(t, 1, faults[0].Fired)
	assert.False(t, faults[0].Active)
	assert.Equal(t, 400, control(t, upstream, "POST", "/faults", `{"kind":"bogus"}`, nil))
	assert.Equal(t, 400, control(t, upstream, "POST", "/faults", `{"kind":"stall","evnets":3}`, nil))
	require.Equal(t, 200, control(t, upstream, "POST", "/faults", `[{"kind":"stall","events":1},{"kind":"cut_stream","max_age":"1s","retry_after":2.5}]`, &faults))
	require.Len(t, faults, 2)
	assert.Equal(t, Duration(2500_000_000), faults[1].RetryAfter, "durations read as strings or seconds")
	assert.Equal(t, http.StatusNoContent, control(t, upstream, "DELETE", "/faults/"+itoa(id), "", nil))
	assert.Equal(t, 404, control(t, upstream, "DELETE", "/faults/"+itoa(id), "", nil))
	assert.Len(t, upstream.Faults(), 2)
	assert.Equal(t, http.StatusNoContent, control(t, upstream, "DELETE", "/faults", "", nil))
	assert.Empty(t, upstream.Faults())

	// Records: filters, clear.
	var recs []Record
	require.Equal(t, 200, control(t, upstream, "GET", "/records?account=x2&route=responses", "", &recs))
	require.Len(t, recs, 1)
	assert.Equal(t, 502, recs[0].Status)
	require.Equal(t, 200, control(t, upstream, "GET", "/records?kind=http&transport=http&since="+itoa(int(recs[0].Seq)), "", &recs))
	for _, r := range recs {
		assert.Greater(t, r.Seq, int64(0))
	}
	assert.Equal(t, 400, control(t, upstream, "GET", "/records?since=x", "", nil))
	assert.Equal(t, http.StatusNoContent, control(t, upstream, "DELETE", "/records", "", nil))
	require.Equal(t, 200, control(t, upstream, "GET", "/records", "", &recs))
	assert.Empty(t, recs)

	// Reset: records, faults, counters go; accounts stay.
	_, _, err = clientFor(t, upstream, "x2").turn(prompt(t, "hi"))
	require.NoError(t, err)
	_, err = upstream.AddFault(Fault{Kind: FaultStall})
	require.NoError(t, err)
	assert.Equal(t, http.StatusNoContent, control(t, upstream, "POST", "/reset", "", nil))
	assert.Empty(t, upstream.Records(RecordFilter{}))
	assert.Empty(t, upstream.Faults())
	st, ok := upstream.Account("x2")
	require.True(t, ok)
	assert.Zero(t, st.Requests)
	_, _, err = clientFor(t, upstream, "x2").turn(prompt(t, "hi"))
	require.NoError(t, err)
}

func TestRecordsAreSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	upstream := newSim(t, Config{MaxRecords: 50})
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			acct := []string{"a1", "a2", "b1", "k1"}[i%4]
			_, _, err := clientFor(t, upstream, acct).turn(prompt(t, "parallel"))
			assert.NoError(t, err)
		})
		wg.Go(func() { _ = upstream.Records(RecordFilter{Account: "a1"}) })
	}
	// And a WebSocket client alongside.
	wg.Go(func() {
		ctx := context.Background()
		conn := clientFor(t, upstream, "a2").mustDial(ctx)
		for range 10 {
			_, err := wsTurn(ctx, t, conn, prompt(t, "ws"))
			assert.NoError(t, err)
		}
	})
	wg.Wait()
	all := upstream.Records(RecordFilter{})
	assert.Len(t, all, 50, "bounded by MaxRecords, oldest dropped")
	assert.Equal(t, int64(2), all[0].Seq, "51 records (40 HTTP, a handshake, 10 messages): the first is dropped")
	total := 0
	for _, id := range []string{"a1", "a2", "b1", "k1"} {
		st, _ := upstream.Account(id)
		total += st.Requests
	}
	assert.Equal(t, 50, total)
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
