package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set at link time by release and image builds:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)"
//
// Left empty, version falls back to the module version the binary was built
// from (go install ...@v1.2.3) or "devel", and commit to the VCS revision Go
// stamped into the binary (absent under -buildvcs=false or without .git, as
// in a Docker build context, which is why the image builds pass it).
var (
	version string
	commit  string
)

// versionInfo is what `codex-relay version` reports.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"` // built from a work tree with uncommitted changes
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// buildVersion derives the version report from the link-time variables and
// the build information (nil when the binary carries none).
func buildVersion(linkVersion, linkCommit string, bi *debug.BuildInfo) versionInfo {
	v := versionInfo{Version: linkVersion, Commit: linkCommit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		if v.Version == "" {
			v.Version = "devel"
		}
		return v
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	if v.Version == "" {
		v.Version = "devel"
	}
	vcsRevision := ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			vcsRevision = s.Value
		case "vcs.modified":
			// Only meaningful with the revision it belongs to.
			if linkCommit == "" {
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Commit == "" {
		v.Commit = vcsRevision
	}
	return v
}

// currentVersion is the version report of this binary.
func currentVersion() versionInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return buildVersion(version, commit, bi)
}

// String is the one-line form: "codex-relay v1.2.3 (commit abc1234, modified) go1.26.0 linux/amd64".
func (v versionInfo) String() string {
	s := "codex-relay " + v.Version
	if v.Commit != "" {
		s += " (commit " + v.Commit
		if v.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + " " + v.Go + " " + v.Platform
}

func runVersion(_ context.Context, c cli, args []string) error {
	fs := newFlagSet(c, "version", "Print the version, the commit the binary was built from and its Go version.")
	asJSON := fs.Bool("json", false, "print a JSON object: version, commit, modified, go, platform")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q", fs.Arg(0))
	}
	v := currentVersion()
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		return enc.Encode(v)
	}
	_, err := fmt.Fprintln(c.stdout, v.String())
	return err
}
