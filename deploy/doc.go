// Package deploy holds what runs codex-relay where teams run things, and the
// tests that check it without a container runtime or a cluster:
//
//   - compose.yaml, nginx.conf and secrets.sh: two replicas on PostgreSQL
//     behind nginx, for Docker Compose;
//   - helm/codex-relay: the Helm chart;
//   - image: the daemonless image builder (go run ./deploy/image), the
//     counterpart of the repository's Dockerfile.
package deploy
