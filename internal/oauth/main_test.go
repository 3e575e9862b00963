package oauth_test

import (
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// TestMain fails the package when a goroutine of ours or of net/http
// outlives the tests: refresh flights and poller loops must all end.
func TestMain(m *testing.M) { leakcheck.Main(m) }

// clock is a clock a test moves by hand, shared by the sim, the store and
// the code under test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_800_000_000, 0).UTC()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newLogger returns a debug-level logger into a buffer the test inspects.
func newLogger(t testing.TB) (*slog.Logger, *logbuf.Buffer) {
	buf := &logbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// httpClient returns a client with its own transport, closed at the end.
func httpClient(t testing.TB) *http.Client {
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// newSim starts a sim on the clock and closes it when the test ends.
func newSim(t testing.TB, c *clock, accts ...sim.Account) *sim.Server {
	t.Helper()
	upstream := sim.NewServer(sim.Config{Accounts: accts, Now: c.Now})
	t.Cleanup(upstream.Close)
	return upstream
}

// simAccount is a chatgpt account of the sim with never-expiring tokens.
func simAccount(id, email string) sim.Account {
	return sim.Account{ID: id, Kind: sim.KindChatGPT, AccessToken: "at-" + id + "-original",
		RefreshToken: "rt-" + id + "-original", ChatGPTAccountID: "cg-" + id, Organization: "org-" + id, Email: email}
}

// openStore opens (and migrates) the store at url on the clock.
func openStore(t testing.TB, url string, c *clock) *store.Store {
	return storetest.Open(t, url, store.Options{Now: c.Now})
}

// addAccount stores the relay's copy of a sim account, pointed at the sim,
// with its access token expiring at exp.
func addAccount(t testing.TB, s *store.Store, upstream *sim.Server, a sim.Account, exp time.Time) store.Account {
	t.Helper()
	acct, err := s.CreateAccount(t.Context(), store.Account{
		Kind: store.KindChatGPT, Label: a.ID, BaseURL: upstream.CodexBaseURL(), ChatGPTAccountID: a.ChatGPTAccountID,
		Organization: a.Organization, Email: a.Email, PlanType: "plus", AccessExpiresAt: exp,
	}, store.Credentials{AccessToken: a.AccessToken, RefreshToken: a.RefreshToken})
	require.NoError(t, err)
	return acct
}
