package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/relay"
)

// openAIAccount is an OpenAI API account of the sim.
func openAIAccount(id string) sim.Account {
	return sim.Account{ID: id, Kind: sim.KindOpenAI, AccessToken: "sk-" + id, Organization: "org-" + id}
}

// upload sends a multipart file upload to base+"/files" and returns the
// status and the decoded answer.
func upload(t *testing.T, base, name string, content []byte) (int, map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	require.NoError(t, mw.WriteField("purpose", "user_data"))
	fw, err := mw.CreateFormFile("file", name)
	require.NoError(t, err)
	_, err = fw.Write(content)
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	req, err := http.NewRequest(http.MethodPost, base+"/files", &buf)
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	return doJSON(t, req)
}

// doJSON sends req (with a deadline) and decodes its JSON answer.
func doJSON(t *testing.T, req *http.Request) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var m map[string]any
	if len(b) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	} else {
		m = map[string]any{"_raw": string(b)}
	}
	return resp.StatusCode, m
}

func call(t *testing.T, method, url string, body string) (int, map[string]any) {
	t.Helper()
	return doJSON(t, jsonRequest(t, method, url, body))
}

// errorType and errorCode are the "type" and "code" of an OpenAI error
// answer.
func errorType(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["type"].(string)
	return s
}

func errorCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// waitRoute waits for the request log row of route (and object id, when
// given) and returns it.
func waitRoute(t *testing.T, st *store.Store, route, object string) store.RequestRecord {
	t.Helper()
	var got store.RequestRecord
	require.Eventually(t, func() bool {
		rows, _, err := st.Requests(context.Background(), store.RequestFilter{Limit: 500})
		require.NoError(t, err)
		for _, r := range rows {
			if r.Route == route && (object == "" || r.ObjectID == object) {
				got = r
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "the %s request was logged", route)
	return got
}

// A file uploaded through the relay lives on the account that took it:
// through either prefix and either replica, every later request naming it
// goes there (another account would answer 404); with that account paused
// the answer is 409 object_on_unavailable_account, never another account's
// 404; an id the relay never saw is 404 without any account being asked;
// a deleted file is forgotten. On SQLite and PostgreSQL.
func TestFilesLiveOnTheirAccount(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			url := storetest.SQLiteURL(t)
			if db == "postgres" {
				url = storetest.PostgresURL(t)
			}
			h := newHarnessOn(t, url, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2"), openAIAccount("k3")}, Logger: testLogger(t)},
				func(*harness, *relay.Config) {})
			// Replica B: another relay on the same database, its own memory.
			b := relay.New(relay.Config{Store: h.store, Logger: testLogger(t)})
			bsrv := httptest.NewServer(b)
			t.Cleanup(func() { b.Close(); bsrv.Close() })

			content := []byte("hello from a file\x00\x01 binary too")
			code, f := upload(t, h.srv.URL+"/v1", "notes.bin", content)
			require.Equal(t, http.StatusOK, code, "%v", f)
			id, _ := f["id"].(string)
			require.NotEmpty(t, id)
			var owner string
			for _, a := range []string{"k1", "k2", "k3"} {
				if _, _, ok := h.sim.File(a, id); ok {
					owner = a
				}
			}
			require.NotEmpty(t, owner, "the file is on one account of the sim")
			row := waitRoute(t, h.store, "files.create", id)
			assert.Equal(t, h.ids[owner], row.AccountID)

			for i, base := range []string{h.srv.URL + "/v1", bsrv.URL + "/v1", h.srv.URL + "/backend-api/codex", bsrv.URL + "/backend-api/codex"} {
				code, got := call(t, http.MethodGet, base+"/files/"+id, "")
				require.Equal(t, http.StatusOK, code, "read %d: %v", i, got)
				assert.Equal(t, id, got["id"])
				code, raw := call(t, http.MethodGet, base+"/files/"+id+"/content", "")
				require.Equal(t, http.StatusOK, code, "content %d: %v", i, raw)
				assert.Equal(t, string(content), raw["_raw"])
			}
			code, list := call(t, http.MethodGet, bsrv.URL+"/v1/files", "")
			require.Equal(t, http.StatusOK, code, "%v", list)
			data, _ := list["data"].([]any)
			require.Len(t, data, 1, "the key's one file, from its account")
			assert.Equal(t, id, data[0].(map[string]any)["id"])

			before := len(h.sim.Records(sim.RecordFilter{}))
			code, got := call(t, http.MethodGet, h.srv.URL+"/v1/files/file-nevermadehere", "")
			assert.Equal(t, http.StatusNotFound, code)
			assert.Equal(t, "not_found", errorCode(got))
			assert.Len(t, h.sim.Records(sim.RecordFilter{}), before, "no account was asked for an unknown id")

			_, err := h.store.SetAccountStatus(context.Background(), h.ids[owner], store.StatusPaused, "maintenance by ops", time.Time{})
			require.NoError(t, err)
			for _, base := range []string{h.srv.URL + "/v1", bsrv.URL + "/backend-api/codex"} {
				code, got = call(t, http.MethodGet, base+"/files/"+id, "")
				assert.Equal(t, http.StatusConflict, code, "%v", got)
				assert.Equal(t, "object_on_unavailable_account", errorType(got))
				assert.Equal(t, "object_on_unavailable_account", errorCode(got))
				msg, _ := got["error"].(map[string]any)["message"].(string)
				assert.NotContains(t, msg, h.ids[owner], "the message names no account")
				assert.NotContains(t, msg, "maintenance", "nor what an operator wrote")
			}
			_, err = h.store.SetAccountStatus(context.Background(), h.ids[owner], store.StatusActive, "", time.Time{})
			require.NoError(t, err)

			code, got = call(t, http.MethodDelete, bsrv.URL+"/v1/files/"+id, "")
			require.Equal(t, http.StatusOK, code, "%v", got)
			assert.Equal(t, true, got["deleted"])
			code, got = call(t, http.MethodGet, h.srv.URL+"/v1/files/"+id, "")
			assert.Equal(t, http.StatusNotFound, code, "%v", got)
			assert.Equal(t, "not_found", errorCode(got))
		})
	}
}

// A Responses request whose input references a file made through the
// relay goes to the file's account (the sim answers 404 elsewhere), over
// HTTP; with that account paused it is refused 409, not sent elsewhere.
func TestReferencedFilePlacesTheThread(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2")}, Logger: testLogger(t)}, nil2)
	code, f := upload(t, h.srv.URL+"/v1", "doc.txt", []byte("the document"))
	require.Equal(t, http.StatusOK, code, "%v", f)
	id := f["id"].(string)
	owner := "k1"
	if _, _, ok := h.sim.File("k2", id); ok {
		owner = "k2"
	}
	body := `{"model":"gpt-5.1","stream":true,"input":[{"type":"message","role":"user","content":[` +
		`{"type":"input_file","file_id":"` + id + `"},{"type":"input_text","text":"summarise it"}]}]}`
	for i := range 4 {
		code, got := call(t, http.MethodPost, h.srv.URL+"/v1/responses", body)
		require.Equal(t, http.StatusOK, code, "turn %d: %v", i, got)
		assert.Contains(t, got["_raw"], "response.completed", "turn %d", i)
	}
	for _, r := range h.sim.Records(sim.RecordFilter{Route: sim.RouteResponses}) {
		assert.Equal(t, owner, r.Account, "every turn went to the file's account")
	}
	_, err := h.store.SetAccountStatus(context.Background(), h.ids[owner], store.StatusPaused, "", time.Time{})
	require.NoError(t, err)
	code, got := call(t, http.MethodPost, h.srv.URL+"/v1/responses", body)
	assert.Equal(t, http.StatusConflict, code, "%v", got)
	assert.Equal(t, "object_on_unavailable_account", errorCode(got))
}

// Image generation over both prefixes: a 429 or a 5xx from one account
// moves the request to the next before the client sees anything; the
// answer is the image, and the request log row names the route.
func TestImagesFailOverBeforeAnswering(t *testing.T) {
	t.Parallel()
	for _, fault := range []sim.FaultKind{sim.FaultRateLimit, sim.FaultServerError} {
		t.Run(string(fault), func(t *testing.T) {
			t.Parallel()
			h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{simAccount("a1", "org-a"), simAccount("a2", "org-a")}, Logger: testLogger(t),
				Faults: []sim.Fault{{Kind: fault, Route: sim.RouteImagesGenerations, Times: 1}}}, nil2)
			for _, prefix := range []string{"/backend-api/codex", "/v1"} {
				code, got := call(t, http.MethodPost, h.srv.URL+prefix+"/images/generations",
					`{"prompt":"a lighthouse at dawn","model":"gpt-image-1.5","n":1,"size":"1024x1024"}`)
				require.Equal(t, http.StatusOK, code, "%s: %v", prefix, got)
				data, _ := got["data"].([]any)
				require.Len(t, data, 1)
				assert.NotEmpty(t, data[0].(map[string]any)["b64_json"])
			}
			recs := h.sim.Records(sim.RecordFilter{Route: sim.RouteImagesGenerations})
			require.Len(t, recs, 3, "one refused, then each served")
			assert.NotEqual(t, recs[0].Account, recs[1].Account, "the refused request moved to the other account")
			row := waitRoute(t, h.store, "images.generations", "")
			assert.Equal(t, http.StatusOK, row.Status)
		})
	}
}

// A cut in the middle of a file's content breaks the client's answer: it
// never reads a short file as a whole one.
func TestCutFileContentBreaksTheAnswer(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t),
		Faults: []sim.Fault{{Kind: sim.FaultCutStream, Route: sim.RouteFileContent, Times: 1}}}, nil2)
	content := bytes.Repeat([]byte("0123456789"), 20000)
	code, f := upload(t, h.srv.URL+"/v1", "big.bin", content)
	require.Equal(t, http.StatusOK, code, "%v", f)
	id := f["id"].(string)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.URL+"/v1/files/"+id+"/content", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Error(t, err, "the cut reached the client as a broken answer (%d bytes read)", len(b))
	assert.Less(t, len(b), len(content))

	code, got := call(t, http.MethodGet, h.srv.URL+"/v1/files/"+id+"/content", "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, string(content), got["_raw"], "read whole once the fault is spent")
}

// Codex's analytics events are the relay's: accepted, and never forwarded.
func TestAnalyticsAreDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	for _, path := range []string{"/backend-api/codex/analytics-events/events"} {
		code, _ := call(t, http.MethodPost, h.srv.URL+path, `{"events":[{"event_type":"codex_turn","event_params":{}}]}`)
		assert.Equal(t, http.StatusAccepted, code)
	}
	assert.Empty(t, h.sim.Records(sim.RecordFilter{Route: sim.RouteAnalytics}), "nothing went upstream")
}

// A background response is created on one account and read, listed and
// cancelled there, through either replica; its usage is charged once.
func TestBackgroundResponseStaysOnItsAccount(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2")}, Logger: testLogger(t)}, nil2)
	b := relay.New(relay.Config{Store: h.store, Logger: testLogger(t)})
	bsrv := httptest.NewServer(b)
	t.Cleanup(func() { b.Close(); bsrv.Close() })

	code, created := call(t, http.MethodPost, h.srv.URL+"/v1/responses",
		`{"model":"gpt-5.1","background":true,"store":true,"input":"[[sim:words 5]] hello"}`)
	require.Equal(t, http.StatusOK, code, "%v", created)
	id, _ := created["id"].(string)
	require.NotEmpty(t, id)
	var status string
	require.Eventually(t, func() bool {
		code, got := call(t, http.MethodGet, bsrv.URL+"/v1/responses/"+id, "")
		require.Equal(t, http.StatusOK, code, "%v", got)
		status, _ = got["status"].(string)
		return status == "completed"
	}, 30*time.Second, 20*time.Millisecond)
	code, items := call(t, http.MethodGet, bsrv.URL+"/v1/responses/"+id+"/input_items", "")
	require.Equal(t, http.StatusOK, code, "%v", items)
	code, again := call(t, http.MethodGet, h.srv.URL+"/v1/responses/"+id, "")
	require.Equal(t, http.StatusOK, code, "%v", again)

	rows, _, err := h.store.Requests(context.Background(), store.RequestFilter{Limit: 100})
	require.NoError(t, err)
	var charged int
	require.Eventually(t, func() bool {
		rows, _, err = h.store.Requests(context.Background(), store.RequestFilter{Limit: 100})
		require.NoError(t, err)
		n := 0
		for _, r := range rows {
			if r.Route == "responses.get" {
				n++
			}
		}
		return n >= 2
	}, time.Minute, 20*time.Millisecond)
	for _, r := range rows {
		if r.Route == "responses.get" && r.TotalTokens > 0 {
			charged++
		}
	}
	assert.Equal(t, 1, charged, "the finished response's usage is charged by one read only")
	accounts := map[string]bool{}
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.ObjectID == id || r.Route == sim.RouteResponses {
			accounts[r.Account] = true
		}
	}
	assert.Len(t, accounts, 1, "every request on the response went to its account")
}

// The official OpenAI JS SDK's object calls through the relay with a
// client key, against an API-key account: files (upload, retrieve, list,
// content, a Responses request referencing the file, delete, then a 404),
// images (generate, a multipart edit), embeddings, and a background
// response polled to completion. The key never goes upstream.
func TestOpenAIJSObjectCalls(t *testing.T) {
	t.Parallel()
	argv := nodeSDK(t)
	argv[1] = repoFile(t, "relay/testdata/openai-sdk/objects.mjs")
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2")}, Logger: testLogger(t)}, nil2)
	_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "sdk"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "OPENAI_BASE_URL=" + h.srv.URL + "/v1",
		"OPENAI_API_KEY=" + key, "MODEL=gpt-5.5-codex", "NO_PROXY=*"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	lines := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		lines[m["case"].(string)] = m
	}
	ok := func(name string) map[string]any {
		m := lines[name]
		require.NotNil(t, m, "case %s ran", name)
		require.Nil(t, m["error"], "case %s: %v", name, m["error"])
		return m
	}
	created := ok("files_create")
	id := created["id"].(string)
	assert.Equal(t, "file", created["object"])
	assert.Equal(t, float64(2600), created["bytes"])
	assert.Equal(t, id, ok("files_retrieve")["id"])
	assert.Equal(t, []any{id}, ok("files_list")["ids"])
	assert.Equal(t, true, ok("files_content")["same"])
	assert.Equal(t, "completed", ok("responses_with_file")["status"])
	assert.Equal(t, true, ok("files_delete")["deleted"])
	gone := lines["files_gone"]["error"].(map[string]any)
	assert.Equal(t, float64(404), gone["status"])
	assert.Equal(t, "not_found", gone["code"])
	assert.Equal(t, float64(2), ok("images_generate")["images"])
	assert.Equal(t, true, ok("images_generate")["b64"])
	assert.Equal(t, float64(1), ok("images_edit")["images"])
	emb := ok("embeddings")
	assert.Equal(t, float64(2), emb["vectors"])
	assert.Positive(t, emb["dims"])
	bg := ok("background")
	assert.Equal(t, "queued", bg["first"])
	assert.Equal(t, "completed", bg["status"])
	assert.NotEmpty(t, bg["text"])
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		assert.False(t, r.ClientKey, "the client key never goes upstream (%s)", r.Route)
	}
	for _, route := range []string{"files.create", "files.get", "files.list", "files.content", "files.delete", "images.generations", "images.edits", "embeddings", "responses.create", "responses.get", "responses.input_items"} {
		waitRoute(t, h.store, route, "")
	}
}

// A response streamed with store: true is an object of its account: read
// through another replica (whose memory never saw it) it goes there, and
// reading it charges nothing again.
func TestStoredResponseReadThroughAnotherReplica(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2"), openAIAccount("k3")}, Logger: testLogger(t)}, nil2)
	b := relay.New(relay.Config{Store: h.store, Logger: testLogger(t)})
	bsrv := httptest.NewServer(b)
	t.Cleanup(func() { b.Close(); bsrv.Close() })
	code, got := call(t, http.MethodPost, h.srv.URL+"/v1/responses", `{"model":"gpt-5.1","store":true,"input":"[[sim:words 3]] keep this"}`)
	require.Equal(t, http.StatusOK, code, "%v", got)
	id := got["id"].(string)
	served := h.sim.Records(sim.RecordFilter{Route: sim.RouteResponses})
	require.Len(t, served, 1)
	for range 3 {
		code, again := call(t, http.MethodGet, bsrv.URL+"/v1/responses/"+id, "")
		require.Equal(t, http.StatusOK, code, "%v", again)
		assert.Equal(t, id, again["id"])
	}
	for _, r := range h.sim.Records(sim.RecordFilter{Route: sim.RouteResponseGet}) {
		assert.Equal(t, served[0].Account, r.Account, "read where it was made")
	}
	require.Eventually(t, func() bool {
		rows, _, err := h.store.Requests(context.Background(), store.RequestFilter{Limit: 100})
		require.NoError(t, err)
		n := 0
		for _, r := range rows {
			if r.Route == "responses.get" {
				n++
				assert.Zero(t, r.TotalTokens, "a read charges nothing")
			}
		}
		return n == 3
	}, time.Minute, 20*time.Millisecond)
}

// Codex's own upload flow at its chatgpt_base_url: the relay forwards the
// create to a ChatGPT account, the client puts the bytes where the answer
// says (not through the relay), and "uploaded" goes to the same account.
func TestChatGPTFileUploadFlow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"), simAccount("a3", "org-a"))
	content := []byte("attachment bytes")
	code, created := call(t, http.MethodPost, h.srv.URL+"/backend-api/files",
		`{"file_name":"pic.txt","file_size":16,"use_case":"codex"}`)
	require.Equal(t, http.StatusOK, code, "%v", created)
	id, _ := created["file_id"].(string)
	put, _ := created["upload_url"].(string)
	require.NotEmpty(t, id)
	require.True(t, strings.HasPrefix(put, h.sim.URL), "the bytes go to the upstream's store, not through the relay: %s", put)
	req, err := http.NewRequest(http.MethodPut, put, bytes.NewReader(content))
	require.NoError(t, err)
	req.Header.Set("x-ms-blob-type", "BlockBlob")
	code, _ = doJSON(t, req)
	require.Equal(t, http.StatusCreated, code)
	for range 3 {
		code, done := call(t, http.MethodPost, h.srv.URL+"/backend-api/files/"+id+"/uploaded", `{}`)
		require.Equal(t, http.StatusOK, code, "%v", done)
		assert.Equal(t, "success", done["status"])
	}
	var accounts []string
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Route == sim.RouteFileCreate || r.Route == sim.RouteFileUploaded {
			accounts = append(accounts, r.Account)
		}
	}
	require.Len(t, accounts, 4)
	for _, a := range accounts {
		assert.Equal(t, accounts[0], a, "every step on the account that made the file")
	}
	row := waitRoute(t, h.store, "files.create", id)
	assert.Equal(t, h.ids[accounts[0]], row.AccountID)
}

// The object routes are admitted like a turn: a key's model allow-list
// refuses a model it does not list (nothing goes upstream), and the
// client key never goes upstream.
func TestObjectRoutesHoldTheKeysModels(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)}, nil2)
	_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "images", Models: []string{"gpt-image-1.5"}})
	require.NoError(t, err)
	post := func(body string) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/images/generations", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		return doJSON(t, req)
	}
	code, got := post(`{"prompt":"a fox","model":"dall-e-3"}`)
	assert.Equal(t, http.StatusForbidden, code, "%v", got)
	assert.Equal(t, "model_not_allowed", errorCode(got))
	assert.Empty(t, h.sim.Records(sim.RecordFilter{Route: sim.RouteImagesGenerations}), "nothing went upstream")
	code, got = post(`{"prompt":"a fox","model":"gpt-image-1.5"}`)
	require.Equal(t, http.StatusOK, code, "%v", got)
	recs := h.sim.Records(sim.RecordFilter{Route: sim.RouteImagesGenerations})
	require.Len(t, recs, 1)
	assert.False(t, recs[0].ClientKey, "the client key never goes upstream")
}

// An upload past MaxUploadBytes is refused 413, whether it says its
// length up front or streams without one (chunked: cut where it passes
// the limit).
func TestUploadPastItsLimit(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)},
		func(_ *harness, c *relay.Config) { c.MaxUploadBytes = 4 << 10 })
	big := bytes.Repeat([]byte("x"), 64<<10)
	code, got := upload(t, h.srv.URL+"/v1", "big.bin", big)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, "%v", got)

	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	require.NoError(t, mw.WriteField("purpose", "user_data"))
	fw, err := mw.CreateFormFile("file", "big.bin")
	require.NoError(t, err)
	_, err = fw.Write(big)
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/files", io.MultiReader(&buf)) // no length: chunked
	require.NoError(t, err)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	code, got = doJSON(t, req)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, "%v", got)
	assert.Empty(t, h.sim.Files("k1"), "no file was made")

	code, got = upload(t, h.srv.URL+"/v1", "small.bin", []byte("small"))
	assert.Equal(t, http.StatusOK, code, "%v", got)
}

// multipartBody builds a multipart upload: fields in order (a field named
// "file" or "image" is a file part of that content), and its Content-Type.
func multipartBody(t *testing.T, fields ...[2]string) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range fields {
		if f[0] == "file" || f[0] == "image" {
			fw, err := mw.CreateFormFile(f[0], f[0]+".bin")
			require.NoError(t, err)
			_, err = io.WriteString(fw, f[1])
			require.NoError(t, err)
			continue
		}
		require.NoError(t, mw.WriteField(f[0], f[1]))
	}
	require.NoError(t, mw.Close())
	return &buf, mw.FormDataContentType()
}

// The model of a streamed upload (an image edit, a transcription) is a
// multipart field, checked against the key's models as the body streams
// (after a large file too, with no length said up front): a model the key
// may not use, none at all, an alias (not rewritten in an upload) or a
// body that is not multipart is refused, and the account never gets a
// whole request; an allowed model goes through.
func TestUploadsHoldTheKeysModels(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)}, nil2)
	_, key, err := h.store.CreateClientKey(context.Background(), store.ClientKey{Name: "uploads",
		Models: []string{"gpt-image-2", "gpt-4o-transcribe"}, Policy: store.KeyPolicy{ModelAliases: map[string]string{"pic": "gpt-image-2"}}})
	require.NoError(t, err)
	big := strings.Repeat("x", 2<<20)
	send := func(path string, chunked bool, fields ...[2]string) (int, map[string]any) {
		body, ct := multipartBody(t, fields...)
		var r io.Reader = body
		if chunked {
			r = io.MultiReader(body) // no length: chunked
		}
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1"+path, r)
		require.NoError(t, err)
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Authorization", "Bearer "+key)
		return doJSON(t, req)
	}
	answered := func(route sim.Route) int {
		n := 0
		for _, r := range h.sim.Records(sim.RecordFilter{Route: route}) {
			if r.Status == http.StatusOK {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		name    string
		path    string
		chunked bool
		fields  [][2]string
		status  int
		code    string
	}{
		{"a model the key may not use, after the image", "/images/edits", false,
			[][2]string{{"image", big}, {"prompt", "a fox"}, {"model", "dall-e-2"}}, http.StatusForbidden, "model_not_allowed"},
		{"the same, chunked", "/images/edits", true,
			[][2]string{{"image", big}, {"model", "dall-e-2"}, {"prompt", "a fox"}}, http.StatusForbidden, "model_not_allowed"},
		{"no model", "/images/edits", false, [][2]string{{"image", "img"}, {"prompt", "a fox"}}, http.StatusForbidden, "model_not_allowed"},
		{"an alias", "/images/edits", false, [][2]string{{"model", "pic"}, {"image", "img"}, {"prompt", "a fox"}}, http.StatusBadRequest, "model_alias_in_upload"},
		{"a transcription model the key may not use", "/audio/transcriptions", false,
			[][2]string{{"file", big}, {"model", "whisper-1"}}, http.StatusForbidden, "model_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got := send(tc.path, tc.chunked, tc.fields...)
			assert.Equal(t, tc.status, code, "%v", got)
			assert.Equal(t, tc.code, errorCode(got), "%v", got)
		})
	}
	assert.Zero(t, answered(sim.RouteImagesEdits), "no refused edit reached the account whole")
	assert.Zero(t, answered(sim.RouteTranscriptions))

	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/images/edits", strings.NewReader("raw bytes"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	code, got := doJSON(t, req)
	assert.Equal(t, http.StatusUnsupportedMediaType, code, "%v", got)

	code, got = send("/images/edits", true, [2]string{"image", big}, [2]string{"prompt", "a fox"}, [2]string{"model", "gpt-image-2"})
	require.Equal(t, http.StatusOK, code, "%v", got)
	code, got = send("/audio/transcriptions", false, [2]string{"model", "gpt-4o-transcribe"}, [2]string{"file", big})
	require.Equal(t, http.StatusOK, code, "%v", got)
	assert.Equal(t, 1, answered(sim.RouteImagesEdits))
	assert.Equal(t, 1, answered(sim.RouteTranscriptions))
	rec := waitRoute(t, h.store, "images.edits", "")
	assert.Equal(t, http.StatusOK, rec.Status)
}

// sseEvents reads SSE events from r until stop holds for one (or the
// stream ends), each as its decoded data.
func sseEvents(t *testing.T, r io.Reader, stop func(map[string]any) bool) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		out = append(out, ev)
		if stop != nil && stop(ev) {
			break
		}
	}
	return out
}

// A background response streamed (stream: true) is an object from its
// response.created: the client leaves the stream early, and reads it on
// through another replica (GET ?stream=true&starting_after=N) from the
// account that runs it, to its completion; the usage is charged once, by
// the read that saw it finish, and not again by a later read.
func TestBackgroundStreamLeftAndReadOn(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2")}, Logger: testLogger(t)}, nil2)
	b := relay.New(relay.Config{Store: h.store, Logger: testLogger(t)})
	bsrv := httptest.NewServer(b)
	t.Cleanup(func() { b.Close(); bsrv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/responses", strings.NewReader(
		`{"model":"gpt-5.1","background":true,"stream":true,"store":true,"input":"[[sim:events 30]] [[sim:gap 20ms]] hello"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var id string
	first := sseEvents(t, resp.Body, func(ev map[string]any) bool {
		if r, ok := ev["response"].(map[string]any); ok && id == "" {
			id, _ = r["id"].(string)
		}
		return ev["type"] == "response.output_text.delta"
	})
	resp.Body.Close() // the client leaves mid-answer
	require.NotEmpty(t, id, "the stream named its response")
	last := first[len(first)-1]
	require.Equal(t, "response.output_text.delta", last["type"])
	after := int(last["sequence_number"].(float64))

	get, err := http.NewRequestWithContext(ctx, http.MethodGet,
		bsrv.URL+"/v1/responses/"+id+"?stream=true&starting_after="+strconv.Itoa(after), nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(get)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rest := sseEvents(t, resp.Body, nil)
	resp.Body.Close()
	require.NotEmpty(t, rest)
	assert.Equal(t, float64(after+1), rest[0]["sequence_number"], "the stream goes on where the client left it")
	assert.Equal(t, "response.completed", rest[len(rest)-1]["type"])

	charged := func(rows int) map[string]int {
		var all []store.RequestRecord
		require.Eventually(t, func() bool {
			var err error
			all, _, err = h.store.Requests(context.Background(), store.RequestFilter{Limit: 100})
			require.NoError(t, err)
			return len(all) >= rows
		}, time.Minute, 20*time.Millisecond)
		out := map[string]int{}
		for _, r := range all {
			if r.TotalTokens > 0 {
				out[r.Route]++
			}
		}
		return out
	}
	assert.Equal(t, map[string]int{"responses.get": 1}, charged(2), "charged by the streamed read that saw it finish")

	code, again := call(t, http.MethodGet, h.srv.URL+"/v1/responses/"+id, "")
	require.Equal(t, http.StatusOK, code, "%v", again)
	assert.Equal(t, "completed", again["status"])
	assert.Equal(t, map[string]int{"responses.get": 1}, charged(3), "and not again by a later read")
	accounts := map[string]bool{}
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		accounts[r.Account] = true
	}
	assert.Len(t, accounts, 1, "every request on the response went to its account")
}

// The Responses API's own image tool (image_generation, which Codex
// Desktop offers with some providers, and which peers have refused) is a
// tool like any: the request goes upstream with it unchanged, over both
// prefixes.
func TestImageGenerationToolPassesThrough(t *testing.T) {
	t.Parallel()
	h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1")}, Logger: testLogger(t)}, nil2)
	for _, prefix := range []string{"/v1", "/backend-api/codex"} {
		code, got := call(t, http.MethodPost, h.srv.URL+prefix+"/responses", `{"model":"gpt-5.5","stream":false,"input":"draw a fox",`+
			`"tools":[{"type":"image_generation","quality":"low","size":"1024x1024"},{"type":"function","name":"f","parameters":{}}]}`)
		require.Equal(t, http.StatusOK, code, "%v", got)
	}
	recs := h.sim.Records(sim.RecordFilter{Route: sim.RouteResponses})
	require.Len(t, recs, 2)
	for _, r := range recs {
		assert.Equal(t, []string{"image_generation", "function"}, r.ToolTypes, "the tools went upstream as sent")
	}
}
