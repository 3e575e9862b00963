#!/bin/sh
# Creates the secrets deploy/compose.yaml mounts, once: a PostgreSQL password,
# the database URL that uses it, the credentials key both replicas share, and
# the admin token. Existing files are kept (the key encrypts stored
# credentials: replacing it loses them).
#
# The files are readable by everyone (0644), because Docker Compose mounts
# them into the containers as they are and the relay runs as user 65532; the
# folder itself is 0700, so other users of this machine cannot reach them.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
umask 077
mkdir -p "$dir"
chmod 700 "$dir"

random() { head -c "$1" /dev/urandom | base64 | tr -d '\n/+=' | cut -c1-"$2"; }

put() {
  if [ -s "$dir/$1" ]; then
    echo "kept    $dir/$1"
  else
    printf '%s\n' "$2" > "$dir/$1"
    echo "created $dir/$1"
  fi
  chmod 644 "$dir/$1"
}

put postgres_password "$(random 48 32)"
put database_url "postgres://codex_relay:$(cat "$dir/postgres_password")@postgres:5432/codex_relay?sslmode=disable"
put secret_key "$(head -c 32 /dev/urandom | base64)"
put admin_token "cra_$(random 48 40)"
echo "admin token: $(cat "$dir/admin_token")"
