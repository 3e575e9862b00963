package sim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// call sends a request to path under the client's prefix and decodes a
// JSON answer (nil when it is not JSON); it returns the answer too, its
// body read.
func (c *client) call(method, path string, body []byte, h http.Header) (*http.Response, map[string]any, []byte) {
	c.t.Helper()
	resp := c.do(testCtx(c.t, timeoutLong), method, c.base+path, body, h)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(c.t, json.Unmarshal(raw, &m), "%s", raw)
	}
	return resp, m, raw
}

const timeoutLong = 30e9 // 30s: every wait of these tests has this deadline

// jsonBody marshals v.
func jsonBody(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// form builds a multipart body: fields, then one file part per file
// (field name, file name, bytes).
func form(t testing.TB, fields map[string]string, files ...[3]string) ([]byte, http.Header) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for k, v := range fields {
		require.NoError(t, mw.WriteField(k, v))
	}
	for _, f := range files {
		w, err := mw.CreateFormFile(f[0], f[1])
		require.NoError(t, err)
		_, err = w.Write([]byte(f[2]))
		require.NoError(t, err)
	}
	require.NoError(t, mw.Close())
	return buf.Bytes(), http.Header{"Content-Type": {mw.FormDataContentType()}}
}

// upload uploads a file through POST {p}/files and returns its id.
func (c *client) upload(name, content string) string {
	c.t.Helper()
	b, h := form(c.t, map[string]string{"purpose": "user_data"}, [3]string{"file", name, content})
	resp, m, raw := c.call(http.MethodPost, "/files", b, h)
	require.Equal(c.t, http.StatusOK, resp.StatusCode, "%s", raw)
	return m["id"].(string)
}

// assertNotFound asserts the exact 404 of the API's object routes.
func assertNotFound(t testing.TB, resp *http.Response, raw []byte, message, param string) {
	t.Helper()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", raw)
	var p any
	if param != "" {
		p = param
	}
	want := map[string]any{"error": map[string]any{"message": message, "type": "invalid_request_error", "param": p, "code": nil}}
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, want, got)
}

func TestImagesGenerationsOnBothPrefixes(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, id := range []string{"a1", "k1"} {
		c := clientFor(t, s, id)
		resp, m, raw := c.call(http.MethodPost, "/images/generations", jsonBody(t, map[string]any{
			"prompt": "a red fox", "model": "gpt-image-1.5", "n": 2, "size": "1024x1536", "quality": "high", "background": "transparent"}), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		assert.Equal(t, "1024x1536", m["size"])
		assert.Equal(t, "high", m["quality"])
		assert.Equal(t, "transparent", m["background"])
		assert.Equal(t, "png", m["output_format"])
		assert.NotZero(t, m["created"])
		data := m["data"].([]any)
		require.Len(t, data, 2)
		img, err := base64.StdEncoding.DecodeString(data[0].(map[string]any)["b64_json"].(string))
		require.NoError(t, err)
		_, err = png.Decode(bytes.NewReader(img))
		require.NoError(t, err, "a valid PNG")
		usage := m["usage"].(map[string]any)
		details := usage["input_tokens_details"].(map[string]any)
		assert.EqualValues(t, 3, details["text_tokens"])
		assert.EqualValues(t, usage["input_tokens"].(float64)+usage["output_tokens"].(float64), usage["total_tokens"])
		recs := s.Records(RecordFilter{Account: id, Route: RouteImagesGenerations})
		require.Len(t, recs, 1)
		assert.Equal(t, "gpt-image-1.5", recs[0].Model)
		assert.Equal(t, http.StatusOK, recs[0].Status)

		resp, _, raw = c.call(http.MethodPost, "/images/generations", jsonBody(t, map[string]any{"model": "gpt-image-1.5"}), nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Contains(t, string(raw), "'prompt'")
	}
}

func TestImageEditsJSONAndMultipart(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k, a := clientFor(t, s, "k1"), clientFor(t, s, "a1")

	// Codex's JSON shape, with a data URL and a file of the account.
	fileID := k.upload("cat.png", "png bytes")
	edit := jsonBody(t, map[string]any{"prompt": "add a hat", "model": "gpt-image-1.5",
		"images": []any{map[string]any{"image_url": "data:image/png;base64,Zm9v"}, map[string]any{"file_id": fileID}}})
	resp, m, raw := k.call(http.MethodPost, "/images/edits", edit, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	assert.EqualValues(t, 512, m["usage"].(map[string]any)["input_tokens_details"].(map[string]any)["image_tokens"])
	recs := s.Records(RecordFilter{Route: RouteImagesEdits})
	require.Len(t, recs, 1)
	assert.Equal(t, []string{fileID}, recs[0].FileIDs)

	// The same file named through another account is that account's 404.
	s2 := clientFor(t, s, "a2")
	resp, _, raw = s2.call(http.MethodPost, "/images/edits", edit, nil)
	assertNotFound(t, resp, raw, "No such File object: "+fileID, "id")

	// OpenAI's multipart shape.
	b, h := form(t, map[string]string{"prompt": "add a hat", "model": "gpt-image-1.5", "n": "3"},
		[3]string{"image[]", "a.png", "one"}, [3]string{"image[]", "b.png", "two"})
	resp, m, raw = a.call(http.MethodPost, "/images/edits", b, h)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	assert.Len(t, m["data"], 3)
	assert.EqualValues(t, 512, m["usage"].(map[string]any)["input_tokens_details"].(map[string]any)["image_tokens"])

	b, h = form(t, map[string]string{"prompt": "add a hat"})
	resp, _, raw = a.call(http.MethodPost, "/images/edits", b, h)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(raw), "'image'")
}

func TestFilesLifecycleAndIsolation(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	for _, pair := range [][2]string{{"k1", "a1"}, {"a1", "a2"}} {
		owner, other := clientFor(t, s, pair[0]), clientFor(t, s, pair[1])
		b, h := form(t, map[string]string{"purpose": "assistants"}, [3]string{"file", "notes.txt", "hello world"})
		resp, m, raw := owner.call(http.MethodPost, "/files", b, h)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		id := m["id"].(string)
		assert.True(t, strings.HasPrefix(id, "file-"), id)
		assert.Equal(t, "file", m["object"])
		assert.EqualValues(t, 11, m["bytes"])
		assert.Equal(t, "notes.txt", m["filename"])
		assert.Equal(t, "assistants", m["purpose"])
		assert.Equal(t, "processed", m["status"])
		assert.Contains(t, m, "expires_at")
		assert.Nil(t, m["expires_at"])

		resp, got, _ := owner.call(http.MethodGet, "/files/"+id, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, m, got)
		resp, _, content := owner.call(http.MethodGet, "/files/"+id+"/content", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello world", string(content))

		resp, list, _ := owner.call(http.MethodGet, "/files?purpose=assistants", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "list", list["object"])
		assert.Equal(t, false, list["has_more"])
		assert.Equal(t, id, list["first_id"])
		require.Len(t, list["data"], 1)
		_, list, _ = owner.call(http.MethodGet, "/files?purpose=batch", nil, nil)
		assert.Empty(t, list["data"])

		for _, p := range []string{"/files/" + id, "/files/" + id + "/content"} {
			resp, _, raw := other.call(http.MethodGet, p, nil, nil)
			assertNotFound(t, resp, raw, "No such File object: "+id, "id")
		}
		resp, _, raw = other.call(http.MethodDelete, "/files/"+id, nil, nil)
		assertNotFound(t, resp, raw, "No such File object: "+id, "id")
		_, list, _ = other.call(http.MethodGet, "/files", nil, nil)
		assert.Empty(t, list["data"])

		files := s.Files(pair[0])
		require.Len(t, files, 1)
		assert.Equal(t, id, files[0].ID)
		_, data, ok := s.File(pair[0], id)
		require.True(t, ok)
		assert.Equal(t, "hello world", string(data))

		recs := s.Records(RecordFilter{Account: pair[1], Route: RouteFileGet})
		require.NotEmpty(t, recs)
		assert.Equal(t, id, recs[0].ObjectID, "the record names the object")

		resp, del, _ := owner.call(http.MethodDelete, "/files/"+id, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, map[string]any{"id": id, "object": "file", "deleted": true}, del)
		resp, _, raw = owner.call(http.MethodGet, "/files/"+id, nil, nil)
		assertNotFound(t, resp, raw, "No such File object: "+id, "id")
	}
}

func TestFileUploadIsBoundedAndStreamed(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{MaxFileBytes: 1000})
	k := clientFor(t, s, "k1")
	b, h := form(t, map[string]string{"purpose": "user_data"}, [3]string{"file", "big.bin", strings.Repeat("x", 1001)})
	resp, _, raw := k.call(http.MethodPost, "/files", b, h)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", raw)
	assert.Empty(t, s.Files("k1"))

	// A body that arrives in pieces is read as it comes: the sim answers
	// once the last piece is in, with every byte counted.
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		_ = mw.WriteField("purpose", "user_data")
		w, _ := mw.CreateFormFile("file", "parts.bin")
		for range 10 {
			_, _ = w.Write(bytes.Repeat([]byte("y"), 100))
		}
		_ = mw.Close()
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(testCtx(t, timeoutLong), http.MethodPost, k.base+"/files", pr)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+k.token)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	r, err := k.hc.Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, http.StatusOK, r.StatusCode)
	files := s.Files("k1")
	require.Len(t, files, 1)
	assert.EqualValues(t, 1000, files[0].Bytes)
}

func TestBackendFileUploadFlow(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	a := clientFor(t, s, "a1")
	backend := s.URL + "/backend-api"
	post := func(c *client, path string, body []byte) (*http.Response, map[string]any) {
		resp := c.do(testCtx(t, timeoutLong), http.MethodPost, backend+path, body, nil)
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp, m
	}
	resp, created := post(a, "/files", jsonBody(t, map[string]any{"file_name": "hello.txt", "file_size": 5, "use_case": "codex"}))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	id, uploadURL := created["file_id"].(string), created["upload_url"].(string)
	require.True(t, strings.HasPrefix(uploadURL, s.URL+"/_sim/blob/"+id+"?sig="), uploadURL)

	_, fin := post(a, "/files/"+id+"/uploaded", []byte(`{}`))
	assert.Equal(t, map[string]any{"status": "retry"}, fin, "not yet PUT")

	put := func(url string, body string, blobType string) int {
		req, err := http.NewRequestWithContext(testCtx(t, timeoutLong), http.MethodPut, url, strings.NewReader(body))
		require.NoError(t, err)
		if blobType != "" {
			req.Header.Set("x-ms-blob-type", blobType)
		}
		resp, err := a.hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusBadRequest, put(uploadURL, "hello", ""), "x-ms-blob-type is required")
	assert.Equal(t, http.StatusForbidden, put(strings.Replace(uploadURL, "sig=", "sig=x", 1), "hello", "BlockBlob"))
	assert.Equal(t, http.StatusRequestEntityTooLarge, put(uploadURL, "hello!", "BlockBlob"))
	assert.Equal(t, http.StatusCreated, put(uploadURL, "hello", "BlockBlob"))

	_, fin = post(a, "/files/"+id+"/uploaded", []byte(`{}`))
	assert.Equal(t, "success", fin["status"])
	assert.Equal(t, "hello.txt", fin["file_name"])
	assert.Equal(t, "text/plain; charset=utf-8", fin["mime_type"])
	assert.EqualValues(t, 5, fin["file_size_bytes"])
	dl, err := a.hc.Get(fin["download_url"].(string))
	require.NoError(t, err)
	got, _ := io.ReadAll(dl.Body)
	dl.Body.Close()
	assert.Equal(t, "hello", string(got))

	// The file is the account's: usable in a response, a 404 elsewhere.
	_, evs, err := a.turn(body(t, []any{map[string]any{"type": "message", "role": "user",
		"content": []any{map[string]any{"type": "input_file", "file_id": id}, map[string]any{"type": "input_text", "text": "read it"}}}}, nil))
	require.NoError(t, err)
	assert.NotEmpty(t, find(evs, wire.EventResponseCompleted))
	resp, _ = post(clientFor(t, s, "a2"), "/files/"+id+"/uploaded", []byte(`{}`))
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Len(t, s.Files("a1"), 1)
	assert.Empty(t, s.Files("a2"))
	assert.Len(t, s.Records(RecordFilter{Route: RouteFileBlob, Account: "a1"}), 4, "three PUTs and the download; the bad signature names no account")
}

func TestResponseInputFileOfAnotherAccountIs404(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	id := k.upload("doc.pdf", "%PDF")
	req := body(t, []any{map[string]any{"type": "message", "role": "user", "content": []any{
		map[string]any{"type": "input_image", "file_id": id}, map[string]any{"type": "input_text", "text": "look"}}}}, nil)
	_, evs, err := k.turn(req)
	require.NoError(t, err)
	assert.NotEmpty(t, find(evs, wire.EventResponseCompleted))
	rec := s.Requests(RecordFilter{Account: "k1"})
	require.Len(t, rec, 1)
	assert.Equal(t, []string{id}, rec[0].FileIDs)

	for _, other := range []string{"a1", "a2"} {
		c := clientFor(t, s, other)
		resp := c.postResponses(context.Background(), req, nil)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assertNotFound(t, resp, raw, "No such File object: "+id, "id")
	}
	// Over WebSocket the same refusal is an error event with status 404.
	a := clientFor(t, s, "a1")
	conn := a.mustDial(testCtx(t, timeoutLong))
	evs, err = wsTurn(testCtx(t, timeoutLong), t, conn, req)
	require.NoError(t, err)
	require.Equal(t, []string{wire.EventError}, types(evs))
	assert.EqualValues(t, 404, evs[0].M["status"])
}

func TestObjectRoutesAuthenticateAsResponses(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	a := clientFor(t, s, "a1")
	a.token = "wrong"
	resp, _, _ := a.call(http.MethodGet, "/files", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	a = clientFor(t, s, "a1")
	a.headers.Del(wire.HeaderChatGPTAccountID)
	resp, _, _ = a.call(http.MethodPost, "/embeddings", jsonBody(t, map[string]any{"input": "x", "model": "m"}), nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a chatgpt account needs its ChatGPT-Account-Id")
	k := clientFor(t, s, "k1")
	k.base = s.CodexBaseURL()
	resp, _, _ = k.call(http.MethodGet, "/files", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an API key is not valid on the ChatGPT backend")
}

func TestObjectRouteFaults(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	emb := jsonBody(t, map[string]any{"input": "hello", "model": "text-embedding-3-small"})

	_, err := s.AddFault(Fault{Kind: FaultRateLimit, Route: RouteEmbeddings, Times: 1})
	require.NoError(t, err)
	resp, m, raw := k.call(http.MethodPost, "/embeddings", emb, nil)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", raw)
	assert.Equal(t, wire.CodeRateLimitExceeded, m["error"].(map[string]any)["code"])
	assert.NotEmpty(t, resp.Header.Get(wire.HeaderPrimaryUsedPercent), "the rate-limit headers come with it")
	resp, _, _ = k.call(http.MethodPost, "/embeddings", emb, nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the fault fired once")

	// A fault on one route leaves the others (and /responses) alone.
	_, err = s.AddFault(Fault{Kind: FaultServerError, Status: 503, Route: RouteImagesGenerations, Account: "k1"})
	require.NoError(t, err)
	resp, _, _ = k.call(http.MethodPost, "/images/generations", jsonBody(t, map[string]any{"prompt": "p"}), nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	_, _, err = k.turn(prompt(t, "hi"))
	require.NoError(t, err)
	resp, _, _ = clientFor(t, s, "a1").call(http.MethodPost, "/images/generations", jsonBody(t, map[string]any{"prompt": "p"}), nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another account")
	s.ClearFaults()

	// Cut: the headers and half the body, then the connection drops.
	_, err = s.AddFault(Fault{Kind: FaultCutStream, Route: RouteEmbeddings, Times: 1})
	require.NoError(t, err)
	r := k.do(testCtx(t, timeoutLong), http.MethodPost, k.base+"/embeddings", emb, nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	_, err = io.ReadAll(r.Body)
	r.Body.Close()
	assert.Error(t, err, "a cut body")
	recs := s.Records(RecordFilter{Route: RouteEmbeddings})
	assert.Equal(t, OutcomeCut, recs[len(recs)-1].Outcome)
	assert.Equal(t, FaultCutStream, recs[len(recs)-1].Fault)

	// Stall: the headers, then nothing until the client leaves.
	id := k.upload("a.txt", "abc")
	_, err = s.AddFault(Fault{Kind: FaultStall, Route: RouteFileContent, Times: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t, timeoutLong))
	r = k.do(ctx, http.MethodGet, k.base+"/files/"+id+"/content", nil, nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	cancel()
	_, err = io.ReadAll(r.Body)
	r.Body.Close()
	assert.Error(t, err)
	waitFor(t, func() bool {
		recs := s.Records(RecordFilter{Route: RouteFileContent})
		return len(recs) == 1 && recs[0].Outcome == OutcomeStalled
	}, "the stalled record")

	_, err = s.AddFault(Fault{Kind: FaultCutStream, Route: "nope"})
	assert.Error(t, err, "an unknown route")
	_, err = s.AddFault(Fault{Kind: FaultRateLimit, Route: RouteFiles, InStream: true})
	assert.Error(t, err, "in-stream on a JSON route")
}

func TestResetForgetsObjects(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	k := clientFor(t, s, "k1")
	k.upload("a.txt", "abc")
	_, _, err := k.turn(body(t, []any{userMsg("keep me")}, map[string]any{"store": true}))
	require.NoError(t, err)
	require.Len(t, s.Files("k1"), 1)
	require.Len(t, s.StoredResponses("k1"), 1)
	resp, err := http.Post(s.ControlURL()+"/reset", "application/json", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, s.Files("k1"))
	assert.Empty(t, s.StoredResponses("k1"))
}

func TestObjectsAreBoundedPerAccount(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{MaxObjects: 2})
	k := clientFor(t, s, "k1")
	first := k.upload("1", "1")
	k.upload("2", "2")
	k.upload("3", "3")
	files := s.Files("k1")
	require.Len(t, files, 2)
	assert.NotEqual(t, first, files[0].ID, "the oldest went first")
}
