package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image is; the Dockerfile says the same (TestDockerfileMatchesImage).
const (
	defaultSource = "https://github.com/codexrelay/codex-relay"
	binaryPath    = "/usr/local/bin/codex-relay"
	dataDir       = "/data"
	port          = "2455"
	// nonroot is distroless's non-root user and group, 65532.
	nonrootUID = 65532
	userSpec   = "65532:65532"
)

// metadata is what the build is stamped with.
type metadata struct {
	version string
	commit  string
	source  string
}

// imageConfig is the runtime configuration: a non-root user, the relay
// listening on every interface of the container, SQLite on the /data volume
// unless CODEX_RELAY_DATABASE_URL says otherwise, JSON logs, and a health
// check by the binary itself (the image has no shell and no curl).
func imageConfig(m metadata, created time.Time) v1.Config {
	labels := map[string]string{
		"org.opencontainers.image.title":       "codex-relay",
		"org.opencontainers.image.description": "A relay between Codex and a pool of upstream accounts",
		"org.opencontainers.image.version":     m.version,
		"org.opencontainers.image.revision":    m.commit,
		"org.opencontainers.image.source":      m.source,
		"org.opencontainers.image.url":         m.source,
	}
	if created.Unix() > 0 { // the epoch stands for "not given"
		labels["org.opencontainers.image.created"] = created.UTC().Format(time.RFC3339)
	}
	return v1.Config{
		User:       userSpec,
		Entrypoint: []string{binaryPath},
		Cmd:        []string{"serve"},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"CODEX_RELAY_ADDR=0.0.0.0:" + port,
			"CODEX_RELAY_DATABASE_URL=" + dataDir + "/codex-relay.db",
			"CODEX_RELAY_LOG_FORMAT=json",
		},
		ExposedPorts: map[string]struct{}{port + "/tcp": {}},
		Volumes:      map[string]struct{}{dataDir: {}},
		Healthcheck: &v1.HealthConfig{
			Test:        []string{"CMD", binaryPath, "healthcheck"},
			Interval:    30 * time.Second,
			Timeout:     5 * time.Second,
			StartPeriod: 30 * time.Second,
			Retries:     3,
		},
		Labels:     labels,
		StopSignal: "SIGTERM",
	}
}

// assemble lays the binary and what it needs on an empty base.
func assemble(bin, caCerts, goarch string, created time.Time, m metadata) (v1.Image, error) {
	layer, err := rootLayer(bin, caCerts, created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "go run ./deploy/image", Comment: "codex-relay " + m.version},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	cf.Created = v1.Time{Time: created}
	cf.Config = imageConfig(m, created)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return img, nil
}

// entry is one file or directory of the root layer.
type entry struct {
	name     string // without a leading slash; a trailing one marks a directory
	mode     int64
	uid, gid int
	body     []byte
}

// rootLayer is the image's one layer: what distroless static provides that
// the relay uses (CA certificates, passwd and group with the non-root user,
// nsswitch.conf, a /tmp) and the binary, plus /data owned by the non-root
// user so a volume mounted there starts writable. Time zones are in the
// binary (time/tzdata). Entries are sorted and dated alike, so the layer's
// digest depends on its content only.
func rootLayer(bin, caCerts string, created time.Time) (v1.Layer, error) {
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("binary: %w", err)
	}
	certs, err := os.ReadFile(caCerts)
	if err != nil {
		return nil, fmt.Errorf("CA certificates: %w (on Debian: apt-get install ca-certificates, or give -ca-certs)", err)
	}
	if !bytes.Contains(certs, []byte("BEGIN CERTIFICATE")) {
		return nil, fmt.Errorf("CA certificates %s: no PEM certificate in it", caCerts)
	}
	entries := []entry{
		{name: "data/", mode: 0o700, uid: nonrootUID, gid: nonrootUID},
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{name: "etc/nsswitch.conf", mode: 0o644, body: []byte("hosts: files dns\n")},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: certs},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: nonrootUID, gid: nonrootUID},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
		{name: strings.TrimPrefix(binaryPath, "/"), mode: 0o755, body: binary},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: created, Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// write stores img at out as a docker tarball or an OCI image layout, and
// returns its digest.
func write(img v1.Image, out, format, tag string) (string, error) {
	ref, err := name.NewTag(tag)
	if err != nil {
		return "", fmt.Errorf("-tag %q: %w", tag, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	switch format {
	case "docker":
		if err := tarball.WriteToFile(out, ref, img); err != nil {
			return "", fmt.Errorf("write %s: %w", out, err)
		}
	case "oci":
		if _, err := os.Stat(path.Join(out, "index.json")); err == nil {
			return "", fmt.Errorf("%s already holds an image layout: remove it or choose another -o", out)
		}
		p, err := layout.Write(out, empty.Index)
		if err != nil {
			return "", fmt.Errorf("write %s: %w", out, err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.TagStr()})); err != nil {
			return "", fmt.Errorf("write %s: %w", out, err)
		}
	default:
		return "", fmt.Errorf("-format %q: want docker or oci", format)
	}
	return digest.String(), nil
}
