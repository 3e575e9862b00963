#!/usr/bin/env bash
# The whole test suite, from a fresh machine: brings up what the tests need
# (Node packages, Chromium, a throwaway PostgreSQL), runs vet and every Go test
# with the race detector, and tears down what it started.
#
#   ./scripts/test.sh            everything
#   ./scripts/test.sh ./relay/...  only some packages (arguments go to go test)
#   ./scripts/test.sh --quick -run TestDecide ./relay/   (or QUICK=1 ./scripts/test.sh ...)
#
# --quick is for running a few tests while working: it installs only what is
# missing or stale (as the full run does), takes a Python package index that
# was found unreachable for the current pin at its word (the verdict is kept in
# test-output/openai-python.unavailable; delete it to try again), starts the
# throwaway PostgreSQL only when the packages named (default ./...) need it and
# CODEX_RELAY_TEST_POSTGRES names none, and skips the checks (go mod tidy, vet,
# gofmt, staticcheck, templ): only go test -race runs, with the arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '== %s\n' "$*" >&2; }

quick=${QUICK:-}
[ "$quick" = 0 ] && quick=""
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi

# --- Node packages: the real Codex CLI, playwright-core and the OpenAI JS SDK, pinned in package-lock.json.
if [ ! -x node_modules/.bin/codex ] || [ ! -f node_modules/openai/package.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi

# --- The OpenAI Python SDK (PyPI's openai, pinned in relay/testdata/openai-sdk/requirements.txt) in a
# virtual environment of the suite's own, made again only when the pin changed. Where no Python
# package index answers, the SDK test is told why and skips instead of failing. That verdict is
# kept, with the pin it was for, in $pyverdict: a quick run believes it, a full run tries again.
pyreq=relay/testdata/openai-sdk/requirements.txt
pyenv=test-output/openai-python
pyverdict=test-output/openai-python.unavailable
pin=$(sha256sum <"$pyreq")
unavailable() {
  export CODEX_RELAY_OPENAI_PYTHON_UNAVAILABLE="$1"
  mkdir -p test-output
  printf '%s\n%s\n' "$pin" "$1" >"$pyverdict"
}
if ! cmp -s "$pyreq" "$pyenv/requirements.txt" 2>/dev/null || [ ! -x "$pyenv/bin/python" ]; then
  if [ -n "$quick" ] && [ -f "$pyverdict" ] && [ "$(head -n 1 "$pyverdict")" = "$pin" ]; then
    export CODEX_RELAY_OPENAI_PYTHON_UNAVAILABLE="$(sed -n 2p "$pyverdict")"
    log "no OpenAI Python SDK (as found before, see $pyverdict): the Python SDK test will skip"
  else
    log "python venv with the OpenAI SDK ($pyenv)"
    rm -rf "$pyenv"
    mkdir -p test-output
    if ! python3 -m venv "$pyenv" >/dev/null 2>&1; then
      unavailable "python3 -m venv failed on this machine (Debian: install python3-venv)"
      log "no Python venv: the Python SDK test will skip"
    elif "$pyenv/bin/pip" install --quiet --disable-pip-version-check --no-input --retries 0 --timeout 10 -r "$pyreq" >"$pyenv/pip.log" 2>&1; then
      cp "$pyreq" "$pyenv/requirements.txt"
      rm -f "$pyverdict"
    else
      tail -n 3 "$pyenv/pip.log" >&2
      if grep -qiE "from versions: none|failed to establish a new connection|name or service not known|temporary failure in name resolution|network is unreachable|connection refused" "$pyenv/pip.log"; then
        unavailable "pip could not reach a Python package index to install the pinned openai package on this machine"
        log "no Python package index: the Python SDK test will skip"
      else
        echo "pip install -r $pyreq failed (see $pyenv/pip.log)" >&2
        exit 1
      fi
    fi
  fi
fi
export CODEX_RELAY_OPENAI_PYTHON="$root/$pyenv/bin/python"

# --- Chromium for the console tests, from Debian, only when missing.
if ! command -v chromium >/dev/null 2>&1; then
  log "apt-get install chromium"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
export CODEX_RELAY_CHROMIUM=${CODEX_RELAY_CHROMIUM:-$(command -v chromium)}

# --- tmux for the Codex TUI test (the interactive client in a detached session), from Debian, only when missing.
if ! command -v tmux >/dev/null 2>&1; then
  log "apt-get install tmux"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq tmux >/dev/null
fi

# test_packages prints the packages among go test's arguments: those that
# are not flags or flags' values (default ./...).
test_packages() {
  local pkgs=() skip=""
  for a in "$@"; do
    if [ -n "$skip" ]; then skip=""; continue; fi
    case "$a" in
      -args | --args) break ;;
      -*=*) ;;
      -v | --v | -short | --short | -race | --race | -cover | --cover | -failfast | --failfast | -json | --json | \
        -benchmem | --benchmem | -a | -n | -x | -work | -trimpath | -msan | -asan | -fullpath | -modcacherw) ;;
      -*) skip=1 ;; # a flag whose value is the next argument
      *) pkgs+=("$a") ;;
    esac
  done
  [ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)
  printf '%s\n' "${pkgs[@]}"
}

# needs_postgres says whether the tests of the packages given use PostgreSQL
# (through internal/store/storetest, the one reader of CODEX_RELAY_TEST_POSTGRES).
needs_postgres() {
  local storetest
  storetest="$(go list -m)/internal/store/storetest"
  go list -deps -test -f '{{.ImportPath}}' "$@" | grep -qxF "$storetest"
}

# --- A throwaway PostgreSQL in a temp folder, as a non-root user, on a free loopback port.
pgdir=""
stop_pg() {
  if [ -n "$pgdir" ] && [ -d "$pgdir/data" ]; then
    as_pg pg_ctl -D "$pgdir/data" stop -m fast >/dev/null 2>&1 || true
    rm -rf "$pgdir"
  fi
}
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
trap stop_pg EXIT
want_pg=1
if [ -n "$quick" ] && [ -z "${CODEX_RELAY_TEST_POSTGRES:-}" ]; then
  mapfile -t pkgs < <(test_packages "$@")
  if ! needs_postgres "${pkgs[@]}"; then
    want_pg=""
    log "quick: no PostgreSQL (the tests of ${pkgs[*]} do not use it)"
  fi
fi
if [ -z "${CODEX_RELAY_TEST_POSTGRES:-}" ] && [ -n "$want_pg" ]; then
  command -v initdb >/dev/null || { echo "PostgreSQL binaries (initdb, postgres) are missing: apt-get install postgresql" >&2; exit 1; }
  pgdir=$(mktemp -d /tmp/codex-relay-pg.XXXXXX)
  chmod 755 "$pgdir"
  [ "$(id -u)" = 0 ] && chown postgres "$pgdir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)
  log "PostgreSQL on 127.0.0.1:$port ($pgdir)"
  as_pg initdb -D "$pgdir/data" -A trust -U postgres >/dev/null
  as_pg pg_ctl -D "$pgdir/data" -l "$pgdir/log" -w -t 60 \
    -o "-p $port -k $pgdir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >/dev/null
  for _ in $(seq 1 100); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.1; done
  export CODEX_RELAY_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
fi

# Missing Codex, PostgreSQL or Chromium fails the tests instead of skipping them.
export CODEX_RELAY_REQUIRE_E2E=1

if [ -n "$quick" ]; then
  log "quick: no go mod tidy, vet, gofmt, staticcheck or templ checks"
else
  log "go mod tidy is current"
  if ! tidy=$(go mod tidy -diff 2>&1); then
    echo "go.mod or go.sum is not tidy: run 'go mod tidy' and commit the result" >&2
    printf '%s\n' "$tidy" | head -n 40 >&2
    exit 1
  fi

  log "go vet"
  go vet ./...
  log "gofmt"
  unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './node_modules/*'))
  if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted" >&2; exit 1; fi

  log "staticcheck"
  go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

  log "templ generate is current"
  go tool templ generate >/dev/null 2>&1
  if git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet -- '*_templ.go'; then
    echo "generated templ code is stale: run 'go tool templ generate' and commit the *_templ.go files" >&2
    git diff --stat -- '*_templ.go' >&2
    exit 1
  fi
fi

log "go test -race"
if [ $# -eq 0 ]; then set -- ./...; fi
go test -race -count=1 -timeout 15m "$@"
