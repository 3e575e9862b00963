package main

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The version comes from the link-time variable, else the module version,
// else "devel"; the commit from the link-time variable, else the VCS
// revision Go stamped, with its modified flag.
func TestBuildVersion(t *testing.T) {
	t.Parallel()
	stamped := func(mainVersion string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/codexrelay/codex-relay", Version: mainVersion}, Settings: settings}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	clean := debug.BuildSetting{Key: "vcs.modified", Value: "false"}
	for _, tc := range []struct {
		name                    string
		linkVersion, linkCommit string
		bi                      *debug.BuildInfo
		want                    versionInfo
	}{
		{"no build information", "", "", nil, versionInfo{Version: "devel", Go: runtime.Version()}},
		{"a work tree build", "", "", stamped("(devel)", rev, dirty), versionInfo{Version: "devel", Commit: rev.Value, Modified: true, Go: "go1.99.1"}},
		{"a clean work tree", "", "", stamped("(devel)", rev, clean), versionInfo{Version: "devel", Commit: rev.Value, Go: "go1.99.1"}},
		{"go install of a tag", "", "", stamped("v1.4.0"), versionInfo{Version: "v1.4.0", Go: "go1.99.1"}},
		{"the link-time version wins", "v2.0.0", "", stamped("v1.4.0", rev), versionInfo{Version: "v2.0.0", Commit: rev.Value, Go: "go1.99.1"}},
		{"the link-time commit wins, and the modified flag of another revision is not its", "v2.0.0", "fedcba", stamped("(devel)", rev, dirty),
			versionInfo{Version: "v2.0.0", Commit: "fedcba", Go: "go1.99.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := buildVersion(tc.linkVersion, tc.linkCommit, tc.bi)
			tc.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
			assert.Equal(t, tc.want, got)
		})
	}
	assert.Equal(t, "codex-relay v1.4.0 (commit abc, modified) go1.99.1 linux/arm64",
		versionInfo{Version: "v1.4.0", Commit: "abc", Modified: true, Go: "go1.99.1", Platform: "linux/arm64"}.String())
	assert.Equal(t, "codex-relay devel go1.99.1 linux/arm64", versionInfo{Version: "devel", Go: "go1.99.1", Platform: "linux/arm64"}.String())
}

// `codex-relay version` prints one line; -json an object with the same facts.
func TestVersionCommand(t *testing.T) {
	orig := version
	version = "v9.9.9-test"
	t.Cleanup(func() { version = orig })

	var out bytes.Buffer
	c := cli{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	require.NoError(t, run(context.Background(), []string{"version"}, c))
	assert.Regexp(t, `^codex-relay v9\.9\.9-test .*go1\.\d+.* `+runtime.GOOS+"/"+runtime.GOARCH+"\n$", out.String())

	out.Reset()
	require.NoError(t, run(context.Background(), []string{"version", "-json"}, c))
	var v map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &v), out.String())
	assert.Equal(t, "v9.9.9-test", v["version"])
	assert.Equal(t, runtime.Version(), v["go"])
	assert.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, v["platform"])

	assert.Error(t, run(context.Background(), []string{"version", "extra"}, c))
}
