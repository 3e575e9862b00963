package relay

import (
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// modelsClientVersion is the Codex version the relay names when it asks a
// ChatGPT account for its models on an OpenAI client's behalf: the ChatGPT
// backend lists the models of a Codex version (the newest pinned one).
const modelsClientVersion = "0.171.0"

// Model is one entry of the OpenAI model list.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelList is the OpenAI list shape of GET /v1/models.
type modelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// parseModels reads an upstream's model list in either shape: the OpenAI
// list ({"data":[{"id",...}]}) or the ChatGPT backend's Codex shape
// ({"models":[{"slug",...}]}). ok is false when it is neither.
func parseModels(b []byte) ([]Model, bool) {
	var doc struct {
		Data   []Model `json:"data"`
		Models []struct {
			Slug string `json:"slug"`
		} `json:"models"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return nil, false
	}
	switch {
	case doc.Data != nil:
		out := doc.Data[:0]
		for _, m := range doc.Data {
			if m.ID != "" {
				m.Object, m.OwnedBy = "model", cmp.Or(m.OwnedBy, "openai")
				out = append(out, m)
			}
		}
		return out, true
	case doc.Models != nil:
		out := make([]Model, 0, len(doc.Models))
		for _, m := range doc.Models {
			if m.Slug != "" {
				out = append(out, Model{ID: m.Slug, Object: "model", OwnedBy: "openai"})
			}
		}
		return out, true
	}
	return nil, false
}

// modelsForKey is the list a client key sees: the upstream's models that
// its allow-list admits (every one without an allow-list), then the
// allowed models the upstream did not list, then the key's aliases, each
// name once. The added entries are owned by "codex-relay".
func modelsForKey(upstream []Model, k store.ClientKey) []Model {
	out := make([]Model, 0, len(upstream))
	seen := map[string]bool{}
	add := func(m Model) {
		if !seen[m.ID] {
			seen[m.ID] = true
			out = append(out, m)
		}
	}
	for _, m := range upstream {
		if len(k.Models) == 0 || slices.Contains(k.Models, m.ID) {
			add(m)
		}
	}
	for _, id := range k.Models {
		add(Model{ID: id, Object: "model", OwnedBy: "codex-relay"})
	}
	aliases := make([]string, 0, len(k.Policy.ModelAliases))
	for a := range k.Policy.ModelAliases {
		aliases = append(aliases, a)
	}
	sort.Strings(aliases)
	for _, a := range aliases {
		add(Model{ID: a, Object: "model", OwnedBy: "codex-relay"})
	}
	return out
}

// serveModelList answers GET /v1/models in the OpenAI list shape, whatever
// kind of account ch is: the account's own list (a ChatGPT account's Codex
// shape converted), seen through the client key's allow-list and aliases.
// When the account cannot list its models, a key that names its models
// still gets those; otherwise the client gets the error.
func (s *Server) serveModelList(w http.ResponseWriter, r *http.Request, cl client, ch choice) {
	q := r.URL.Query()
	if ch.target.Account.Kind == store.KindChatGPT && q.Get("client_version") == "" {
		q.Set("client_version", modelsClientVersion)
	}
	u := ch.target.URL("/models")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var upstream []Model
	listed := false
	status, fail := http.StatusBadGateway, wire.Error{Type: wire.TypeServerError, Code: "upstream_unexpected_answer",
		Message: "the upstream account could not list its models"}
	resp, err := s.cfg.Upstream.get(r.Context(), ch.target, u, r.Header)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		s.log.Warn("upstream unreachable", "account", ch.target.Account.ID, "err", err)
		f := failUnreachable()
		status, fail = f.status, f.err
	} else {
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		passHeaders(w.Header(), resp.Header)
		switch {
		case rerr != nil:
		case resp.StatusCode == http.StatusOK:
			upstream, listed = parseModels(b)
		default:
			status, fail = openAIFailure(screenAnswer(resp.StatusCode, nil, b, s.cfg.Now()))
		}
	}
	if !listed && len(cl.key.Models) == 0 && len(cl.key.Policy.ModelAliases) == 0 {
		writeError(w, status, fail)
		return
	}
	b := mustJSON(modelList{Object: "list", Data: modelsForKey(upstream, cl.key)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
