package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/budget"
	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/store"
)

// tui is the interactive Codex TUI in a detached tmux session.
type tui struct {
	t       *testing.T
	session string
}

// startTUI runs codex's TUI for c in a tmux session of its own, or skips
// the test when tmux is missing (fails under CODEX_RELAY_REQUIRE_E2E=1).
func startTUI(t *testing.T, c *codexcli.Codex) *tui {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv(codexcli.RequireEnv) == "1" {
			t.Fatalf("tmux is missing (%s=1 requires it; scripts/test.sh installs it)", codexcli.RequireEnv)
		}
		t.Skip("tmux is missing: the TUI test needs it")
	}
	name := fmt.Sprintf("codex-relay-%d-%d", os.Getpid(), time.Now().UnixNano())
	env := append(c.Env(), "TERM=xterm-256color")
	args := []string{"new-session", "-d", "-s", name, "-x", "200", "-y", "60", "-c", c.Dir, "env", "-i"}
	// Without --no-daemon, the TUI (0.157 and later) starts a detached,
	// shared app-server under CODEX_HOME and an updater beside it, which
	// outlive the session and would fetch Codex releases.
	args = append(append(args, env...), c.Binary, "--no-daemon")
	out, err := exec.Command("tmux", args...).CombinedOutput()
	require.NoError(t, err, "tmux: %s", out)
	t.Cleanup(func() {
		_ = exec.Command("tmux", "kill-session", "-t", name).Run()
		if left := processesUnder(filepath.Join(c.Home, "packages")); len(left) > 0 {
			for _, p := range left {
				_ = p.Kill()
			}
			t.Errorf("the TUI left %d processes running from its CODEX_HOME (a daemon?)", len(left))
		}
	})
	return &tui{t: t, session: name}
}

// processesUnder lists the processes whose command line names dir (read
// from /proc; none where there is no /proc): programs run from a folder
// Codex installs into.
func processesUnder(dir string) []*os.Process {
	entries, err := os.ReadDir("/proc")
	if err != nil || dir == "" {
		return nil
	}
	var out []*os.Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte(dir)) {
			continue
		}
		if p, err := os.FindProcess(pid); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// pane is what the TUI shows now.
func (u *tui) pane() string {
	out, err := exec.Command("tmux", "capture-pane", "-p", "-t", u.session).Output()
	require.NoError(u.t, err)
	return string(out)
}

// waitFor polls the pane until ok holds for it, within d, and fails the
// test when it does not.
func (u *tui) waitFor(d time.Duration, what string, ok func(pane string) bool) string {
	u.t.Helper()
	p, held := u.await(d, ok)
	if !held {
		u.t.Fatalf("the TUI did not show %s within %s; it shows:\n%s", what, d, p)
	}
	return p
}

// await polls the pane until ok holds for it, within d, and reports
// whether it did, with the last pane. Codex's offer to switch models near
// a limit, which comes over the composer and the transcript, is declined
// whenever it shows.
func (u *tui) await(d time.Duration, ok func(pane string) bool) (string, bool) {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p := u.pane()
		if ok(p) {
			return p, true
		}
		if strings.Contains(p, rateLimitOffer) && strings.Contains(p, "Keep current model") {
			require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "Escape").Run())
		}
		if time.Now().After(deadline) {
			return p, false
		}
		<-tick.C
	}
}

// slashCommand runs a slash command (/status) and waits until ok holds for
// the pane. The offer to switch models may come once a turn is over, and
// take what is typed or the Enter: the command is typed again, up to three
// times, until it shows what it should.
func (u *tui) slashCommand(cmd, what string, ok func(pane string) bool) string {
	u.t.Helper()
	var p string
	for try := 0; try < 3; try++ {
		require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "C-u").Run())
		require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "-l", cmd).Run())
		if _, typed := u.await(30*time.Second, func(p string) bool { return strings.Contains(p, "› "+cmd) }); !typed {
			continue
		}
		require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "Enter").Run())
		var shown bool
		if p, shown = u.await(20*time.Second, ok); shown {
			return p
		}
	}
	u.t.Fatalf("the TUI did not show %s after %s three times; it shows:\n%s", what, cmd, p)
	return p
}

// rateLimitOffer heads Codex's offer to switch models near a limit.
const rateLimitOffer = "Approaching rate limits"

// submit types text, waits until the composer shows it (typed in one
// burst, an Enter would be taken as part of a paste), then presses Enter.
func (u *tui) submit(text string) {
	u.t.Helper()
	require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "-l", text).Run())
	u.waitFor(30*time.Second, "the typed "+strconv.Quote(text), func(p string) bool { return strings.Contains(p, "› "+text) })
	require.NoError(u.t, exec.Command("tmux", "send-keys", "-t", u.session, "Enter").Run())
}

// spendKey spends key k's first limit, through the relay with its secret,
// until its use reaches at least target: each request's use is waited
// for, so the spending stops within one request of it (the sim counts
// tokens alike every run). It returns the key's use now, as a function.
func spendKey(t *testing.T, h *harness, k store.ClientKey, secret string, target float64) func() float64 {
	t.Helper()
	ctx := context.Background()
	used := func() float64 {
		lu, err := h.store.KeyBudget(ctx, k, "", time.Time{}, time.UTC)
		require.NoError(t, err)
		return lu[0].Used + lu[0].Reserved
	}
	for i := 0; used() < target; i++ {
		require.Less(t, i, 500, "the key's use does not grow")
		before := used()
		resp, body := h.post(sessionS, "", responseRequest(strings.Repeat("spend the day's tokens ", 1000)), bearer(secret))
		require.Equal(t, 200, resp.StatusCode, body)
		require.Eventually(t, func() bool { return used() > before }, time.Minute, 10*time.Millisecond, "the request's use is counted")
	}
	return used
}

// The real Codex TUI, pointed at the relay with the README's config block,
// shows the limit of its client key: after a turn, its warning and status
// line name the key's daily limit and what is left of it (the relay's
// headers; the serving account reports 5h and weekly windows with nothing
// used). Codex 0.171.0's /status card itself reads the limits through the
// account (a ChatGPT login's /wham/usage): with an API key provider it says
// "data not available yet", so only its rendering is checked here.
func TestCodexTUIShowsTheKeysLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	const max = 100000
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "tui",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: max}}})
	require.NoError(t, err)
	// Most of the day's tokens are spent already, by other requests of the
	// key. What the relay reports during Codex's turn may add the turn's
	// own reservation; past 90%, Codex offers to switch models (a prompt
	// over the TUI, declined below when it comes).
	used := spendKey(t, h, k, secret, 0.80*max)
	require.Less(t, used(), 0.9*max, "one request spends a small part of the day")
	codex := codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), WebSockets: false, Key: secret})
	u := startTUI(t, codex)
	u.waitFor(time.Minute, "its composer", func(p string) bool { return strings.Contains(p, "Ask Codex to do anything") })
	u.submit("say hello")
	left := regexp.MustCompile(`daily limit: (?:only )?(<?\d+)% left`)
	p := u.waitFor(time.Minute, "the key's daily limit", func(p string) bool {
		return strings.Contains(p, "Simulated reply to: say hello") && left.MatchString(p)
	})
	m := left.FindStringSubmatch(p)[1]
	if m != "<1" {
		n, err := strconv.Atoi(m)
		require.NoError(t, err)
		assert.LessOrEqual(t, n, 20, "at least 80%% of the day's tokens are used: %s", p)
	}
	assert.Contains(t, p, "of your daily limit left", "the TUI's warning names the key's window")
	assert.NotContains(t, p, "5h limit", "the serving account's window")
	p = u.slashCommand("/status", "the /status card", func(p string) bool { return strings.Contains(p, "Model provider:") })
	t.Logf("/status:\n%s", p)
}

// With a ChatGPT login (Codex Desktop's and the IDE's sign-in, its token the
// relay's client key), Codex's /status card reads the limits through
// chatgpt_base_url's wham/usage, which the relay answers with the key's own
// window: the card shows the key's daily limit and how much of it is used.
// Codex first discovers its workspace's routing (wham/accounts/check, the
// relay's answer) and accepts only an HTTPS chatgpt_base_url, so the relay
// is served over TLS here, its certificate given to Codex.
func TestCodexTUIStatusCardShowsTheKeysLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"))
	ctx := context.Background()
	const max = 100000
	k, secret, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "desktop",
		Limits: []budget.Limit{{Metric: budget.Tokens, Window: budget.Day, Max: max}}})
	require.NoError(t, err)
	used := spendKey(t, h, k, secret, 0.40*max)
	codex := chatGPTCodexTLS(t, h, secret)
	// With a ChatGPT login on gpt-5.5, Codex offers its newer model once,
	// over the composer, and notes the offer made in config.toml: noted
	// here already, so that no key typed can land in the offer instead.
	f, err := os.OpenFile(filepath.Join(codex.Home, "config.toml"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("\n[notice.model_migrations]\n\"gpt-5.5\" = \"gpt-6-sol\"\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	u := startTUI(t, codex)
	u.waitFor(time.Minute, "its composer", func(p string) bool { return strings.Contains(p, "Ask Codex to do anything") })
	spent := used() / max * 100
	daily := regexp.MustCompile(`Daily limit:\s+\[[█░]+\] (\d+)% left`)
	p := u.slashCommand("/status", "the /status card's daily limit", func(p string) bool {
		return strings.Contains(p, "Model provider:") && daily.MatchString(p)
	})
	left, err := strconv.Atoi(daily.FindStringSubmatch(p)[1])
	require.NoError(t, err)
	assert.InDelta(t, 100-spent, float64(left), 1.5, "the card shows what is left of the key's day (%.1f%% spent):\n%s", spent, p)
	assert.NotContains(t, p, "5h limit", "the serving account's windows never reach the client")
	assert.NotContains(t, p, "Weekly limit")
	assert.Contains(t, p, "ChatGPT workspace:   Codex Relay", "the workspace is the relay's (wham/accounts/check)")
}
