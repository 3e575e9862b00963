package sim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// handleTranscriptions serves POST {p}/audio/transcriptions: a multipart
// body with a file part (read as it streams in, counted, not kept) and a
// model. The text names the file and its size, so a test can tell the
// bytes arrived whole: "Simulated transcription of NAME (N bytes)."
// response_format json (default) and verbose_json answer JSON, text, srt
// and vtt plain text.
func (s *Server) handleTranscriptions(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteTranscriptions, "")
		if c == nil {
			return
		}
		form, err := c.readMultipart()
		if err != nil {
			c.failBody(err)
			return
		}
		c.ref.update(func(rec *Record) { rec.Model = form.values["model"] })
		file, ok := form.files["file"]
		if !ok {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'file'.", "file"))
			return
		}
		if form.values["model"] == "" {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'model'.", "model"))
			return
		}
		text := TranscriptionText(file.name, file.size)
		seconds := float64(file.size) / 16000 // as if 16 kB/s
		switch format := or(form.values["response_format"], "json"); format {
		case "json":
			c.answerJSON(http.StatusOK, object{"text": text})
		case "verbose_json":
			c.answerJSON(http.StatusOK, object{"task": "transcribe", "language": or(form.values["language"], "english"),
				"duration": seconds, "text": text,
				"segments": []any{object{"id": 0, "start": 0.0, "end": seconds, "text": text}}})
		case "text":
			c.answer(http.StatusOK, "text/plain; charset=utf-8", []byte(text+"\n"))
		case "srt":
			c.answer(http.StatusOK, "text/plain; charset=utf-8", []byte("1\n00:00:00,000 --> "+timestamp(seconds, ",")+"\n"+text+"\n\n"))
		case "vtt":
			c.answer(http.StatusOK, "text/plain; charset=utf-8", []byte("WEBVTT\n\n00:00:00.000 --> "+timestamp(seconds, ".")+"\n"+text+"\n\n"))
		default:
			c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'response_format': %q is not json, text, srt, verbose_json or vtt.", format), "response_format"))
		}
	}
}

// TranscriptionText is the text the sim transcribes a file of that name
// and size to.
func TranscriptionText(name string, size int64) string {
	return fmt.Sprintf("Simulated transcription of %s (%d bytes).", name, size)
}

func timestamp(seconds float64, sep string) string {
	ms := int64(seconds * 1000)
	return fmt.Sprintf("%02d:%02d:%02d%s%03d", ms/3600000, ms/60000%60, ms/1000%60, sep, ms%1000)
}

// speechTypes are the Content-Types of the speech formats.
var speechTypes = map[string]string{
	"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
	"wav": "audio/wav", "pcm": "audio/pcm",
}

// speechChunks is how many writes a speech answer takes, so a relay that
// buffers whole answers, or cuts them, shows.
const speechChunks = 4

// handleSpeech serves POST {p}/audio/speech: JSON {model, input, voice,
// response_format (mp3 default, opus, aac, flac, wav, pcm)} answered with
// audio bytes (SpeechAudio) in several writes.
func (s *Server) handleSpeech(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteSpeech, "")
		if c == nil {
			return
		}
		var req struct {
			Model          string          `json:"model"`
			Input          string          `json:"input"`
			Voice          json.RawMessage `json:"voice"` // a name, or {"id": ...}
			ResponseFormat string          `json:"response_format"`
		}
		if !c.readJSON(&req) {
			return
		}
		c.ref.update(func(rec *Record) { rec.Model = req.Model })
		voice := strings.TrimSpace(string(req.Voice))
		if voice == "null" || voice == `""` {
			voice = ""
		}
		for _, m := range []struct{ name, val string }{{"model", req.Model}, {"input", req.Input}, {"voice", voice}} {
			if m.val == "" {
				c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: '"+m.name+"'.", m.name))
				return
			}
		}
		format := or(req.ResponseFormat, "mp3")
		ct, ok := speechTypes[format]
		if !ok {
			c.fail(http.StatusBadRequest, invalidRequest(fmt.Sprintf("Invalid value for 'response_format': %q is not mp3, opus, aac, flac, wav or pcm.", format), "response_format"))
			return
		}
		audio := SpeechAudio(req.Input, format)
		c.answer(http.StatusOK, ct, chunked(audio, (len(audio)+speechChunks-1)/speechChunks)...)
	}
}

// SpeechAudio is the audio the sim speaks input as: 800 bytes per word
// (a tenth of a second of 8 kHz 8-bit sound; silence), behind the format's
// magic bytes (a WAV header for wav), so the size tells how much was said.
func SpeechAudio(input, format string) []byte {
	n := 800 * max(1, len(strings.Fields(input)))
	var buf bytes.Buffer
	switch format {
	case "wav":
		buf.WriteString("RIFF")
		_ = binary.Write(&buf, binary.LittleEndian, uint32(36+n))
		buf.WriteString("WAVEfmt ")
		// PCM, mono, 8000 Hz, 8000 bytes a second, 1-byte frames, 8 bits.
		for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(8000), uint32(8000), uint16(1), uint16(8)} {
			_ = binary.Write(&buf, binary.LittleEndian, v)
		}
		buf.WriteString("data")
		_ = binary.Write(&buf, binary.LittleEndian, uint32(n))
	case "mp3":
		buf.WriteString("ID3\x03\x00\x00\x00\x00\x00\x00")
	case "opus":
		buf.WriteString("OggS")
	case "flac":
		buf.WriteString("fLaC")
	case "aac":
		buf.Write([]byte{0xff, 0xf1})
	}
	buf.Write(make([]byte, n))
	return buf.Bytes()
}
