// Package relay is the request path: it authenticates Codex, derives the
// identities a request carries, admits it under its key's policy and
// budget, selects an account, attempts the request upstream, decides once
// what the attempt's end means, and answers, recording what the request
// leaves behind. Everything Codex calls goes through one attempt loop,
// whatever its transport.
//
// The map, file by file, in the order a request meets them:
//
// Entry and transports
//   - server.go: Config, New, the routes (ServeHTTP), Run's housekeeping,
//     Close and Drain, the live WebSocket sessions (sessionCount).
//   - responses.go: POST .../responses and /compact over HTTP/SSE.
//   - websocket.go: a client WebSocket session, its turns one at a time.
//   - chat_handler.go, openai_json.go, passthrough.go, models.go: Chat
//     Completions (translated by package relay/chat), the JSON document
//     other OpenAI clients read, /models and the goal routes.
//   - stream.go, sse.go: the client side of one request (clientStream),
//     and its SSE implementation; body.go reads a body within its limits.
//
// Identity and admission
//   - identity.go: session, thread and the derived thread key (seed 004).
//   - auth.go: client keys, keyless loopback mode, a key's use counted
//     where the request is served.
//   - policy.go: the key's model policy (aliases, reasoning effort,
//     priority tier); spend.go: its budget (admission, settlement).
//   - limits.go: what the client is told of its limits (the key's, or
//     the pool's room for it) in place of the serving account's figures;
//     usage_route.go: the usage routes Codex's /status asks.
//   - request.go: a request as admitted; compaction.go: how a request is
//     recognised as a compaction; metadata.go: client_metadata edits.
//   - forward.go, replicas.go: a thread's requests served by the replica
//     holding its lane, over a signed hop; heartbeats and announcements.
//
// Selection
//   - evidence.go, owners.go: hard evidence (turn state, previous response,
//     pins) and soft preferences, and who issued which id.
//   - selection.go: the balancer and the binding plan, pure.
//   - choose.go: one choice: accounts, bindings and evidence read, an
//     account selected and claimed; retire.go: seed 003's owner
//     retirement; fallback.go: the fallback group.
//
// Attempt
//   - attempts.go: the loop, choose -> attempt -> decide -> act, and the
//     request's log row.
//   - plan.go: what one attempt sends, and where.
//   - attempt.go: one attempt over a lane or HTTP, its result, and the
//     client failure and record built from its facts.
//   - attempt_lane.go, attempt_http.go: the two ways upstream; pump.go
//     forwards one stream's events; tracker.go follows what it carries.
//   - upstream.go, upgrade.go, compression.go, lanes.go: the upstream
//     clients, lane dials, permessage-deflate, the lanes operators see.
//
// Decide
//   - classify.go: how an attempt ended (its class, penalty, base action),
//     pure.
//   - decide.go: the one decision step over the request's state (tries):
//     seed 000's ciphertext recovery and mismatch switching (recovery.go),
//     seed 002's failover, token refresh and fallback, the switch budget.
//   - answer.go: every error a client gets, in one place (failureFor).
//
// Settle
//   - settle.go: what a completed response leaves behind: owners,
//     continuity, bindings, usage windows, the account back in service.
//   - writebehind.go: the batched writers behind the requests (request
//     log, bindings retried, usage windows, key use).
//   - metrics.go: the Prometheus series.
package relay
