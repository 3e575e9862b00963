// Package sim is the simulated upstream ("the sim") that the tests,
// the demo and the benchmarks of Codex Relay talk to instead of OpenAI, in
// the spirit of net/http/httptest: a Server is an http.Handler, and
// NewServer starts one on a loopback port.
//
//	up := sim.NewServer(sim.Config{Accounts: []sim.Account{
//		{ID: "a", Kind: sim.KindChatGPT, Organization: "org-1", AccessToken: "at-a", RefreshToken: "rt-a"},
//		{ID: "k", Kind: sim.KindOpenAI, Organization: "org-1", AccessToken: "sk-k"},
//	}})
//	defer up.Close()
//	// point the relay at up.CodexBaseURL() and up.OpenAIBaseURL(), then:
//	recs := up.Records(sim.RecordFilter{Account: "a"})
//
// # What it speaks
//
// For many accounts at once, told apart by bearer token, the sim serves both
// upstream flavours, each over HTTP/SSE (POST) and over WebSocket (GET
// upgrade on the same path; permessage-deflate accepted, 16 MiB messages):
//
//   - the ChatGPT Codex backend, for chatgpt accounts, which must send a
//     matching ChatGPT-Account-Id: /backend-api/codex/responses,
//     /backend-api/codex/responses/compact, /backend-api/codex/models,
//     /backend-api/codex/thread/goal/{get,set,clear} (goals kept per account
//     and thread), and /backend-api/wham/usage;
//   - the OpenAI Responses API, for openai accounts: /v1/responses,
//     /v1/responses/compact, /v1/models;
//   - OAuth: POST /oauth/token with grant_type=refresh_token (form or JSON)
//     issues a new access token and rotates the refresh token; a spent
//     refresh token is refused (401, code refresh_token_reused). See
//     Account.RevokeOldAccessToken and Account.AccessTokenTTL for expiry.
//
// # Objects
//
// Under both prefixes ({p} is /backend-api/codex or /v1; routes lists them
// with their Route constants) the sim also serves what Codex and the OpenAI
// SDKs ask an account for besides responses, in OpenAI's shapes: images
// (POST {p}/images/generations and {p}/images/edits, JSON or multipart; n
// small valid PNGs), files (POST {p}/files multipart, GET {p}/files, GET and
// DELETE {p}/files/{id}, GET {p}/files/{id}/content), ChatGPT's upload flow
// (POST /backend-api/files, a PUT to the upload URL the sim hands out, POST
// /backend-api/files/{id}/uploaded), stored and background responses (GET,
// DELETE {p}/responses/{id}, POST .../cancel, GET .../input_items, GET
// ...?stream=true&starting_after=N), POST {p}/embeddings (deterministic unit
// vectors), POST {p}/audio/transcriptions (multipart) and {p}/audio/speech,
// POST {p}/memories/trace_summarize, the Realtime WebSocket GET {p}/realtime
// and POST {p}/realtime/calls, and POST
// /backend-api/codex/analytics-events/events, which it records and drops
// (a relay must never forward it).
//
// Every object (file, stored response, realtime call) lives on the account
// that created it, as upstream: any other account gets OpenAI's 404 ("No
// such File object: ID", "Response with id 'ID' not found.", with param and
// code null). A response request whose input names a file of another
// account (input_file or input_image with a file_id), or an image edit that
// does, gets the file 404 too: that is how a relay that sends a thread to
// the wrong account is caught. Objects are bounded per account
// (Config.MaxObjects, the oldest dropped) and forgotten by Reset; Files,
// File, StoredResponse, StoredResponses and RealtimeCalls read them.
//
// A response request with store:true is kept; with background:true (and
// stream false or absent) the answer is the response object at once, status
// "queued" while its [[sim:delay]] runs, "in_progress" from response.created,
// then "completed" (or "cancelled" through .../cancel); with stream:true its
// events follow the run, which goes on without the client. An explicit
// "stream": false answers the finished response as JSON; a body without
// stream is still answered with SSE. Over HTTP, previous_response_id finds
// the account's completed stored responses (and only those). Multipart
// bodies are read part by part as they arrive; a file part past
// Config.MaxFileBytes is 413.
//
// Request bodies may be zstd-encoded. The input may be a string (one user
// message) or items, and a message may come without its type and with a
// string content, as the Responses API accepts them; a body of the wrong
// shape is refused with a plain sentence naming the field. A response streams response.created,
// a reasoning item (with encrypted_content), then the output items
// (output_item.added, the deltas, output_item.done) and response.completed
// with the response id and usage. A generate:false request (Codex's
// WebSocket prewarm) gets response.created and response.completed only. An
// input ending in {"type":"compaction_trigger"} gets exactly one compaction
// item; the legacy .../responses/compact route answers {"output":[...]}.
//
// previous_response_id is known only on the WebSocket connection that
// produced the response: over HTTP, on another connection or another
// account, the answer is previous_response_not_found (400, or an error event
// with status 400). Over HTTP the turn state comes in the x-codex-turn-state
// header; over WebSocket as one {"type":"response.metadata"} event per turn
// (a request without client_metadata["x-codex-turn-state"] starts a turn).
// Rate limits come as x-codex-* headers on HTTP answers and on the upgrade,
// and as a codex.rate_limits event before each WebSocket response, in the
// shape the ChatGPT backend uses (see wire.RateLimitsEvent). A prompt cache
// is modelled per account and prompt_cache_key: usage reports the prefix
// shared with the key's previous request as cached_tokens.
//
// # Ciphertext bound to an organisation
//
// Every reasoning and compaction item carries encrypted_content sealed with
// AES-GCM under a key derived from the sim's secret and the account's
// organisation. In a request, ciphertext that the account's organisation did
// not issue, or that was changed, is refused: reasoning and compaction with
// 400 invalid_encrypted_content; ciphertext a relay cannot strip (a message
// or tool call with its own encrypted_content, emitted by accounts with
// SealMessages or SealToolCalls, or under [[sim:seal]]) with a 400 that has
// no code and says "could not be decrypted". EncryptedContent and Decrypt
// let tests build and read such ciphertext.
//
// # Directives
//
// The model is scripted by directives in the text of the last user message
// of the request, so the real Codex CLI does real work (Directives lists
// them with an example each; codex-relay sim --help prints that list):
//
//	[[sim:tool NAME {"json":"args"}]]  call tool NAME (a function call with those
//	                                   arguments; for a tool the request offers as
//	                                   "custom", the text after NAME is its input;
//	                                   NS.NAME: function NAME in namespace tool NS).
//	                                   Repeat it for several calls in one response.
//	[[sim:words N]]                    answer with N words
//	[[sim:events N]]                   stream the answer in N output_text.delta events
//	[[sim:delay 200ms]]                wait before the first event
//	[[sim:gap 10ms]]                   wait between events
//	[[sim:seal]]                       seal this answer's message and tool calls
//
// Codex 0.169.0 offers exec_command {"cmd": ...} for an unknown model slug,
// so `[[sim:tool exec_command {"cmd":"echo hi"}]]` makes it run a command.
// When a request carries tool outputs (function_call_output or
// custom_tool_call_output with a call_id) after its last user message, the
// answer is "Tool results:" followed by each output, which lets a test see
// that the tool really ran. A plain prompt is answered "Simulated reply to:
// PROMPT", the same whatever the account. An unknown or malformed directive
// is answered 400, so a typo fails loudly.
//
// # Faults and control
//
// Faults (see FaultKind) are installed at start (Config.Faults), from Go
// (AddFault) or through the control API, and are precise: each counts the
// requests it matches and fires after After of them, Times times (zero:
// forever), on every request it is due for or, with Rate, on a random
// fraction of them. A fault with a Route applies to that route instead of
// the response requests (see Fault.Route): error kinds answer with their
// status, cut_stream drops the connection mid-body, stall sends the headers
// and then nothing. Accounts, faults and records are managed the same ways; the
// control API, JSON over HTTP under /_sim/, is listed at controlRoutes:
// GET|POST /_sim/accounts, GET|DELETE /_sim/accounts/{id}, GET|POST|DELETE
// /_sim/faults, DELETE /_sim/faults/{id}, GET|DELETE /_sim/records (filters:
// account, kind, transport, route, thread, session, conn, since) and POST
// /_sim/reset. It has no authentication: the sim is a loopback test tool.
//
// # Records
//
// Every HTTP request, WebSocket handshake and WebSocket message is recorded
// (Record): when, which account, which transport and path, the identity
// headers, the body fields that matter (model, prompt_cache_key,
// previous_response_id, generate, input item types, tool outputs), whether
// Authorization carried a relay client key (crk_...), and the outcome
// (status, error, response id, events sent, fault); a request to an object
// route also names its object (ObjectID) and the files its body refers to
// (FileIDs), and a Realtime client event its type (MessageType). A record is finished
// before the client can see the end of its answer, so a test may read it as
// soon as its client has. Records and Requests return copies and are safe
// for concurrent use.
//
// # Lifetime
//
// Every wait has a deadline or ends with the client or with Close, every
// goroutine belongs to a request or a connection, and Close ends every
// stream and connection before it returns. Stream faults (cut, stall) abort
// the HTTP answer with http.ErrAbortHandler, so serve the sim with net/http,
// not by calling ServeHTTP on a recorder.
package sim
