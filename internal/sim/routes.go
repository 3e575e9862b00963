package sim

import "net/http"

// routes lists every route of the sim. {p} is /backend-api/codex
// (chatgpt accounts, ChatGPT-Account-Id required) or /v1 (openai accounts);
// each route's Route constant names it in the records and in faults.
//
//	ChatGPT Codex backend only:
//	  POST /backend-api/codex/thread/goal/{get,set,clear}
//	  GET  /backend-api/wham/usage                      usage windows
//	  POST /backend-api/files                           ChatGPT upload: {file_name,file_size,use_case} -> {file_id,upload_url}
//	  PUT  /_sim/blob/{id}?sig=                         the upload URL (no bearer; x-ms-blob-type: BlockBlob); GET downloads
//	  POST /backend-api/files/{id}/uploaded             {"status":"retry"|"success",download_url,...}
//	  POST /backend-api/codex/analytics-events/events   recorded and dropped (a relay must never forward it)
//	Both prefixes:
//	  POST   {p}/responses                  SSE (JSON for "stream":false; store and background kept)
//	  GET    {p}/responses                  WebSocket upgrade
//	  POST   {p}/responses/compact          legacy compaction, JSON
//	  GET    {p}/responses/{id}             a stored response (?stream=true&starting_after=N: its events)
//	  DELETE {p}/responses/{id}
//	  POST   {p}/responses/{id}/cancel      background responses only
//	  GET    {p}/responses/{id}/input_items
//	  GET    {p}/models                     {"models":[...]} or the OpenAI list
//	  POST   {p}/images/generations, {p}/images/edits (JSON or multipart)
//	  POST   {p}/files (multipart); GET {p}/files; GET|DELETE {p}/files/{id}; GET {p}/files/{id}/content
//	  POST   {p}/embeddings
//	  POST   {p}/audio/transcriptions (multipart), {p}/audio/speech
//	  POST   {p}/memories/trace_summarize
//	  GET    {p}/realtime                   Realtime WebSocket upgrade
//	  POST   {p}/realtime/calls             SDP offer in, SDP answer out, the call in Location
//	OAuth:
//	  POST /oauth/token                                 grant_type=refresh_token
//	Control API: /_sim/... (see controlRoutes)
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for prefix, kind := range map[string]Kind{"/backend-api/codex": KindChatGPT, "/v1": KindOpenAI} {
		mux.HandleFunc("POST "+prefix+"/responses", s.handleResponses(kind))
		mux.HandleFunc("GET "+prefix+"/responses", s.handleWebSocket(kind))
		mux.HandleFunc("POST "+prefix+"/responses/compact", s.handleCompact(kind))
		mux.HandleFunc("GET "+prefix+"/responses/{id}", s.handleStoredResponse(kind, RouteResponseGet))
		mux.HandleFunc("DELETE "+prefix+"/responses/{id}", s.handleStoredResponse(kind, RouteResponseDelete))
		mux.HandleFunc("POST "+prefix+"/responses/{id}/cancel", s.handleStoredResponse(kind, RouteResponseCancel))
		mux.HandleFunc("GET "+prefix+"/responses/{id}/input_items", s.handleStoredResponse(kind, RouteResponseInput))
		mux.HandleFunc("GET "+prefix+"/models", s.handleModels(kind))
		mux.HandleFunc("POST "+prefix+"/images/generations", s.handleImages(kind, RouteImagesGenerations))
		mux.HandleFunc("POST "+prefix+"/images/edits", s.handleImages(kind, RouteImagesEdits))
		mux.HandleFunc("POST "+prefix+"/files", s.handleFileUpload(kind))
		mux.HandleFunc("GET "+prefix+"/files", s.handleFileList(kind))
		mux.HandleFunc("GET "+prefix+"/files/{id}", s.handleFile(kind, RouteFileGet))
		mux.HandleFunc("GET "+prefix+"/files/{id}/content", s.handleFile(kind, RouteFileContent))
		mux.HandleFunc("DELETE "+prefix+"/files/{id}", s.handleFile(kind, RouteFileDelete))
		mux.HandleFunc("POST "+prefix+"/embeddings", s.handleEmbeddings(kind))
		mux.HandleFunc("POST "+prefix+"/audio/transcriptions", s.handleTranscriptions(kind))
		mux.HandleFunc("POST "+prefix+"/audio/speech", s.handleSpeech(kind))
		mux.HandleFunc("POST "+prefix+"/memories/trace_summarize", s.handleMemories(kind))
		mux.HandleFunc("GET "+prefix+"/realtime", s.handleRealtime(kind))
		mux.HandleFunc("POST "+prefix+"/realtime/calls", s.handleRealtimeCalls(kind))
	}
	mux.HandleFunc("POST /backend-api/codex/thread/goal/{op}", s.handleGoal)
	mux.HandleFunc("GET /backend-api/wham/usage", s.handleUsage)
	mux.HandleFunc("POST /backend-api/files", s.handleBackendFileCreate)
	mux.HandleFunc("POST /backend-api/files/{id}/uploaded", s.handleBackendFileUploaded)
	mux.HandleFunc("PUT "+controlPrefix+"/blob/{id}", s.handleBlob)
	mux.HandleFunc("GET "+controlPrefix+"/blob/{id}", s.handleBlob)
	mux.HandleFunc("POST /backend-api/codex/analytics-events/events", s.handleAnalytics)
	s.deviceRoutes(mux) // POST /oauth/token (every grant), device-code login, /_sim/deviceauth
	s.controlRoutes(mux)
	mux.HandleFunc("/", s.handleUnknown)
	return mux
}
