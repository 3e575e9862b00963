package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/bridge"
	"github.com/codexrelay/codex-relay/cmd/internal/app"
	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/wire"
	"github.com/codexrelay/codex-relay/relay"
)

// benchEnv is what every phase of one run shares: the sim, the relay's
// store in front of it, and their credentials. Static after startEnv, but
// for relay, which each relay phase sets as it starts its relay.
type benchEnv struct {
	o        options
	log      *slog.Logger
	upstream *sim.Server
	accounts []sim.Account
	store    *store.Store
	// secret and adminHash are the relay's secret key and admin token
	// hash: random, for a throwaway database.
	secret    []byte
	adminHash [32]byte
	key       string // the relay's client key
	keyID     string
	database  string // the relay's store: sqlite or postgres
	// relay is the relay last started (startRelay); owned by the phase
	// that started it.
	relay *app.Relay
}

// relayGrace is how long a relay the bench stops may drain (demo's
// grace): its sessions have ended by then, but after an error.
const relayGrace = 5 * time.Second

// startEnv starts the sim (under its profiler label) and opens the
// relay's store with the sim's accounts and a client key; each relay phase
// starts a relay on it (startRelay). stop ends what was started, also
// after an error.
func startEnv(ctx context.Context, o options, log *slog.Logger) (*benchEnv, func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	env := &benchEnv{o: o, log: log}

	dir, err := os.MkdirTemp("", "codex-relay-bench-*")
	if err != nil {
		return nil, stop, fmt.Errorf("bench: %w", err)
	}
	stops = append(stops, func() { os.RemoveAll(dir) })

	for i := range o.accounts {
		id := fmt.Sprintf("bench-%d", i+1)
		org := "org-bench"
		if o.soak > 0 {
			// Two organisations: a thread that a fault moves may land where
			// its ciphertext cannot be read.
			org = fmt.Sprintf("org-%c", 'a'+i%2)
		}
		env.accounts = append(env.accounts, sim.Account{ID: id, AccessToken: "at-" + id, RefreshToken: "rt-" + id, Organization: org})
	}
	// The sim keeps one record per request and per WebSocket handshake
	// (the bench counts the events it sent from them): enough for a phase,
	// which clears them.
	maxRecords := 4*o.sessions()*(o.turns+1) + 1000
	pprof.Do(ctx, pprof.Labels("component", "sim"), func(context.Context) {
		var stopSim func()
		env.upstream, stopSim, err = sim.Listen(sim.Config{Accounts: env.accounts, MaxRecords: maxRecords, WSCompression: o.simCompression,
			Logger: log.With("component", "sim")}, "127.0.0.1:0", log)
		if err == nil {
			stops = append(stops, stopSim)
		}
	})
	if err != nil {
		return nil, stop, fmt.Errorf("bench: %w", err)
	}

	loc, err := store.ParseLocation(cmp.Or(o.databaseURL, "sqlite:"+filepath.Join(dir, "bench.db")))
	if err != nil {
		return nil, stop, fmt.Errorf("bench: -database-url: %w", err)
	}
	// The database is the bench's alone (one that holds accounts is
	// refused): a random secret key and admin token do.
	var secret, admin [32]byte
	_, _ = rand.Read(secret[:])
	_, _ = rand.Read(admin[:])
	env.secret, env.adminHash = secret[:], admin
	st, err := app.OpenStore(ctx, loc, env.secret, log)
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, func() { st.Close() })
	if existing, err := st.Accounts(ctx); err != nil {
		return nil, stop, err
	} else if len(existing) > 0 {
		return nil, stop, fmt.Errorf("bench: the database at %s holds accounts: give an empty one (the bench adds its own)", st.Location())
	}
	env.database = string(st.Dialect())
	for _, a := range env.accounts {
		if _, err := st.CreateAccount(ctx, store.Account{Kind: store.KindChatGPT, Label: a.ID, BaseURL: env.upstream.CodexBaseURL(),
			ChatGPTAccountID: a.ID, Organization: a.Organization}, store.Credentials{AccessToken: a.AccessToken, RefreshToken: a.RefreshToken}); err != nil {
			return nil, stop, err
		}
	}
	key, secretKey, err := st.CreateClientKey(ctx, store.ClientKey{Name: "bench"})
	if err != nil {
		return nil, stop, err
	}
	env.key, env.keyID = secretKey, key.ID
	env.store = st
	return env, stop, nil
}

// startRelay starts the relay on the bench's store as serve runs it
// (app: the web front and the HTTP server's limits before it, its own
// address and hop key, so it keeps thread leases, and its housekeeping,
// heartbeat and usage poller running), under the relay profiler label,
// answering the clients' deflate offers with compression. stop drains it
// and waits for everything it started.
func (e *benchEnv) startRelay(ctx context.Context, compression relay.CompressionMode) (url string, stop func(), err error) {
	return e.serveRelay(ctx, nil, e.relayOptions(compression))
}

// relayOptions are the relay's settings in this run: serve's defaults, the
// sim's token endpoint, the compressions asked for and, in a soak, what
// makes its faults end soon.
func (e *benchEnv) relayOptions(compression relay.CompressionMode) app.Options {
	opts := app.Options{Store: e.store, Secret: e.secret, AdminTokenHash: e.adminHash, Logger: e.log.With("component", "relay"),
		TokenURL: e.upstream.TokenURL(), ClientCompression: relay.Compression{Mode: compression},
		UpstreamCompression: relay.Compression{Mode: e.o.upstreamCompression}}
	if e.o.soak > 0 {
		// The soak's stalls end at a short idle deadline, and idle lanes
		// close soon after the sessions (its 401s are answered by
		// refreshing at the sim, which rotates the refresh token).
		opts.StreamIdleTimeout = soakStallDeadline
		opts.Bridge = bridge.PoolConfig{IdleTimeout: soakLaneIdle, SweepEvery: soakLaneIdle / 4}
		if n := e.o.cacheThreads; n > 0 {
			opts.Continuity = continuity.New(continuity.Options{MaxEntries: n})
			opts.OwnerIDs = 20 * n
		}
	}
	return opts
}

// serveRelay starts the relay with opts on a loopback port, its listener
// wrapped by wrap when set, and serves it until stop (or ctx).
func (e *benchEnv) serveRelay(ctx context.Context, wrap func(net.Listener) net.Listener, opts app.Options) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench: listen: %w", err)
	}
	url = "http://" + ln.Addr().String()
	if wrap != nil {
		ln = wrap(ln)
	}
	pprof.Do(ctx, pprof.Labels("component", "relay"), func(ctx context.Context) {
		var rl *app.Relay
		if rl, err = app.New(ln, opts); err != nil {
			ln.Close()
			return
		}
		e.relay = rl
		sctx, stopServe := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- rl.Serve(sctx, relayGrace) }()
		stop = func() {
			stopServe()
			if err := <-served; err != nil {
				e.log.Warn("relay stopped", "err", err)
			}
		}
	})
	if err != nil {
		return "", nil, fmt.Errorf("bench: %w", err)
	}
	return url, stop, nil
}

// target returns where a phase's sessions go. The pipe is started here
// and stopped by the returned func, which also reports the bytes it
// copied.
func (e *benchEnv) target(ctx context.Context, name string, compression relay.CompressionMode) (benchTarget, func() int64, error) {
	simHeader := func(conv int) http.Header {
		a := e.accounts[conv%len(e.accounts)]
		return http.Header{"Authorization": {"Bearer " + a.AccessToken}, "Chatgpt-Account-Id": {a.ID}}
	}
	switch name {
	case targetDirect:
		return benchTarget{name: name, base: e.upstream.CodexBaseURL(), header: simHeader}, func() int64 { return 0 }, nil
	case targetPipe:
		var p *bytePipe
		var err error
		pprof.Do(ctx, pprof.Labels("component", "pipe"), func(context.Context) {
			p, err = startBytePipe(strings.TrimPrefix(e.upstream.URL, "http://"))
		})
		if err != nil {
			return benchTarget{}, nil, fmt.Errorf("bench: %w", err)
		}
		return benchTarget{name: name, base: "http://" + p.Addr() + "/backend-api/codex", header: simHeader}, p.Close, nil
	default:
		url, stop, err := e.startRelay(ctx, compression)
		if err != nil {
			return benchTarget{}, nil, err
		}
		return benchTarget{name: name, base: url + "/backend-api/codex", header: func(int) http.Header {
			return http.Header{"Authorization": {"Bearer " + e.key}}
		}}, func() int64 { stop(); return 0 }, nil
	}
}

// simEvents is how many events the sim sent in answers to response
// requests since its records were last cleared.
func (e *benchEnv) simEvents() int64 {
	var n int64
	for _, r := range e.upstream.Records(sim.RecordFilter{Route: sim.RouteResponses}) {
		if r.Kind != sim.RecordHandshake {
			n += int64(answerEvents(r.EventTypes))
		}
	}
	return n
}

// answerEvents counts the events of an answer, less its codex.rate_limits
// events: those report limits, and the relay replaces the account's with
// the client key's own (one before each WebSocket response, headers over
// HTTP), so neither side counts them.
func answerEvents(types []string) int {
	n := 0
	for _, t := range types {
		if t != wire.EventRateLimits {
			n++
		}
	}
	return n
}
