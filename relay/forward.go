package relay

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
// "<from>.<to>.<unix seconds>.<nonce>.<hex HMAC-SHA256>": the replica that
// forwarded the request, the replica it was sent to, when, and a random
// nonce, all under an HMAC that also covers the request as the receiver
// decides on it (see hopRequest). Replica ids hold no dots.
const HeaderHop = "X-Codex-Relay-Hop"

// hopSkew bounds how far a hop's time may be from the receiver's clock. A
// hop is signed as it is sent, so this is the replicas' clock difference
// plus the transit, with room to spare; it is also how long the receiver
// remembers the hop's nonce (see hopNonces).
const hopSkew = 30 * time.Second

// leaseRenewal is how often a replica rewrites a lease it holds.
const leaseRenewal = time.Minute

// leaseTTL is how long a lease lives without renewal (lanes close after 5
// idle minutes; a thread quiet for longer is placed afresh).
const leaseTTL = 15 * time.Minute

// hopNonceLen is the length of a hop's nonce: 16 random bytes in hex.
const hopNonceLen = 32

// hopBoundHeaders are the headers a hop's signature covers: those the
// receiver decides on (the client key; the thread's identity, all its
// session header aliases; its turn state and metadata, its parent and
// sub-agent; who the client says it is), and the identity headers it
// passes upstream. User-Agent is covered as its first value: net/http
// sends no other. Other headers are not covered: the receiver decides
// nothing on them, and a proxy or mesh between replicas may add its own
// (tracing, forwarding) without breaking the hop.
var hopBoundHeaders = func() []string {
	names := []string{"Authorization", ThreadHeader, wire.HeaderTurnState, wire.HeaderTurnMetadata, wire.HeaderParentThreadID,
		wire.HeaderSubagent, wire.HeaderWindowID, wire.HeaderClientRequestID, wire.HeaderOriginator, wire.HeaderOpenAIBeta, "User-Agent"}
	names = append(names, SessionHeaders...)
	for i, n := range names {
		names[i] = http.CanonicalHeaderKey(n)
	}
	return names
}()

// hopRequest is what a hop's signature covers of its request.
type hopRequest struct {
	method, path, query string
	header              http.Header // hopBoundHeaders of it
	body                []byte
}

// hopRequestOf is r as its hop covers it, with body (as read, decoded).
func hopRequestOf(r *http.Request, body []byte) hopRequest {
	return hopRequest{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, header: r.Header, body: body}
}

// hop is what a hop header says, once its signature verified.
type hop struct {
	from, to string
	at       time.Time
	nonce    string
}

// hopRefusal says why a hop header was refused.
type hopRefusal string

const (
	hopMalformed   hopRefusal = "malformed"
	hopBadMAC      hopRefusal = "its signature does not match the request"
	hopStale       hopRefusal = "its time is outside the window"
	hopMisdirected hopRefusal = "addressed to another replica"
	hopReplayed    hopRefusal = "replayed: its nonce was used already"
	hopNoRoom      hopRefusal = "too many hops within the window to remember"
)

func (r hopRefusal) Error() string { return string(r) }

// newHopNonce draws a hop's nonce.
func newHopNonce() string {
	var b [hopNonceLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// signHop signs req, forwarded from replica from to replica to at time at,
// under nonce.
func signHop(key []byte, from, to string, at time.Time, nonce string, req hopRequest) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return from + "." + to + "." + ts + "." + nonce + "." + hex.EncodeToString(hopMAC(key, from, to, ts, nonce, req))
}

// hopMAC is the HMAC of a hop's fields (as its header writes them) and of
// its request, each length-prefixed so no field can run into the next.
func hopMAC(key []byte, from, to, ts, nonce string, req hopRequest) []byte {
	var stack [1024]byte
	buf := stack[:0]
	field := func(v string) {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
		buf = append(buf, v...)
	}
	field("codex-relay hop v2")
	for _, v := range []string{from, to, ts, nonce, req.method, req.path, req.query} {
		field(v)
	}
	for _, name := range hopBoundHeaders {
		vs := req.header[name]
		if name == "User-Agent" {
			vs = []string{req.header.Get(name)}
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(req.body)))
	m := hmac.New(sha256.New, key)
	m.Write(buf)
	m.Write(req.body)
	return m.Sum(nil)
}

// verifyHop checks a hop header against req, as received by replica self
// at now. It refuses (hopRefusal) a malformed header, one whose signature
// does not cover exactly req under key, one signed more than hopSkew from
// now, and one addressed to another replica; the hop it returns is set
// once the signature verified. Whether the hop was used already is
// hopNonces' to say. It is pure.
func verifyHop(key []byte, header, self string, req hopRequest, now time.Time) (hop, error) {
	if len(key) == 0 || header == "" {
		return hop{}, hopMalformed
	}
	parts := strings.Split(header, ".")
	if len(parts) != 5 || parts[0] == "" || parts[1] == "" || len(parts[3]) != hopNonceLen {
		return hop{}, hopMalformed
	}
	secs, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return hop{}, hopMalformed
	}
	got, err := hex.DecodeString(parts[4])
	if err != nil || !hmac.Equal(got, hopMAC(key, parts[0], parts[1], parts[2], parts[3], req)) {
		return hop{}, hopBadMAC
	}
	h := hop{from: parts[0], to: parts[1], at: time.Unix(secs, 0), nonce: parts[3]}
	if d := now.Sub(h.at); d > hopSkew || d < -hopSkew {
		return h, hopStale
	}
	if h.to != self {
		return h, hopMisdirected
	}
	return h, nil
}

// hopNonces remembers the nonces of the hops a replica accepted, each until
// its hop's time is more than hopSkew past (verifyHop refuses it on its time
// from then on), so each hop is accepted once. Safe for concurrent use; the
// zero value is empty.
//
// Why memory of this replica's own suffices, rather than a table every
// replica checks: a hop names the replica it was sent to, under its
// signature, and a replica accepts only the hops addressed to itself
// (verifyHop), so only one process ever accepts a given hop: the one it was
// sent to. Replica ids are drawn at random per process (ReplicaConfig.ID),
// so a restarted replica, its memory empty, has another id, and a hop sent
// to its predecessor is misdirected there. That one process refuses the
// hop again while it remembers its nonce, and after that on its time. A
// captured hop replayed is thus refused wherever it goes: elsewhere as
// misdirected, at its destination as replayed or stale; and, its signature
// covering the request, it cannot be bent into another one. The hot path
// needs no database round trip. (Left open: the receiver's clock stepped
// back by more than the time since a nonce was forgotten.)
type hopNonces struct {
	mu    sync.Mutex
	seen  map[string]time.Time // nonce -> when it may be forgotten; guarded by mu
	swept time.Time            // guarded by mu
	bound int                  // static; 0: maxHopNonces
}

// maxHopNonces bounds the nonces a replica remembers: some 4,000 forwarded
// requests a second reaching it for hopSkew. Past that a hop is refused
// (served as a request without one) until the oldest expire.
const maxHopNonces = 1 << 17

// accept records nonce, valid until until, and reports whether it was new
// (hopReplayed if not; hopNoRoom when the memory is full).
func (n *hopNonces) accept(nonce string, until, now time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen == nil {
		n.seen = map[string]time.Time{}
	}
	bound := cmp.Or(n.bound, maxHopNonces)
	// Expired nonces go every hopSkew, or sooner (at most once a second)
	// when the memory is full.
	if since := now.Sub(n.swept); since >= hopSkew || since < 0 || len(n.seen) >= bound && since >= time.Second {
		maps.DeleteFunc(n.seen, func(_ string, until time.Time) bool { return now.After(until) })
		n.swept = now
	}
	if _, used := n.seen[nonce]; used {
		return hopReplayed
	}
	if len(n.seen) >= bound {
		return hopNoRoom
	}
	n.seen[nonce] = until
	return nil
}

// hopSender is the replica that forwarded r here, when its hop header
// verifies against body and was not used before; "" otherwise. A hop
// refused is logged, once (it is checked once per request), and the
// request is served as one that came without it.
func (s *Server) hopSender(r *http.Request, body []byte) string {
	header := r.Header.Get(HeaderHop)
	if header == "" || len(s.cfg.Replica.HopKey) == 0 {
		return ""
	}
	now := s.cfg.Now()
	h, err := verifyHop(s.cfg.Replica.HopKey, header, s.cfg.Replica.ID, hopRequestOf(r, body), now)
	if err == nil {
		err = s.hopNonces.accept(h.nonce, h.at.Add(hopSkew), now)
	}
	if err == nil {
		return h.from
	}
	attrs := []any{"reason", err.Error(), "path", r.URL.Path, "remote", r.RemoteAddr}
	if h.from != "" { // the signature verified: what it says is true
		attrs = append(attrs, "from", h.from, "to", h.to, "age", now.Sub(h.at).Round(time.Second).String())
	}
	s.log.Warn("replica hop refused; served as a request without one", attrs...)
	return ""
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
			// Signed last, for the replica that holds the lease: exactly what
			// it receives (the query as the proxy cleaned it).
			pr.Out.Header.Set(HeaderHop, signHop(rc.HopKey, rc.ID, lease.ReplicaID, s.cfg.Now(), newHopNonce(),
				hopRequest{method: r.Method, path: r.URL.Path, query: pr.Out.URL.RawQuery, header: pr.Out.Header, body: body}))
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
