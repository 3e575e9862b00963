// Command image builds the codex-relay container image without a Docker
// daemon or a registry: it compiles the static binary (CGO_ENABLED=0,
// -trimpath, the version stamped with -ldflags), lays it on an empty base with
// CA certificates, a passwd entry for the non-root user and the /data volume,
// and writes the image as a `docker load` tarball or an OCI image layout.
//
//	go run ./deploy/image -version v1.2.3 -commit "$(git rev-parse HEAD)" -o codex-relay.tar
//	docker load -i codex-relay.tar      # or: crane push codex-relay.tar ghcr.io/you/codex-relay:v1.2.3
//
// The image is the one the Dockerfile builds (same user, entrypoint,
// environment, port, volume, health check and labels; a test compares them),
// with the builder's own CA bundle in place of distroless's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// options are the builder's flags.
type options struct {
	out      string
	format   string // docker or oci
	tag      string
	binary   string // a prebuilt binary to package instead of building one
	goarch   string
	caCerts  string
	created  time.Time
	metadata metadata
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var created string
	fs.StringVar(&o.out, "o", "codex-relay-image.tar", "where to write the image: a tar file (-format docker) or a directory (-format oci)")
	fs.StringVar(&o.format, "format", "docker", "docker: a tarball for docker load, podman load, kind load image-archive or crane push; oci: an OCI image layout directory (skopeo, crane, containerd)")
	fs.StringVar(&o.tag, "tag", "", "the image name in a docker tarball (default codex-relay:<version>)")
	fs.StringVar(&o.binary, "binary", "", "package this static linux binary instead of building ./cmd/codex-relay")
	fs.StringVar(&o.goarch, "goarch", runtime.GOARCH, "the architecture to build for (amd64, arm64, ...)")
	fs.StringVar(&o.caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle the image trusts (Debian: apt-get install ca-certificates)")
	fs.StringVar(&o.metadata.version, "version", "devel", "the version stamped into the binary (main.version) and the image label")
	fs.StringVar(&o.metadata.commit, "commit", "", "the commit stamped into the binary (main.commit) and the image label org.opencontainers.image.revision")
	fs.StringVar(&o.metadata.source, "source", defaultSource, "the org.opencontainers.image.source label")
	fs.StringVar(&created, "created", os.Getenv("SOURCE_DATE_EPOCH"), "the image's creation time, unix seconds or RFC 3339 (env SOURCE_DATE_EPOCH); default the epoch, so builds are reproducible")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.created = time.Unix(0, 0).UTC()
	if created != "" {
		t, err := parseCreated(created)
		if err != nil {
			return err
		}
		o.created = t
	}
	if o.tag == "" {
		o.tag = "codex-relay:" + sanitizeTag(o.metadata.version)
	}
	return build(ctx, o, stdout)
}

// build compiles (or takes) the binary, assembles the image and writes it.
func build(ctx context.Context, o options, stdout io.Writer) error {
	bin := o.binary
	if bin == "" {
		dir, err := os.MkdirTemp("", "codex-relay-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = dir + "/codex-relay"
		if err := compile(ctx, bin, o.goarch, o.metadata); err != nil {
			return err
		}
	}
	if err := checkStatic(bin); err != nil {
		return err
	}
	img, err := assemble(bin, o.caCerts, o.goarch, o.created, o.metadata)
	if err != nil {
		return err
	}
	digest, err := write(img, o.out, o.format, o.tag)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (%s, %s, %s)\n", o.out, o.format, o.tag, digest)
	return nil
}

func parseCreated(s string) (time.Time, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("-created %q: want unix seconds or an RFC 3339 time", s)
	}
	return t.UTC(), nil
}

// sanitizeTag turns a version into a valid image tag ([A-Za-z0-9_.-], at
// most 128 characters, not starting with . or -).
func sanitizeTag(v string) string {
	b := []byte(v)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	if len(b) == 0 || b[0] == '.' || b[0] == '-' {
		b = append([]byte("v"), b...)
	}
	return string(b)
}
