package relay

import (
	"bytes"
	"compress/gzip"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fuzz targets for the parsers of what clients and other replicas send:
// identity headers, request bodies, and the replica hop header. Each checks
// properties of its parser, not only that it survives the input.

// FuzzParseIdentity reads fuzzed identity headers (session-id, one of its
// legacy aliases, thread-id, and a goal route's payload threadId) and checks
// ParseIdentity and ParseGoalIdentity against a reference reading of the
// rules: a header that is too long or holds a control character is refused,
// and no key comes out then; UUIDs read the same in any case; keys are
// versioned hashes no header value equals or can imitate; different
// (session, thread) pairs and different sources give different keys.
func FuzzParseIdentity(f *testing.F) {
	const (
		uuid1 = "019a0000-0000-7000-8000-000000000001"
		uuid2 = "019A0000-0000-7000-8000-0000000000AA"
	)
	for _, tc := range []struct {
		session, alias string
		aliasIndex     uint8
		thread, goal   string
	}{
		{uuid1, "", 0, uuid2, ""},
		{"", uuid1, 0, "", ""},
		{"  ", uuid1, 1, "\t" + uuid2 + " ", uuid1},
		{"", "", 2, "MyThread", ""},
		{"sess", "", 0, "ion", "sessi"},
		{"a\x01b", uuid1, 0, uuid2, ""},
		{uuid1, "a\x7fb", 2, "", "x\ny"},
		{"", "", 1, "a\x7fb", ""},
		{"", "", 0, strings.Repeat("a", maxIdentityLen+1), ""},
		{strings.Repeat("b", maxIdentityLen), "", 0, "", strings.Repeat("c", maxIdentityLen+1)},
		{"v1:s:" + strings.Repeat("A", 24), "", 0, "v1:st:" + strings.Repeat("B", 24), ""},
		{"é\u00a0", "", 0, "\u0085", "\xff"},
	} {
		f.Add(tc.session, tc.alias, tc.aliasIndex, tc.thread, tc.goal)
	}
	f.Fuzz(func(t *testing.T, session, alias string, aliasIndex uint8, thread, goal string) {
		aliasHeader := SessionHeaders[1+int(aliasIndex)%(len(SessionHeaders)-1)]
		h := http.Header{}
		for name, v := range map[string]string{SessionHeaders[0]: session, aliasHeader: alias, ThreadHeader: thread} {
			if v != "" {
				h.Set(name, v)
			}
		}

		// The reference: the first session header that is not blank gives
		// the session; an invalid one before it (or the thread) is refused.
		wantSession, wantHeader, refused := "", "", ""
		for _, c := range []struct{ header, v string }{{SessionHeaders[0], session}, {aliasHeader, alias}} {
			v, ok := referenceID(c.v)
			if !ok {
				refused = c.header
				break
			}
			if v != "" {
				wantSession, wantHeader = v, c.header
				break
			}
		}
		wantThread, ok := referenceID(thread)
		if refused == "" && !ok {
			refused = ThreadHeader
		}

		id, err := ParseIdentity(h)
		if refused != "" {
			var ie *IdentityError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, refused, ie.Header, "the refused header is named")
			assert.Equal(t, Identity{}, id, "no key for an invalid header")
			_, err := ParseGoalIdentity(h, goal)
			assert.Error(t, err, "the goal routes refuse the same headers")
			return
		}
		require.NoError(t, err)
		assert.Equal(t, wantSession, id.Session)
		assert.Equal(t, wantHeader, id.SessionHeader)
		assert.Equal(t, wantThread, id.Thread)
		checkKeys(t, id, h)
		for _, v := range []string{session, alias, thread, goal} {
			for _, key := range []ThreadKey{id.Key, id.SessionKey} {
				if key != "" {
					assert.NotEqual(t, ThreadKey(v), key, "a header value is never a key")
				}
			}
		}

		// A key sent back as a header value derives another key: no client
		// can name a key, only the ids it derives from.
		if id.Key != "" {
			imitated, err := ParseIdentity(http.Header{"Thread-Id": {string(id.Key)}})
			require.NoError(t, err)
			assert.NotEqual(t, id.Key, imitated.Key, "a key sent as thread-id")
			imitated, err = ParseIdentity(http.Header{"Session-Id": {string(id.Key)}})
			require.NoError(t, err)
			assert.NotEqual(t, id.Key, imitated.Key, "a key sent as session-id")
			assert.NotEqual(t, id.SessionKey, imitated.SessionKey, "a key sent as session-id")
		}

		// UUIDs in another case are the same ids.
		swapped := http.Header{}
		for name, vs := range h {
			swapped[name] = []string{swapUUIDCase(vs[0])}
		}
		again, err := ParseIdentity(swapped)
		require.NoError(t, err)
		assert.Equal(t, id, again, "UUIDs in another case")

		// Different pairs, different keys: the parts are not concatenated.
		if wantSession != "" && wantThread != "" {
			for _, pair := range [][2]string{
				{wantThread, wantSession},
				{wantSession + wantThread[:1], wantThread[1:]},
				{wantSession[:len(wantSession)-1], wantSession[len(wantSession)-1:] + wantThread},
			} {
				if pair[0] == wantSession && pair[1] == wantThread {
					continue
				}
				other := DeriveIdentity(pair[0], "", pair[1])
				if pair[0] == "" || pair[1] == "" {
					assert.NotEqual(t, id.Key, other.Key, "another source than %q, %q", pair[0], pair[1])
					continue
				}
				assert.NotEqual(t, id.Key, other.Key, "(%q, %q) and (%q, %q)", wantSession, wantThread, pair[0], pair[1])
			}
		}
		// One value as a session, as a thread, and as both: three sources,
		// three keys.
		for _, v := range []string{wantSession, wantThread} {
			if v == "" {
				continue
			}
			keys := map[ThreadKey]bool{
				DeriveIdentity(v, "", "").Key: true, DeriveIdentity("", "", v).Key: true, DeriveIdentity(v, "", v).Key: true,
			}
			assert.Len(t, keys, 3, "sources of %q", v)
		}

		// Over the length bound: refused, even with the rest valid.
		long := h.Clone()
		long.Set(ThreadHeader, "x"+strings.Repeat("a", maxIdentityLen))
		_, err = ParseIdentity(long)
		assert.Error(t, err, "a thread-id over %d bytes", maxIdentityLen)

		// The goal routes: the payload's threadId in place of the header's,
		// which stays when the payload names none.
		gid, err := ParseGoalIdentity(h, goal)
		wantGoal, ok := referenceID(goal)
		if !ok {
			var ie *IdentityError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, "threadId", ie.Header)
			return
		}
		require.NoError(t, err)
		if wantGoal == "" {
			assert.Equal(t, id, gid, "no threadId in the payload: the header's thread")
			return
		}
		withThread := h.Clone()
		withThread.Set(ThreadHeader, goal)
		asHeader, err := ParseIdentity(withThread)
		require.NoError(t, err)
		assert.Equal(t, asHeader, gid, "the payload's threadId reads as that thread-id header")
	})
}

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// referenceID is normaliseID written from its doc: trimmed, blank is
// absent, over maxIdentityLen bytes or with a control character refused,
// UUIDs lower-cased, anything else kept as it is.
func referenceID(v string) (string, bool) {
	v = strings.TrimSpace(v)
	switch {
	case len(v) > maxIdentityLen:
		return "", false
	case strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "", false
	case !utf8.ValidString(v):
		return "", false
	case uuidPattern.MatchString(v):
		return strings.ToLower(v), true
	}
	return v, true
}

// swapUUIDCase swaps the case of v's letters when v is a UUID (with the
// spaces around it), and leaves anything else alone.
func swapUUIDCase(v string) string {
	if !uuidPattern.MatchString(strings.TrimSpace(v)) {
		return v
	}
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'f':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'F':
			return r - 'A' + 'a'
		}
		return r
	}, v)
}

var keyPattern = regexp.MustCompile(`^v1:(st|t|s):[A-Za-z0-9_-]{24}$`)

// checkKeys checks id's keys against its ids: the source follows which ids
// are there, the keys are versioned hashes, and the session key is the
// session-only key.
func checkKeys(t *testing.T, id Identity, h http.Header) {
	t.Helper()
	wantSource := map[[2]bool]Source{{true, true}: SourceSessionThread, {false, true}: SourceThread, {true, false}: SourceSession}[[2]bool{id.Session != "", id.Thread != ""}]
	assert.Equal(t, wantSource, id.Source)
	if wantSource == "" {
		assert.Empty(t, id.Key)
	} else {
		assert.Regexp(t, keyPattern, string(id.Key))
		assert.True(t, strings.HasPrefix(string(id.Key), "v1:"+string(wantSource)+":"), id.Key)
	}
	if id.Session == "" {
		assert.Empty(t, id.SessionKey)
	} else {
		assert.Equal(t, DeriveIdentity(id.Session, "", "").Key, id.SessionKey)
	}
	for name, vs := range h {
		for _, v := range vs {
			assert.NotEqual(t, string(id.Key), v, "header %s", name)
		}
	}
}

// FuzzReadBody compresses fuzzed plaintext with zstd (in one frame, and
// streamed with a window of 1 KiB to 2 MiB) and gzip, and checks that
// readBody returns exactly the plaintext when it and the encoded body are
// within the limit, and errBodyTooLarge when either is over. Fuzzed bytes
// sent as they are under each encoding never yield more than the limit, and
// an encoding other than identity, zstd or gzip is refused.
func FuzzReadBody(f *testing.F) {
	request := []byte(`{"model":"gpt-5.5-codex","instructions":"You are Codex.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"say hello"}]}],"stream":true,"prompt_cache_key":"019a0000-0000-7000-8000-000000000001"}`)
	for _, tc := range []struct {
		plain    []byte
		limit    uint32
		window   uint8
		encoding string
		garbage  []byte
	}{
		{request, 1 << 20, 10, "zstd", []byte("not zstd at all")},
		{request, 64, 0, "gzip", []byte{0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x00, 0x51, 0x00, 0x00}},
		{bytes.Repeat(request, 40), 4096, 1, "ZSTD ", []byte{0x1f, 0x8b, 0x08, 0x00}},
		{bytes.Repeat([]byte("a"), 5000), 4999, 3, " identity", bytes.Repeat([]byte("a"), 5000)},
		{nil, 0, 2, "", nil},
		{[]byte("{}"), 2, 5, "br", []byte("{}")},
		{bytes.Repeat([]byte("ab"), 3000), 6000, 2, "x-gzip", []byte("\x28\xb5\x2f\xfd\x00\x58")},
		// Regression seeds of a bug the fuzzer found: a small body in a
		// frame with a 2 MiB window (what libzstd's level 3 declares when
		// it does not know the size) under the goal routes' 1 MiB limit,
		// and an empty body in one frame (a 1 KiB window) under a limit of
		// 13 bytes, were refused as too large.
		{request, 1 << 20, 11, "deflate", []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")},
		{nil, 13, 2, "", []byte("0")},
	} {
		f.Add(tc.plain, tc.limit, tc.window, tc.encoding, tc.garbage)
	}
	zstdOneFrame, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	require.NoError(f, err)
	defer zstdOneFrame.Close()
	f.Fuzz(func(t *testing.T, plain []byte, limit32 uint32, window uint8, encoding string, garbage []byte) {
		limit := int64(limit32)
		for _, tc := range []struct {
			name, encoding string
			body           []byte
		}{
			{"identity", "", plain},
			{"identity named", "Identity", plain},
			{"zstd in one frame", "zstd", zstdOneFrame.EncodeAll(plain, nil)},
			{"zstd streamed", " Zstd", zstdStreamed(t, plain, int(window)%len(streamEncoders))},
			{"gzip", "gzip", gzipped(t, plain)},
		} {
			got, err := readBody(bodyRequest(tc.body, tc.encoding), limit)
			switch {
			case int64(len(tc.body)) > limit || int64(len(plain)) > limit:
				assert.ErrorIs(t, err, errBodyTooLarge, "%s: %d bytes, %d encoded, limit %d", tc.name, len(plain), len(tc.body), limit)
			case strings.HasPrefix(tc.name, "zstd") && zstdWindow(t, tc.body) > uint64(max(limit+1, zstdMaxWindow)):
				// A window past what the decoder may hold is refused,
				// whatever the content.
				assert.ErrorIs(t, err, errBodyTooLarge, "%s: window %d, limit %d", tc.name, zstdWindow(t, tc.body), limit)
			default:
				require.NoError(t, err, "%s: %d bytes, %d encoded, limit %d", tc.name, len(plain), len(tc.body), limit)
				assert.True(t, bytes.Equal(plain, got), "%s: got %d bytes back of %d", tc.name, len(got), len(plain))
			}
		}

		// Anything sent under any encoding: never more than the limit,
		// every error one of the three the client is answered with.
		for _, enc := range []string{"", "identity", "zstd", "gzip", encoding} {
			got, err := readBody(bodyRequest(garbage, enc), limit)
			assert.LessOrEqual(t, int64(len(got)), limit, "%q under %q", garbage, enc)
			if err != nil {
				assert.Nil(t, got)
				var unsupported *unsupportedEncodingError
				known := errors.Is(err, errBodyTooLarge) || errors.As(err, &unsupported) ||
					strings.HasPrefix(err.Error(), "zstd body: ") || strings.HasPrefix(err.Error(), "gzip body: ")
				assert.True(t, known, "%q under %q: %v", garbage, enc, err)
			}
			switch strings.ToLower(strings.TrimSpace(enc)) {
			case "", "identity":
				if int64(len(garbage)) <= limit {
					require.NoError(t, err)
					assert.True(t, bytes.Equal(garbage, got), "identity: the body as it came")
				}
			case "zstd", "gzip":
			default:
				if int64(len(garbage)) <= limit {
					var unsupported *unsupportedEncodingError
					assert.ErrorAs(t, err, &unsupported, "Content-Encoding %q", enc)
				} else {
					assert.ErrorIs(t, err, errBodyTooLarge)
				}
			}
		}
	})
}

func bodyRequest(body []byte, encoding string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", bytes.NewReader(body))
	if encoding != "" {
		r.Header.Set("Content-Encoding", encoding)
	}
	return r
}

// streamEncoders keeps zstdStreamed's encoders, one pool per window size
// (1 KiB << index): an encoder takes milliseconds to make, far longer than
// the rest of an iteration.
var streamEncoders [12]sync.Pool

// zstdStreamed is b compressed as a streaming encoder does when it does not
// know the size in advance: a frame that declares its window (1 KiB <<
// shift), written in two parts.
func zstdStreamed(t *testing.T, b []byte, shift int) []byte {
	enc, _ := streamEncoders[shift].Get().(*zstd.Encoder)
	if enc == nil {
		var err error
		enc, err = zstd.NewWriter(nil, zstd.WithWindowSize(zstd.MinWindowSize<<shift), zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false))
		require.NoError(t, err)
	}
	defer streamEncoders[shift].Put(enc)
	var buf bytes.Buffer
	enc.Reset(&buf)
	half := len(b) / 2
	_, err := enc.Write(b[:half])
	require.NoError(t, err)
	require.NoError(t, enc.Flush())
	_, err = enc.Write(b[half:])
	require.NoError(t, err)
	require.NoError(t, enc.Close())
	return buf.Bytes()
}

// zstdWindow is the window a zstd frame has its decoder keep: the one it
// declares or, in a single-segment frame, its content size; at least 1 KiB.
func zstdWindow(t *testing.T, frame []byte) uint64 {
	var h zstd.Header
	require.NoError(t, h.Decode(frame))
	if h.SingleSegment {
		return max(h.FrameContentSize, zstd.MinWindowSize)
	}
	return h.WindowSize
}

// gzipWriters keeps gzipped's writers: one takes a millisecond to make.
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

func gzipped(t *testing.T, b []byte) []byte {
	gz := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(gz)
	var buf bytes.Buffer
	gz.Reset(&buf)
	_, err := gz.Write(b)
	require.NoError(t, err)
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

// FuzzHop signs fuzzed requests and checks that the hop header verifies
// for exactly that request (its method, path, query, body, and the bound
// headers: User-Agent, originator, thread-id here), from that replica, to
// that replica, under that key, within hopSkew of the signing second, and
// not when one byte of any of these differs, under another key, outside
// the skew, at another replica, or with its sender, destination, time or
// nonce changed; and that fuzzed header strings never verify.
func FuzzHop(f *testing.F) {
	key := []byte("hop key derived from the secret key")
	at := time.Date(2026, 11, 30, 12, 0, 0, 500_000_000, time.UTC)
	body := []byte(`{"model":"gpt-5.5-codex","input":[]}`)
	nonce := strings.Repeat("0f", hopNonceLen/2)
	for _, tc := range []struct {
		key                    []byte
		from, to, nonce        string
		method, path, query    string
		ua, originator, thread string
		body                   []byte
		unix, nanos            int64
		offset                 int64
		pick                   uint16
		header                 string
	}{
		{key, "rep_0123456789abcdef", "rep_fedcba9876543210", nonce, "POST", "/v1/responses", "", "codex_cli_rs/0.130.0", "codex_cli_rs", "t-1",
			body, at.Unix(), 500_000_000, 29_999_999_999, 3, "rep_a.1796040000.00"},
		{key, "rep_a", "rep_b", nonce, "GET", "/backend-api/codex/responses", "a=1&b", "", "", "", nil, 0, 0, -30_000_000_000, 40, ""},
		{key, "rep_a", "rep_b", nonce, "POST", "/backend-api/codex/thread/goal/set", "x", "curl/8", "o", "t", []byte(`{"threadId":"t"}`),
			-1, 999_999_999, 1, 7, "a.b.1." + nonce + ".ff"},
		{[]byte{0}, "r", "s", nonce, "P", "/", "", "\x00", "\xff", "", []byte{0}, 1 << 40, 1, 0, 0, "r.s.1099511627776." + nonce + "." + strings.Repeat("0", 64)},
		{nil, "rep_a", "rep_b", nonce, "POST", "/v1/responses", "", "", "", "", body, at.Unix(), 0, 0, 1, "rep_a....."},
		{key, "rep.a", "rep_b", nonce, "POST", "/v1/responses", "", "", "", "", body, at.Unix(), 0, 0, 2, "rep.a.b.1.2.3"},
		{key, "rep_a", "", "short", "POST", "/v1/responses\n", "", "", "", "", body, at.Unix(), 0, 0, 2, ".rep_b.1796040000." + nonce + ".ff"},
	} {
		f.Add(tc.key, tc.from, tc.to, tc.nonce, tc.method, tc.path, tc.query, tc.ua, tc.originator, tc.thread, tc.body,
			tc.unix, tc.nanos, tc.offset, tc.pick, tc.header)
	}
	f.Fuzz(func(t *testing.T, key []byte, from, to, nonce, method, path, query, ua, originator, thread string, body []byte,
		unix, nanos, offset int64, pick uint16, header string) {
		unix %= 1 << 40 // some 35000 years either side of 1970: time.Time's arithmetic stays exact
		at := time.Unix(unix, nanos%int64(time.Second))
		second := time.Unix(at.Unix(), 0) // the hop carries whole seconds
		within := time.Duration(offset % int64(hopSkew+1))
		request := func(method, path, query, ua, originator, thread string, body []byte) hopRequest {
			return hopRequest{method: method, path: path, query: query, body: body,
				header: http.Header{"User-Agent": {ua}, "Originator": {originator}, "Thread-Id": {thread}, "X-Unbound": {ua}}}
		}
		req := request(method, path, query, ua, originator, thread, body)
		signed := signHop(key, from, to, at, nonce, req)
		verify := func(key []byte, header, self string, req hopRequest, now time.Time) error {
			got, err := verifyHop(key, header, self, req, now)
			if err == nil && (got.from != from || got.to != to || !got.at.Equal(second) || got.nonce != nonce) {
				t.Fatalf("verified as %+v, signed by %q to %q at %v with nonce %q", got, from, to, second, nonce)
			}
			return err
		}

		// A replica id and the nonce are fields of the header: one with a
		// dot cannot sign, and neither can an empty id or key, nor a nonce
		// of another length.
		canSign := len(key) > 0 && from != "" && to != "" && !strings.Contains(from+to+nonce, ".") && len(nonce) == hopNonceLen
		now := second.Add(within)
		err := verify(key, signed, to, req, now)
		require.Equal(t, canSign, err == nil, "signed %q by %q to %q, checked %v after: %v", signed, from, to, within, err)
		if !canSign {
			return
		}
		for _, now := range []time.Time{second.Add(hopSkew), second.Add(-hopSkew)} {
			assert.NoError(t, verify(key, signed, to, req, now), "at the edge of the skew")
		}
		for _, now := range []time.Time{second.Add(hopSkew + 1), second.Add(-hopSkew - 1), second.Add(hopSkew + 1 + time.Duration(offset&(1<<50-1)))} {
			assert.Equal(t, hopStale, verify(key, signed, to, req, now), "%v from the signing second", now.Sub(second))
		}
		assert.Equal(t, hopMisdirected, verify(key, signed, to+"x", req, now), "at another replica")
		assert.Equal(t, hopMisdirected, verify(key, signed, from+"x", req, now), "at yet another")
		// (HMAC pads a short key with zeros: a key and the same with zeros
		// after it are one key, so the longer key ends in another byte.)
		for name, changed := range map[string][]byte{"key": changeByte(key, pick), "longer key": append(bytes.Clone(key), 'k')} {
			assert.Equal(t, hopBadMAC, verify(changed, signed, to, req, now), "another %s", name)
		}
		other := func(v string) string { return string(changeByte([]byte(v), pick)) }
		for name, changed := range map[string]hopRequest{
			"method":       request(other(method), path, query, ua, originator, thread, body),
			"path":         request(method, other(path), query, ua, originator, thread, body),
			"query":        request(method, path, other(query), ua, originator, thread, body),
			"User-Agent":   request(method, path, query, other(ua), originator, thread, body),
			"originator":   request(method, path, query, ua, other(originator), thread, body),
			"thread-id":    request(method, path, query, ua, originator, other(thread), body),
			"body":         request(method, path, query, ua, originator, thread, changeByte(body, pick)),
			"longer body":  request(method, path, query, ua, originator, thread, append(bytes.Clone(body), 0)),
			"path + query": request(method, path+"?"+query, "", ua, originator, thread, body),
		} {
			assert.Equal(t, hopBadMAC, verify(key, signed, to, changed, now), "another %s", name)
		}
		if len(body) > 0 {
			assert.Equal(t, hopBadMAC, verify(key, signed, to, request(method, path, query, ua, originator, thread, body[:len(body)-1]), now), "a shorter body")
		}
		unbound := request(method, path, query, ua, originator, thread, body)
		unbound.header.Set("X-Unbound", other(ua))
		assert.NoError(t, verify(key, signed, to, unbound, now), "a header the hop does not cover")

		parts := strings.Split(signed, ".")
		require.Len(t, parts, 5)
		field := func(i int, v string) string {
			p := slices.Clone(parts)
			p[i] = v
			return strings.Join(p, ".")
		}
		for _, forged := range []string{
			"x" + signed,
			field(0, other(from)),
			field(1, other(to)),
			field(2, parts[2]+"1"),
			field(2, "+"+parts[2]),
			field(3, other(nonce)),
			field(4, strings.ToUpper(parts[4])+"00"),
			field(4, parts[4][:len(parts[4])-2]),
			signed + ".",
		} {
			self := to
			if forged == field(1, other(to)) {
				self = other(to) // the destination it names: only the signature can refuse it
			}
			assert.Error(t, verify(key, forged, self, req, now), "a forged header %q", forged)
		}

		// A header the fuzzer wrote never verifies (it cannot compute the
		// HMAC), for this request at any time near its own.
		if header != signed {
			_, err := verifyHop(key, header, to, req, now)
			assert.Error(t, err, "header %q", header)
		}
	})
}

// changeByte returns b with the byte at pick (modulo its length) changed,
// or one byte when b is empty.
func changeByte(b []byte, pick uint16) []byte {
	if len(b) == 0 {
		return []byte{byte(pick)}
	}
	out := bytes.Clone(b)
	out[int(pick)%len(out)] ^= byte(pick>>8) | 1
	return out
}
