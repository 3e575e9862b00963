package sim

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// imageRequest is the JSON body of POST {p}/images/generations and of
// Codex's JSON image edit; multipart edits fill the same fields.
type imageRequest struct {
	Prompt       string `json:"prompt"`
	Model        string `json:"model"`
	N            *int   `json:"n"`
	Size         string `json:"size"`
	Quality      string `json:"quality"`
	Background   string `json:"background"`
	OutputFormat string `json:"output_format"`
	Images       []struct {
		ImageURL string `json:"image_url"`
		FileID   string `json:"file_id"`
	} `json:"images"`
}

// maxImages is the most images one request may ask for, as the API allows.
const maxImages = 10

// handleImages serves POST {p}/images/generations and POST
// {p}/images/edits. Each answer holds n small valid images (8x8 pixels, a
// colour derived from the prompt) as b64_json, and usage counted from the
// prompt's words and the input images.
func (s *Server) handleImages(kind Kind, route Route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, route, "")
		if c == nil {
			return
		}
		var req imageRequest
		inputImages := 0
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if route == RouteImagesEdits && mt == "multipart/form-data" {
			form, err := c.readMultipart()
			if err != nil {
				c.failBody(err)
				return
			}
			for _, key := range form.order {
				if name := strings.SplitN(key, "#", 2)[0]; name == "image" || name == "image[]" {
					inputImages++
				}
			}
			if inputImages == 0 {
				c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'image'.", "image"))
				return
			}
			req.Prompt, req.Model, req.Size = form.values["prompt"], form.values["model"], form.values["size"]
			req.Quality, req.Background, req.OutputFormat = form.values["quality"], form.values["background"], form.values["output_format"]
			if v, ok := form.values["n"]; ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'n': %q is not an integer.", v), "n"))
					return
				}
				req.N = &n
			}
		} else {
			if !c.readJSON(&req) {
				return
			}
			if route == RouteImagesEdits {
				var fileIDs []string
				for i, im := range req.Images {
					switch {
					case im.FileID != "":
						fileIDs = append(fileIDs, im.FileID)
					case strings.HasPrefix(im.ImageURL, "data:image/"), strings.HasPrefix(im.ImageURL, "https://"), strings.HasPrefix(im.ImageURL, "http://"):
					default:
						c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'images[%d]': give an image_url (a data: URL or http(s)) or a file_id.", i), fmt.Sprintf("images[%d]", i)))
						return
					}
				}
				c.ref.update(func(rec *Record) { rec.FileIDs = fileIDs })
				if len(req.Images) == 0 {
					c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'images'.", "images"))
					return
				}
				if id, missing := s.missingFile(c.acct.ID, fileIDs); missing {
					c.fail(http.StatusNotFound, noSuchFile(id))
					return
				}
				inputImages = len(req.Images)
			}
		}
		c.ref.update(func(rec *Record) { rec.Model = req.Model })
		if strings.TrimSpace(req.Prompt) == "" {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'prompt'.", "prompt"))
			return
		}
		n := 1
		if req.N != nil {
			n = *req.N
		}
		if n < 1 || n > maxImages {
			c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'n': %d is not between 1 and %d.", n, maxImages), "n"))
			return
		}
		format := or(req.OutputFormat, "png")
		if format != "png" && format != "jpeg" && format != "webp" {
			c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'output_format': %q is not png, jpeg or webp.", format), "output_format"))
			return
		}
		img := base64.StdEncoding.EncodeToString(renderImage(req.Prompt, format))
		data := make([]any, n)
		for i := range data {
			data[i] = object{"b64_json": img}
		}
		textTokens := max(1, len(strings.Fields(req.Prompt)))
		imageTokens := inputImages * 256
		outTokens := n * 1056
		c.answerJSON(http.StatusOK, object{
			"created":       s.cfg.Now().Unix(),
			"background":    or(req.Background, "opaque"),
			"output_format": format,
			"quality":       or(req.Quality, "medium"),
			"size":          or(req.Size, "1024x1024"),
			"data":          data,
			"usage": object{
				"input_tokens":          textTokens + imageTokens,
				"input_tokens_details":  object{"text_tokens": textTokens, "image_tokens": imageTokens},
				"output_tokens":         outTokens,
				"output_tokens_details": object{"text_tokens": 0, "image_tokens": outTokens},
				"total_tokens":          textTokens + imageTokens + outTokens,
			},
		})
	}
}

// renderImage returns a small valid image for a prompt: 8x8 pixels of one
// colour derived from the prompt, PNG (also for webp, which the standard
// library cannot write) or JPEG.
func renderImage(prompt, format string) []byte {
	h := fnv.New32a()
	_, _ = h.Write([]byte(prompt))
	v := h.Sum32()
	im := image.NewRGBA(image.Rect(0, 0, 8, 8))
	col := color.RGBA{R: uint8(v), G: uint8(v >> 8), B: uint8(v >> 16), A: 255}
	for y := range 8 {
		for x := range 8 {
			im.Set(x, y, col)
		}
	}
	var buf bytes.Buffer
	if format == "jpeg" {
		_ = jpeg.Encode(&buf, im, nil)
	} else {
		_ = png.Encode(&buf, im)
	}
	return buf.Bytes()
}

// or returns s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
