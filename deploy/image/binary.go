package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// mainPackage is what the image runs.
const mainPackage = "./cmd/codex-relay"

// ldflags stamps the version and commit into the binary (see
// cmd/codex-relay/version.go), and strips the symbol table and DWARF, as the
// Dockerfile does.
func ldflags(m metadata) string {
	return fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s", m.version, m.commit)
}

// compile builds the static codex-relay binary for linux/goarch at out, from
// the module the working directory is in.
func compile(ctx context.Context, out, goarch string, m metadata) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	if strings.ContainsAny(m.version+m.commit, " \t\n'\"") {
		return fmt.Errorf("-version and -commit must not contain spaces or quotes: %q %q", m.version, m.commit)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags(m), "-o", out, mainPackage)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", mainPackage, err, stderr.Bytes())
	}
	return nil
}

// moduleRoot is the directory of the go.mod the working directory belongs to.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w (is the go command installed?)", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run the image builder inside the codex-relay module (go run ./deploy/image)")
	}
	return filepath.Dir(gomod), nil
}

// checkStatic refuses a binary that is not a statically linked linux ELF
// executable: on an image with no libc it would not start.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("binary %s needs %v: build it with CGO_ENABLED=0", path, libs)
	}
	return nil
}
