# syntax=docker/dockerfile:1
#
# The codex-relay image: a static binary on distroless static (CA certificates,
# a non-root user, no shell), SQLite on the /data volume by default.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t codex-relay .
#
# Without a Docker daemon, `go run ./deploy/image` builds the same image (same
# user, entrypoint, environment, port, volume, health check and labels; a test
# in deploy/image compares the two) as a tarball for docker load or crane push.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# go build downloads only the modules the binary needs (not the deployment
# tests' Helm and Kubernetes ones), into a cache kept between builds.
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=devel
ARG COMMIT=
# Static (no cgo: the SQLite driver is pure Go), no build paths, the version
# stamped for `codex-relay version`; time zones are embedded (time/tzdata).
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/usr/local/bin/codex-relay ./cmd/codex-relay \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=devel
ARG COMMIT=
ARG SOURCE=https://github.com/codexrelay/codex-relay
LABEL org.opencontainers.image.title="codex-relay" \
      org.opencontainers.image.description="A relay between Codex and a pool of upstream accounts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.url="${SOURCE}"
COPY --from=build /out/usr/local/bin/codex-relay /usr/local/bin/codex-relay
# A volume mounted on /data starts with the image's owner and mode: writable
# by the non-root user only.
COPY --from=build --chown=65532:65532 --chmod=0700 /out/data /data
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    CODEX_RELAY_ADDR=0.0.0.0:2455 \
    CODEX_RELAY_DATABASE_URL=/data/codex-relay.db \
    CODEX_RELAY_LOG_FORMAT=json
USER 65532:65532
VOLUME ["/data"]
EXPOSE 2455/tcp
# No shell or curl in the image: the binary asks itself.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/codex-relay", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/codex-relay"]
CMD ["serve"]
