package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
)

// maxEmbeddingDimensions bounds dimensions, as the largest model does.
const maxEmbeddingDimensions = 3072

// handleEmbeddings serves POST {p}/embeddings: input a string, a list of
// strings, a list of token ids or a list of such lists; one unit vector per
// input, the same for the same text and model whatever the account (1536
// dimensions, 3072 for a "-large" model, or dimensions). encoding_format
// "base64" gives the vector as base64 of little-endian float32s.
func (s *Server) handleEmbeddings(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteEmbeddings, "")
		if c == nil {
			return
		}
		var req struct {
			Input          json.RawMessage `json:"input"`
			Model          string          `json:"model"`
			Dimensions     *int            `json:"dimensions"`
			EncodingFormat string          `json:"encoding_format"`
		}
		if !c.readJSON(&req) {
			return
		}
		c.ref.update(func(rec *Record) { rec.Model = req.Model })
		if req.Model == "" {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'model'.", "model"))
			return
		}
		inputs, tokens, problem := embeddingInputs(req.Input)
		if problem != "" {
			c.fail(http.StatusBadRequest, invalidRequest(problem, "input"))
			return
		}
		dims := 1536
		if strings.Contains(req.Model, "-large") {
			dims = 3072
		}
		if req.Dimensions != nil {
			dims = *req.Dimensions
			if dims < 1 || dims > maxEmbeddingDimensions {
				c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'dimensions': %d is not between 1 and %d.", dims, maxEmbeddingDimensions), "dimensions"))
				return
			}
		}
		format := or(req.EncodingFormat, "float")
		if format != "float" && format != "base64" {
			c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'encoding_format': %q is not float or base64.", format), "encoding_format"))
			return
		}
		data := make([]any, len(inputs))
		for i, in := range inputs {
			vec := embedding(req.Model, in, dims)
			var v any = vec
			if format == "base64" {
				var buf bytes.Buffer
				_ = binary.Write(&buf, binary.LittleEndian, vec)
				v = base64.StdEncoding.EncodeToString(buf.Bytes())
			}
			data[i] = object{"object": "embedding", "index": i, "embedding": v}
		}
		c.answerJSON(http.StatusOK, object{"object": "list", "data": data, "model": req.Model,
			"usage": object{"prompt_tokens": tokens, "total_tokens": tokens}})
	}
}

// embeddingInputs reads an embeddings input as texts (token lists become
// their ids joined by spaces) and counts its tokens (a word-ish four bytes
// of text each, one per token id). A wrong input is the API's sentence
// saying why (problem), not an error: it goes to the client as it is.
func embeddingInputs(raw json.RawMessage) (texts []string, tokens int, problem string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, 0, "Missing required parameter: 'input'."
	}
	textTokens := func(t string) int { return max(1, len(t)/4) }
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, 0, "'input' cannot be an empty string."
		}
		return []string{one}, textTokens(one), ""
	}
	if json.Unmarshal(raw, &texts) == nil && len(texts) > 0 {
		n := 0
		for _, t := range texts {
			if t == "" {
				return nil, 0, "'input' cannot hold an empty string."
			}
			n += textTokens(t)
		}
		return texts, n, ""
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return []string{fmt.Sprint(ids)}, len(ids), ""
	}
	var lists [][]int
	if json.Unmarshal(raw, &lists) == nil && len(lists) > 0 {
		out := make([]string, len(lists))
		n := 0
		for i, l := range lists {
			out[i] = fmt.Sprint(l)
			n += len(l)
		}
		return out, n, ""
	}
	return nil, 0, "Invalid value for 'input': expected a string, an array of strings, an array of token ids or an array of such arrays."
}

// embedding is the deterministic unit vector of a text for a model.
func embedding(model, text string, dims int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(model + "\x00" + text))
	seed := h.Sum64()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	vec := make([]float32, dims)
	var norm float64
	for i := range vec {
		f := rng.NormFloat64()
		vec[i] = float32(f)
		norm += f * f
	}
	norm = math.Sqrt(norm)
	for i := range vec {
		vec[i] = float32(float64(vec[i]) / norm)
	}
	return vec
}
