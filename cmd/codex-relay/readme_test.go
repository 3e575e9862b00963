package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/logbuf"
)

// readmeSection is the text of README's section under heading ("### Try
// it"), up to the next heading of the same or a higher level outside a
// code block.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	level := strings.Index(heading, " ")
	var out []string
	in, fenced := false, false
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(line, "#") {
			if in && strings.Index(line, " ") <= level {
				break
			}
			if line == heading {
				in = true
				continue
			}
		}
		if in {
			out = append(out, line)
		}
	}
	require.NotEmpty(t, out, "README has no %q", heading)
	return strings.Join(out, "\n")
}

// shellBlocks are the ```sh blocks of a README text, each as its lines
// without indentation.
func shellBlocks(text string) [][]string {
	var out [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)\n\\s*```").FindAllStringSubmatch(text, -1) {
		var lines []string
		for _, l := range strings.Split(m[1], "\n") {
			lines = append(lines, strings.TrimSpace(l))
		}
		out = append(out, lines)
	}
	return out
}

// README's quick start with the demo, run as written: its commands come
// from the README, the export line and the config block the demo printed
// are pasted as a person would (step 2 and 3), and README's codex line runs
// the first turn through the relay with the pinned Codex CLI. The only
// lines added to the pasted config turn Codex's update check and
// analytics off, so the test stays off the internet.
func TestREADMEQuickStartDemo(t *testing.T) {
	bin, err := codexcli.Binary()
	if err != nil {
		if os.Getenv(codexcli.RequireEnv) == "1" {
			t.Fatalf("%v (run npm ci)", err)
		}
		t.Skipf("%v (run npm ci)", err)
	}
	blocks := shellBlocks(readmeSection(t, "### Try it with the demo (no account needed)"))
	require.Len(t, blocks, 3, "start, environment, first turn: %q", blocks)
	require.Equal(t, []string{"go run ./cmd/codex-relay demo"}, blocks[0], "step 1 runs this package's demo command")
	require.Len(t, blocks[1], 2)
	require.Equal(t, "export CODEX_HOME=$(mktemp -d)", blocks[1][0])
	require.True(t, strings.HasPrefix(blocks[1][1], "export CODEX_RELAY_KEY=crk_..."), blocks[1][1])
	require.Len(t, blocks[2], 1)
	firstTurn := blocks[2][0]
	require.True(t, strings.HasPrefix(firstTurn, "codex exec "), firstTurn)

	demoOut, demoErr := &logbuf.Buffer{}, &logbuf.Buffer{}
	startDemo(t, map[string]string{"CODEX_RELAY_ADDR": "127.0.0.1:0"}, demoOut, demoErr)
	printed := demoOut.String()
	export := regexp.MustCompile(`(?m)^\s*(export CODEX_RELAY_KEY=crk_[0-9A-Za-z]+)$`).FindStringSubmatch(printed)
	require.NotNil(t, export, printed)
	config := regexp.MustCompile(`(?s)\n(model = .*?supports_websockets = true\n)`).FindStringSubmatch(printed)
	require.NotNil(t, config, "the demo prints a config block to paste: %s", printed)
	require.Regexp(t, `console\s+http://127\.0\.0\.1:\d+/admin/`, printed, "step 4's console address")
	require.Regexp(t, `cra_[0-9A-Za-z]+`, printed, "step 4's admin token")

	script := strings.Join([]string{
		"set -eu",
		blocks[1][0],
		export[1],
		"cat > \"$CODEX_HOME/config.toml\" <<'PASTED'\ncheck_for_update_on_startup = false\n" + config[1] + "\n[analytics]\nenabled = false\nPASTED",
		firstTurn + " </dev/null",
	}, "\n")
	ctx, cancel := context.WithTimeout(context.Background(), codexcli.DefaultTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	home := t.TempDir()
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + t.TempDir()}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README's demo path, run as written:\n%s\n---\n%s", script, out)
	assert.Contains(t, string(out), "Simulated reply to: say hello", "the first turn went through the relay to the simulated upstream")
}
