package relay

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
)

// A thread's HTTP requests are served by the replica holding its lease
// (the one with its bridge lane), so its lane's chain keeps working
// whichever replica a load balancer picks. A request reaching another
// replica is forwarded there over a signed hop; a forwarded request is
// served where it lands, never forwarded again. Without other replicas,
// or when the holder cannot be reached, it is served here.

// HeaderHop carries a forwarded request's signature:
// "<replica id>.<unix seconds>.<hex HMAC-SHA256>".
const HeaderHop = "X-Codex-Relay-Hop"

// hopSkew bounds how far a hop's time may be from the receiver's clock.
const hopSkew = time.Minute

// leaseRenewal is how often a replica rewrites a lease it holds.
const leaseRenewal = time.Minute

// leaseTTL is how long a lease lives without renewal (lanes close after 5
// idle minutes; a thread quiet for longer is placed afresh).
const leaseTTL = 15 * time.Minute

// signHop signs a forwarded request from replica from at time at.
func signHop(key []byte, from string, at time.Time, method, path string, body []byte) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return from + "." + ts + "." + hex.EncodeToString(hopMAC(key, from, ts, method, path, body))
}

func hopMAC(key []byte, from, ts, method, path string, body []byte) []byte {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s\n%s\n%s\n%s\n%x", from, ts, method, path, sum)
	return m.Sum(nil)
}

// verifyHop checks a hop header and returns the replica that forwarded
// the request. It is pure.
func verifyHop(key []byte, header, method, path string, body []byte, now time.Time) (from string, ok bool) {
	if len(key) == 0 || header == "" {
		return "", false
	}
	parts := strings.Split(header, ".")
	if len(parts) != 3 || parts[0] == "" {
		return "", false
	}
	secs, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", false
	}
	if d := now.Sub(time.Unix(secs, 0)); d > hopSkew || d < -hopSkew {
		return "", false
	}
	got, err := hex.DecodeString(parts[2])
	if err != nil || !hmac.Equal(got, hopMAC(key, parts[0], parts[1], method, path, body)) {
		return "", false
	}
	return parts[0], true
}

// hopSender is the replica that forwarded r here, when its hop header
// verifies against body; "" otherwise.
func (s *Server) hopSender(r *http.Request, body []byte) string {
	from, _ := verifyHop(s.cfg.Replica.HopKey, r.Header.Get(HeaderHop), r.Method, r.URL.Path, body, s.cfg.Now())
	return from
}

func leaseKey(r *request) string { return leaseKeyOf(r.client.scope(), string(r.ident.Key)) }

func leaseKeyOf(scope, thread string) string { return scope + "\x00" + thread }

// leaseSeen is a lease this replica holds, as it last wrote it.
type leaseSeen struct {
	at    time.Time
	epoch int64
}

// tookOver reports whether a lease this replica now holds at epoch was
// another replica's before: its epoch moved on since this replica last
// held it (before, when held), or it is past its first epoch and this
// replica never held it. Pure.
func tookOver(before leaseSeen, held bool, epoch int64) bool {
	if held {
		return epoch != before.epoch
	}
	return epoch > 1
}

// announceTakeover tells the other replicas that this one took over req's
// thread: its former holder, alive after all (its heartbeat was late),
// retires its bridge lane and forwards the thread's requests here, instead
// of serving them on a lane of its own beside this one's.
func (s *Server) announceTakeover(ctx context.Context, req *request) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	a := store.Announcement{From: s.cfg.Replica.ID, Kind: store.AnnounceLeaseTaken,
		Threads: []store.ThreadRef{{Key: string(req.ident.Key), Scope: req.client.scope()}}}
	if err := s.cfg.Store.Announce(ctx, a); err != nil {
		s.log.Warn("announce a lane lease taken over", "err", err)
	}
}

// hopSilenceMargin is how much longer than its own stream idle deadline a
// replica serving a forwarded request may send nothing before it counts as
// gone.
const hopSilenceMargin = 5 * time.Second

// hopSilence bounds the wait for a forwarded request's answer headers, and
// each gap in its body, for a stream idle deadline of idle.
func hopSilence(idle time.Duration) time.Duration { return idle + hopSilenceMargin }

// silenceBody is a forwarded answer's body that ends once it has been
// silent for d: what it read last is kept, then tail (a terminal event),
// then io.EOF, so the copy to the client ends cleanly.
type silenceBody struct {
	rc     io.ReadCloser
	d      time.Duration
	t      *time.Timer
	silent atomic.Bool
	tail   []byte
}

func newSilenceBody(rc io.ReadCloser, d time.Duration, tail []byte) *silenceBody {
	b := &silenceBody{rc: rc, d: d, tail: tail}
	b.t = time.AfterFunc(d, func() {
		b.silent.Store(true)
		rc.Close() // ends a read under way
	})
	return b
}

func (b *silenceBody) Read(p []byte) (int, error) {
	if !b.silent.Load() {
		n, err := b.rc.Read(p)
		if !b.silent.Load() {
			if n > 0 {
				b.t.Reset(b.d)
			}
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
	if len(b.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.tail)
	b.tail = b.tail[n:]
	return n, nil
}

func (b *silenceBody) Close() error {
	b.t.Stop()
	return b.rc.Close()
}

// forward serves req from the replica holding its thread's lease, when that
// is another live replica; it reports whether it did (the client has its
// answer). A request this replica should serve, or whose holder cannot be
// reached, is left to the caller.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, req *request) bool {
	rc := s.cfg.Replica
	if req.sub != "" || s.cfg.DisableBridge || req.ident.Key == "" || len(rc.HopKey) == 0 || rc.Address == "" {
		return false
	}
	now := s.cfg.Now()
	// req.hopFrom is set when another replica forwarded c (verified on
	// arrival): it is served here whatever the lease says, never forwarded
	// again.
	seen, held := s.leased.Load(leaseKey(req))
	if held && now.Sub(seen.(leaseSeen).at) < leaseRenewal {
		return false // held here and renewed lately; a live replica keeps its leases
	}
	// The request is most likely served here (a new thread's first, or a
	// lease this replica renews): its bindings are read meanwhile.
	s.readBindingsAhead(r.Context(), req)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	lease, err := s.cfg.Store.LeaseLane(ctx, string(req.ident.Key), req.client.scope(), rc.ID, s.ReplicaLiveSince())
	cancel()
	if err != nil {
		s.log.Warn("lane lease", "err", err)
		return false
	}
	if lease.ReplicaID == rc.ID {
		var before leaseSeen
		if held {
			before = seen.(leaseSeen)
		}
		s.leased.Store(leaseKey(req), leaseSeen{at: now, epoch: lease.Epoch})
		if tookOver(before, held, lease.Epoch) {
			s.announceTakeover(r.Context(), req)
		}
		return false
	}
	if req.hopFrom != "" || lease.Address == "" || lease.Address == rc.Address {
		// Forwarded here (the lease moved meanwhile), a holder that takes no
		// forwards, or this very address (a crashed predecessor whose
		// heartbeat has not lapsed yet): serve here.
		return false
	}
	target, err := url.Parse(lease.Address)
	if err != nil {
		s.log.Warn("replica address unusable", "replica", lease.ReplicaID, "address", lease.Address, "err", err)
		return false
	}
	failed := false
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			// The body as read here (decompressed, so its encoding goes), as
			// the client sent it: the holder applies the key's policy itself.
			body := req.received
			pr.Out.Body = http.NoBody
			if len(body) > 0 {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			}
			pr.Out.ContentLength = int64(len(body))
			pr.Out.Header.Del("Content-Encoding")
			pr.Out.Header.Del("Content-Length")
			pr.Out.Header.Set(HeaderHop, signHop(rc.HopKey, rc.ID, now, r.Method, r.URL.Path, body))
		},
		Transport:     s.hop,
		FlushInterval: -1, // events reach the client as they come
		ModifyResponse: func(resp *http.Response) error {
			// A holder alive ends its stream within its own idle deadline;
			// one silent for longer is gone (frozen, or cut off): the
			// client's stream ends with a terminal event rather than wait.
			var tail []byte
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				var b bytes.Buffer
				b.WriteString("\n\n") // ends whatever event the holder left half-written
				_ = wire.NewSSEWriter(&b).WriteEvent(wire.EventResponseFailed, failedEvent("", req.id, "upstream_stream_interrupted",
					"the relay replica serving this conversation stopped answering"))
				tail = b.Bytes()
			}
			resp.Body = newSilenceBody(resp.Body, hopSilence(s.cfg.StreamIdleTimeout), tail)
			return nil
		},
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) {
			failed = true
			if r.Context().Err() == nil {
				s.log.Warn("forward to the lane's replica failed; serving here", "replica", lease.ReplicaID, "err", err)
			}
		},
	}
	proxy.ServeHTTP(w, r)
	if failed {
		// Served here instead, unless the client itself has gone.
		return r.Context().Err() != nil
	}
	s.metrics.lanes.WithLabelValues("forwarded").Inc()
	return true
}
