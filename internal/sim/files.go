package sim

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strings"
)

// FileObject is a file as the OpenAI Files API describes it. Account and
// MimeType are the sim's own bookkeeping and not part of the JSON.
type FileObject struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "file"
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	// Status is "processed" once the bytes are in, "uploaded" for a file
	// of the ChatGPT upload flow that is still waiting for them.
	Status    string `json:"status"`
	ExpiresAt *int64 `json:"expires_at"`

	Account  string `json:"-"`
	MimeType string `json:"-"`
}

// fileEntry is a file and its bytes. Owned by Server; guarded by Server.mu.
type fileEntry struct {
	FileObject
	content []byte
	// The ChatGPT upload flow: the upload URL's signature, the size the
	// client announced, and whether the bytes were PUT.
	sig      string
	declared int64
	uploaded bool
}

// Files returns the files of an account (OpenAI uploads and ChatGPT
// uploads alike), oldest first.
func (s *Server) Files(account string) []FileObject {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[account]
	if !ok {
		return nil
	}
	out := make([]FileObject, 0, len(o.fileOrder))
	for _, id := range o.fileOrder {
		out = append(out, o.files[id].FileObject)
	}
	return out
}

// File returns one file of an account and a copy of its bytes.
func (s *Server) File(account, id string) (FileObject, []byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fileLocked(account, id)
	if f == nil {
		return FileObject{}, nil, false
	}
	return f.FileObject, slices.Clone(f.content), true
}

func (s *Server) fileLocked(account, id string) *fileEntry {
	if o, ok := s.objects[account]; ok {
		return o.files[id]
	}
	return nil
}

// missingFile returns the first of ids that is not a file of account, if
// any.
func (s *Server) missingFile(account string, ids []string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.fileLocked(account, id) == nil {
			return id, true
		}
	}
	return "", false
}

// newFileID returns a file id in OpenAI's form.
func newFileID() string { return "file-" + randomHex(11) }

// handleFileUpload serves POST {p}/files: a multipart/form-data body with a
// purpose field and a file part, read as it streams in (at most
// Config.MaxFileBytes of file, else 413).
func (s *Server) handleFileUpload(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteFiles, "")
		if c == nil {
			return
		}
		form, err := c.readMultipart("file")
		if err != nil {
			c.failBody(err)
			return
		}
		file, ok := form.files["file"]
		if !ok {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'file'.", "file"))
			return
		}
		purpose := form.values["purpose"]
		if purpose == "" {
			c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'purpose'.", "purpose"))
			return
		}
		f := &fileEntry{FileObject: FileObject{ID: newFileID(), Object: "file", Bytes: file.size,
			CreatedAt: s.cfg.Now().Unix(), Filename: file.name, Purpose: purpose, Status: "processed",
			Account: c.acct.ID, MimeType: file.contentType}, content: file.data, uploaded: true}
		s.mu.Lock()
		s.addFileLocked(f)
		s.mu.Unlock()
		c.noteObject(f.ID)
		c.answerJSON(http.StatusOK, f.FileObject)
	}
}

// handleFileList serves GET {p}/files (?purpose= filters), newest first, as
// the API lists them.
func (s *Server) handleFileList(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.beginObject(w, r, kind, RouteFileList, "")
		if c == nil {
			return
		}
		purpose := r.URL.Query().Get("purpose")
		data := []FileObject{}
		for _, f := range s.Files(c.acct.ID) {
			if purpose == "" || f.Purpose == purpose {
				data = append(data, f)
			}
		}
		slices.Reverse(data)
		c.answerJSON(http.StatusOK, listObject(data, func(f FileObject) string { return f.ID }))
	}
}

// listObject is the API's list shape: {"object":"list","data":[...],
// "first_id","last_id","has_more":false}.
func listObject[T any](data []T, id func(T) string) object {
	l := object{"object": "list", "data": data, "has_more": false, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		l["first_id"], l["last_id"] = id(data[0]), id(data[len(data)-1])
	}
	return l
}

// handleFile serves GET {p}/files/{id}, GET {p}/files/{id}/content and
// DELETE {p}/files/{id}, for files of the caller's account only.
func (s *Server) handleFile(kind Kind, route Route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		c := s.beginObject(w, r, kind, route, id)
		if c == nil {
			return
		}
		s.mu.Lock()
		f := s.fileLocked(c.acct.ID, id)
		var fo FileObject
		var content []byte
		if f != nil {
			fo, content = f.FileObject, f.content
			if route == RouteFileDelete {
				s.deleteFileLocked(c.acct.ID, id)
			}
		}
		s.mu.Unlock()
		if f == nil {
			c.fail(http.StatusNotFound, noSuchFile(id))
			return
		}
		switch route {
		case RouteFileGet:
			c.answerJSON(http.StatusOK, fo)
		case RouteFileDelete:
			c.answerJSON(http.StatusOK, object{"id": id, "object": "file", "deleted": true})
		case RouteFileContent:
			ct := fo.MimeType
			if ct == "" {
				ct = "application/octet-stream"
			}
			c.w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fo.Filename}))
			c.answer(http.StatusOK, ct, chunked(content, 64<<10)...)
		}
	}
}

// chunked splits b into pieces of at most n bytes (one empty piece for an
// empty b).
func chunked(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

// handleBackendFileCreate serves POST /backend-api/files, the first step of
// the ChatGPT upload flow Codex uses for attachments: {file_name,
// file_size, use_case} -> {file_id, upload_url}. The upload URL points at
// the sim itself (/_sim/blob/{id}?sig=...), as the backend's points at blob
// storage: it takes the bytes without a bearer token.
func (s *Server) handleBackendFileCreate(w http.ResponseWriter, r *http.Request) {
	c := s.beginObject(w, r, KindChatGPT, RouteFileCreate, "")
	if c == nil {
		return
	}
	var body struct {
		FileName string `json:"file_name"`
		FileSize *int64 `json:"file_size"`
		UseCase  string `json:"use_case"`
	}
	if !c.readJSON(&body) {
		return
	}
	switch {
	case body.FileName == "":
		c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'file_name'.", "file_name"))
		return
	case body.FileSize == nil || *body.FileSize < 0:
		c.fail(http.StatusBadRequest, invalidRequest("Missing required parameter: 'file_size'.", "file_size"))
		return
	case *body.FileSize > s.cfg.MaxFileBytes:
		c.fail(http.StatusRequestEntityTooLarge, invalidRequest(fmt.Sprintf("file_size %d is past the limit of %d bytes.", *body.FileSize, s.cfg.MaxFileBytes), "file_size"))
		return
	}
	purpose := body.UseCase
	if purpose == "" {
		purpose = "codex"
	}
	f := &fileEntry{FileObject: FileObject{ID: newFileID(), Object: "file", CreatedAt: s.cfg.Now().Unix(),
		Filename: body.FileName, Purpose: purpose, Status: "uploaded", Account: c.acct.ID,
		MimeType: mimeType(body.FileName)}, sig: randomHex(16), declared: *body.FileSize}
	s.mu.Lock()
	s.addFileLocked(f)
	s.mu.Unlock()
	c.noteObject(f.ID)
	c.answerJSON(http.StatusOK, object{"file_id": f.ID, "upload_url": blobURL(r, f)})
}

func blobURL(r *http.Request, f *fileEntry) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s%s/blob/%s?sig=%s", scheme, r.Host, controlPrefix, f.ID, f.sig)
}

func mimeType(name string) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// blobFile finds the file of an upload URL by id and signature, whatever
// its account.
func (s *Server) blobFile(id, sig string) *fileEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.objects {
		if f, ok := o.files[id]; ok && f.sig != "" && subtle.ConstantTimeCompare([]byte(f.sig), []byte(sig)) == 1 {
			return f
		}
	}
	return nil
}

// handleBlob serves the upload URL: PUT stores the bytes (with
// x-ms-blob-type: BlockBlob, as Azure blob storage demands; at most the
// announced size), GET returns them (it is the download URL too). The
// signature stands in for a bearer token; a wrong one is 403.
func (s *Server) handleBlob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec := headerRecord(r, RecordHTTP, TransportHTTP, RouteFileBlob, s.cfg.Now())
	rec.ObjectID = id
	ref := s.rec.add(rec)
	f := s.blobFile(id, r.URL.Query().Get("sig"))
	if f == nil {
		c := &objectCall{s: s, w: w, r: r, ref: ref}
		c.fail(http.StatusForbidden, apiError{Message: "Server failed to authenticate the request: unknown blob or signature.", Type: "AuthenticationFailed"})
		return
	}
	ref.update(func(rec *Record) { rec.Account = f.Account })
	s.mu.Lock()
	acct := s.accounts[f.Account]
	s.mu.Unlock()
	if acct == nil {
		c := &objectCall{s: s, w: w, r: r, ref: ref}
		c.fail(http.StatusNotFound, noSuchFile(id))
		return
	}
	c := s.objectFault(w, r, ref, acct.acct, RouteFileBlob, TransportHTTP)
	if c == nil {
		return
	}
	if r.Method == http.MethodGet {
		s.mu.Lock()
		content, done := f.content, f.uploaded
		s.mu.Unlock()
		if !done {
			c.fail(http.StatusNotFound, apiError{Message: "The specified blob does not exist.", Type: "BlobNotFound"})
			return
		}
		c.answer(http.StatusOK, f.MimeType, chunked(content, 64<<10)...)
		return
	}
	if !strings.EqualFold(r.Header.Get("x-ms-blob-type"), "BlockBlob") {
		c.fail(http.StatusBadRequest, apiError{Message: "The x-ms-blob-type header must be BlockBlob.", Type: "MissingRequiredHeader"})
		return
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, &countingReader{r: r.Body, max: f.declared})
	switch {
	case errors.Is(err, errBodyTooLarge):
		c.fail(http.StatusRequestEntityTooLarge, apiError{Message: fmt.Sprintf("The body is longer than the announced %d bytes.", f.declared), Type: "RequestBodyTooLarge"})
		return
	case err != nil:
		c.fail(http.StatusBadRequest, apiError{Message: "read body: " + err.Error(), Type: "InvalidInput"})
		return
	case n != f.declared:
		c.fail(http.StatusBadRequest, apiError{Message: fmt.Sprintf("The body has %d bytes, not the announced %d.", n, f.declared), Type: "InvalidInput"})
		return
	}
	s.mu.Lock()
	f.content, f.Bytes, f.uploaded, f.Status = buf.Bytes(), n, true, "processed"
	s.mu.Unlock()
	c.answer(http.StatusCreated, "text/plain", nil)
}

// handleBackendFileUploaded serves POST /backend-api/files/{id}/uploaded:
// {"status":"retry"} until the bytes were PUT, then {"status":"success",
// download_url, file_name, mime_type, file_size_bytes}.
func (s *Server) handleBackendFileUploaded(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.beginObject(w, r, KindChatGPT, RouteFileUploaded, id)
	if c == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	s.mu.Lock()
	f := s.fileLocked(c.acct.ID, id)
	var answer object
	if f != nil {
		if f.uploaded {
			answer = object{"status": "success", "download_url": blobURL(r, f), "file_name": f.Filename,
				"mime_type": f.MimeType, "file_size_bytes": f.Bytes}
		} else {
			answer = object{"status": "retry"}
		}
	}
	s.mu.Unlock()
	if f == nil {
		c.fail(http.StatusNotFound, noSuchFile(id))
		return
	}
	c.answerJSON(http.StatusOK, answer)
}

// multipartForm is a multipart body as the sim keeps it: the text fields
// (the first of each name), and the file parts.
type multipartForm struct {
	values map[string]string
	files  map[string]formFile
	// order lists the file parts' field names as they came.
	order []string
}

// formFile is one file part: its name, type and size, and its bytes when
// they were kept.
type formFile struct {
	name        string
	contentType string
	size        int64
	data        []byte
}

// maxFormValue bounds one text field of a multipart body.
const maxFormValue = 1 << 20

// readMultipart reads a multipart/form-data body part by part as it
// streams in: text fields up to 1 MiB each, file parts up to
// Config.MaxFileBytes each (errBodyTooLarge past it). The bytes of the
// file parts named in keep are kept; the others are only counted.
func (c *objectCall) readMultipart(keep ...string) (*multipartForm, error) {
	mr, err := c.r.MultipartReader()
	if err != nil {
		return nil, errors.New("the request body must be multipart/form-data")
	}
	form := &multipartForm{values: map[string]string{}, files: map[string]formFile{}}
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return form, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read multipart body: %w", err)
		}
		if err := form.add(p, c.s.cfg.MaxFileBytes, keep); err != nil {
			return nil, err
		}
	}
}

func (form *multipartForm) add(p *multipart.Part, maxFile int64, keep []string) error {
	defer p.Close()
	name := p.FormName()
	if p.FileName() == "" {
		b, err := io.ReadAll(&countingReader{r: p, max: maxFormValue})
		if errors.Is(err, errBodyTooLarge) {
			return fmt.Errorf("field %q is too long", name)
		}
		if err != nil {
			return fmt.Errorf("read field %q: %w", name, err)
		}
		if _, ok := form.values[name]; !ok {
			form.values[name] = string(b)
		}
		return nil
	}
	cr := &countingReader{r: p, max: maxFile}
	f := formFile{name: p.FileName(), contentType: p.Header.Get("Content-Type")}
	var err error
	if slices.Contains(keep, name) {
		var buf bytes.Buffer
		_, err = io.Copy(&buf, cr)
		f.data = buf.Bytes()
	} else {
		_, err = io.Copy(io.Discard, cr)
	}
	if errors.Is(err, errBodyTooLarge) {
		return fmt.Errorf("%w: file %q is past the limit of %d bytes", errBodyTooLarge, f.name, maxFile)
	}
	if err != nil {
		return fmt.Errorf("read file %q: %w", f.name, err)
	}
	f.size = cr.n
	if f.contentType == "" || f.contentType == "application/octet-stream" {
		f.contentType = mimeType(f.name)
	}
	key := name
	if _, dup := form.files[key]; dup {
		key = fmt.Sprintf("%s#%d", name, len(form.order))
	}
	form.files[key] = f
	form.order = append(form.order, key)
	return nil
}
