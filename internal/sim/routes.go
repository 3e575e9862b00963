package sim

import "net/http"

// routes lists every route of the sim.
//
//	ChatGPT Codex backend (chatgpt accounts, ChatGPT-Account-Id required):
//	  POST /backend-api/codex/responses                 SSE response
//	  GET  /backend-api/codex/responses                 WebSocket upgrade
//	  POST /backend-api/codex/responses/compact         legacy compaction, JSON
//	  GET  /backend-api/codex/models                    {"models":[...]}
//	  POST /backend-api/codex/thread/goal/{get,set,clear}
//	  GET  /backend-api/wham/usage                      usage windows
//	OpenAI Responses API (openai accounts):
//	  POST /v1/responses, GET /v1/responses (WebSocket), POST /v1/responses/compact, GET /v1/models
//	OAuth:
//	  POST /oauth/token                                 grant_type=refresh_token
//	Control API: /_sim/... (see controlRoutes)
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for prefix, kind := range map[string]Kind{"/backend-api/codex": KindChatGPT, "/v1": KindOpenAI} {
		mux.HandleFunc("POST "+prefix+"/responses", s.handleResponses(kind))
		mux.HandleFunc("GET "+prefix+"/responses", s.handleWebSocket(kind))
		mux.HandleFunc("POST "+prefix+"/responses/compact", s.handleCompact(kind))
		mux.HandleFunc("GET "+prefix+"/models", s.handleModels(kind))
	}
	mux.HandleFunc("POST /backend-api/codex/thread/goal/{op}", s.handleGoal)
	mux.HandleFunc("GET /backend-api/wham/usage", s.handleUsage)
	s.deviceRoutes(mux) // POST /oauth/token (every grant), device-code login, /_sim/deviceauth
	s.controlRoutes(mux)
	mux.HandleFunc("/", s.handleUnknown)
	return mux
}
