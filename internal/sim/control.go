package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/codexrelay/codex-relay/internal/wire"
)

// controlPrefix is where the control API lives. It is not authenticated:
// the sim is a loopback test tool.
const controlPrefix = "/_sim"

// controlRoutes registers the control API, JSON over HTTP. Each route calls
// the Go method of the same name.
//
//	GET    /_sim/accounts             Accounts
//	POST   /_sim/accounts             AddAccounts (one account or a list; adds or replaces by id)
//	GET    /_sim/accounts/{id}        Account
//	DELETE /_sim/accounts/{id}        RemoveAccount
//	GET    /_sim/faults               Faults
//	POST   /_sim/faults               AddFault (one fault or a list; answers the installed faults)
//	DELETE /_sim/faults               ClearFaults
//	DELETE /_sim/faults/{id}          RemoveFault
//	GET    /_sim/records?account=&kind=&transport=&route=&thread=&session=&conn=&since=
//	                                  Records
//	DELETE /_sim/records              ClearRecords
//	POST   /_sim/reset                Reset
func (s *Server) controlRoutes(mux *http.ServeMux) {
	p := controlPrefix
	mux.HandleFunc("GET "+p+"/accounts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Accounts())
	})
	mux.HandleFunc("POST "+p+"/accounts", func(w http.ResponseWriter, r *http.Request) {
		var accts []Account
		if !decodeOneOrMany(w, r, &accts) {
			return
		}
		if err := s.AddAccounts(accts...); err != nil {
			controlError(w, http.StatusBadRequest, err)
			return
		}
		out := make([]AccountState, 0, len(accts))
		for _, a := range accts {
			st, _ := s.Account(a.ID)
			out = append(out, st)
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET "+p+"/accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, ok := s.Account(r.PathValue("id"))
		if !ok {
			controlError(w, http.StatusNotFound, fmt.Errorf("no account %q", r.PathValue("id")))
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("DELETE "+p+"/accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !s.RemoveAccount(r.PathValue("id")) {
			controlError(w, http.StatusNotFound, fmt.Errorf("no account %q", r.PathValue("id")))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+p+"/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Faults())
	})
	mux.HandleFunc("POST "+p+"/faults", func(w http.ResponseWriter, r *http.Request) {
		var faults []Fault
		if !decodeOneOrMany(w, r, &faults) {
			return
		}
		for _, f := range faults {
			if err := f.validate(); err != nil {
				controlError(w, http.StatusBadRequest, err)
				return
			}
		}
		out := make([]FaultState, 0, len(faults))
		for _, f := range faults {
			st, err := s.AddFault(f)
			if err != nil {
				controlError(w, http.StatusBadRequest, err)
				return
			}
			out = append(out, st)
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("DELETE "+p+"/faults", func(w http.ResponseWriter, r *http.Request) {
		s.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE "+p+"/faults/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil || !s.RemoveFault(id) {
			controlError(w, http.StatusNotFound, fmt.Errorf("no fault %q", r.PathValue("id")))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+p+"/records", func(w http.ResponseWriter, r *http.Request) {
		f, err := parseRecordFilter(r)
		if err != nil {
			controlError(w, http.StatusBadRequest, err)
			return
		}
		out := s.Records(f)
		if out == nil {
			out = []Record{}
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("DELETE "+p+"/records", func(w http.ResponseWriter, r *http.Request) {
		s.ClearRecords()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+p+"/reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
}

func parseRecordFilter(r *http.Request) (RecordFilter, error) {
	q := r.URL.Query()
	f := RecordFilter{
		Account:   q.Get("account"),
		Kind:      RecordKind(q.Get("kind")),
		Transport: Transport(q.Get("transport")),
		Route:     Route(q.Get("route")),
		ThreadID:  q.Get("thread"),
		SessionID: q.Get("session"),
	}
	for name, dst := range map[string]*int64{"conn": &f.ConnID, "since": &f.Since} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return RecordFilter{}, fmt.Errorf("%s: %w", name, err)
			}
			*dst = n
		}
	}
	return f, nil
}

// decodeOneOrMany decodes a JSON object or array of objects into *dst (a
// pointer to a slice). On failure it answers 400 and returns false.
func decodeOneOrMany[T any](w http.ResponseWriter, r *http.Request, dst *[]T) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		controlError(w, http.StatusBadRequest, err)
		return false
	}
	body = bytes.TrimSpace(body)
	dec := func(b []byte, v any) error {
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields() // a misspelt option must not pass silently
		return d.Decode(v)
	}
	if bytes.HasPrefix(body, []byte("[")) {
		err = dec(body, dst)
	} else {
		var one T
		err = dec(body, &one)
		*dst = []T{one}
	}
	if err != nil {
		controlError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return false
	}
	return true
}

func controlError(w http.ResponseWriter, status int, err error) {
	writeError(w, status, wire.Error{Type: wire.TypeInvalidRequest, Message: err.Error()}, nil)
}
