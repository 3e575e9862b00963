package relay_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/sim"
)

// objectCase is one object route as a fault test drives it: what it needs
// made first (an object on one account), the request, and how the relay
// treats the call.
type objectCase struct {
	route sim.Route
	// make creates the object the request names, through the relay, and
	// returns its id ("" for a route that names none).
	make func(t *testing.T, base string) string
	// request builds the request for base and the object's id.
	request func(t *testing.T, base, id string) *http.Request
	// movable: the call names no object and its body is in memory, so a
	// failure before its answer reaches the client moves it to the other
	// account. Otherwise the client gets its account's answer.
	movable bool
	// streamed: a successful answer streams through (not JSON read whole),
	// so a cut mid-answer breaks the client's connection.
	streamed bool
}

func jsonRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

func multipartRequest(t *testing.T, url string, fields ...[2]string) *http.Request {
	t.Helper()
	body, ct := multipartBody(t, fields...)
	req, err := http.NewRequest(http.MethodPost, url, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", ct)
	return req
}

// makeFile uploads a file through the relay and returns its id.
func makeFile(t *testing.T, base string) string {
	code, got := upload(t, base, "notes.txt", []byte("some notes"))
	require.Equal(t, http.StatusOK, code, "%v", got)
	id, _ := got["id"].(string)
	require.NotEmpty(t, id)
	return id
}

// makeStored creates a stored response through the relay and returns its
// id.
func makeStored(t *testing.T, base string) string {
	code, got := doJSON(t, jsonRequest(t, http.MethodPost, base+"/responses",
		`{"model":"gpt-5.1","store":true,"stream":false,"input":"hello"}`))
	require.Equal(t, http.StatusOK, code, "%v", got)
	id, _ := got["id"].(string)
	require.NotEmpty(t, id)
	return id
}

var objectCases = []objectCase{
	{route: sim.RouteImagesGenerations, movable: true, request: func(t *testing.T, base, _ string) *http.Request {
		return jsonRequest(t, http.MethodPost, base+"/images/generations", `{"prompt":"a fox","model":"gpt-image-2"}`)
	}},
	{route: sim.RouteImagesEdits, request: func(t *testing.T, base, _ string) *http.Request {
		return multipartRequest(t, base+"/images/edits", [2]string{"image", "png bytes"}, [2]string{"prompt", "a fox"}, [2]string{"model", "gpt-image-2"})
	}},
	{route: sim.RouteEmbeddings, movable: true, request: func(t *testing.T, base, _ string) *http.Request {
		return jsonRequest(t, http.MethodPost, base+"/embeddings", `{"model":"text-embedding-3-small","input":"hello"}`)
	}},
	{route: sim.RouteSpeech, movable: true, streamed: true, request: func(t *testing.T, base, _ string) *http.Request {
		return jsonRequest(t, http.MethodPost, base+"/audio/speech", `{"model":"gpt-4o-mini-tts","input":"hello","voice":"alloy"}`)
	}},
	{route: sim.RouteTranscriptions, request: func(t *testing.T, base, _ string) *http.Request {
		return multipartRequest(t, base+"/audio/transcriptions", [2]string{"model", "gpt-4o-transcribe"}, [2]string{"file", "audio bytes"})
	}},
	{route: sim.RouteFiles, request: func(t *testing.T, base, _ string) *http.Request {
		return multipartRequest(t, base+"/files", [2]string{"purpose", "user_data"}, [2]string{"file", "some notes"})
	}},
	{route: sim.RouteFileGet, make: makeFile, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodGet, base+"/files/"+id, "")
	}},
	{route: sim.RouteFileContent, make: makeFile, streamed: true, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodGet, base+"/files/"+id+"/content", "")
	}},
	{route: sim.RouteFileDelete, make: makeFile, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodDelete, base+"/files/"+id, "")
	}},
	{route: sim.RouteResponseGet, make: makeStored, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodGet, base+"/responses/"+id, "")
	}},
	{route: sim.RouteResponseInput, make: makeStored, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodGet, base+"/responses/"+id+"/input_items", "")
	}},
	{route: sim.RouteResponseDelete, make: makeStored, request: func(t *testing.T, base, id string) *http.Request {
		return jsonRequest(t, http.MethodDelete, base+"/responses/"+id, "")
	}},
}

// Every object route under each fault (a 429, a 5xx, an answer cut
// midway), over both prefixes, against two accounts:
//   - a call that names no object and holds its body moves to the other
//     account and succeeds, whatever broke, as long as nothing reached the
//     client (a cut streamed answer cannot move: the client's connection
//     breaks rather than end short);
//   - a call bound to its object's account, or streaming its upload, gets
//     that account's answer: its 429 or 5xx (as an OpenAI error), or for a
//     cut a clear 502 or, once streaming, a broken connection; the other
//     account is never asked.
func TestObjectRoutesUnderFaults(t *testing.T) {
	t.Parallel()
	for _, oc := range objectCases {
		for _, fault := range []sim.FaultKind{sim.FaultRateLimit, sim.FaultServerError, sim.FaultCutStream} {
			for _, prefix := range []string{"/v1", "/backend-api/codex"} {
				t.Run(string(oc.route)+"/"+string(fault)+prefix, func(t *testing.T) {
					t.Parallel()
					h := newHarnessSim(t, sim.Config{Accounts: []sim.Account{openAIAccount("k1"), openAIAccount("k2")}, Logger: testLogger(t)}, nil2)
					base := h.srv.URL + prefix
					id := ""
					owner := ""
					if oc.make != nil {
						id = oc.make(t, base)
						for _, r := range h.sim.Records(sim.RecordFilter{}) {
							owner = r.Account // the account that made it
						}
						require.NotEmpty(t, owner)
					}
					f := sim.Fault{Kind: fault, Route: oc.route, Times: 1}
					if owner != "" {
						f.Account = owner
					}
					_, err := h.sim.AddFault(f)
					require.NoError(t, err)
					before := len(h.sim.Records(sim.RecordFilter{}))

					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					resp, err := http.DefaultClient.Do(oc.request(t, base, id).WithContext(ctx))
					var body []byte
					if err == nil {
						body, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					asked := map[string]bool{}
					for _, r := range h.sim.Records(sim.RecordFilter{})[before:] {
						if r.Route == oc.route {
							asked[r.Account] = true
						}
					}
					switch {
					case oc.movable && !(fault == sim.FaultCutStream && oc.streamed):
						require.NoError(t, err)
						assert.Equal(t, http.StatusOK, resp.StatusCode, "moved to the other account: %s", body)
						assert.Len(t, asked, 2, "both accounts were asked")
					case fault == sim.FaultCutStream && oc.streamed:
						if err == nil {
							err = errors.New("no error")
						}
						assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a cut mid-stream breaks the client's answer, never ends it short (%s)", body)
						assert.Len(t, asked, 1, "an answer under way is not moved")
					default:
						require.NoError(t, err)
						want := map[sim.FaultKind]int{sim.FaultRateLimit: http.StatusTooManyRequests,
							sim.FaultServerError: http.StatusInternalServerError, sim.FaultCutStream: http.StatusBadGateway}[fault]
						if fault == sim.FaultServerError {
							assert.GreaterOrEqual(t, resp.StatusCode, 500, "%s", body)
						} else {
							assert.Equal(t, want, resp.StatusCode, "%s", body)
						}
						assert.Contains(t, string(body), `"error"`, "an OpenAI error: %s", body)
						assert.Len(t, asked, 1, "only the call's own account was asked")
						if owner != "" {
							assert.True(t, asked[owner], "the object's account answered")
						}
					}
				})
			}
		}
	}
}
